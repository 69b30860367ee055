// The wait policy of the shm transport (ShmTransport::wait_until): spin, optionally yield, then
// sleep on the futex in slices that check the deadline, the local interrupt and the peers.
// Private to the transport's implementation files; a template so that each caller's readiness
// test is inlined into the spin.
#pragma once
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>

#include "common/errors.h"
#include "transport/futex.h"
#include "transport/shm_layout.h"

namespace rc {
namespace shm_detail {

// Involuntary context switches of the calling thread so far: the scheduler took its CPU while it
// was runnable (preemption, or a sched_yield that ran another task).
inline long thread_nivcsw() {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return ru.ru_nivcsw;
}

// WaitMode::kAdaptive: a wait that spun at least this long reads the thread's involuntary
// switch count before and after its spin (two getrusage calls, cheap beside a wait already
// this long; shorter waits never pay for them).
constexpr int64_t kProbeAfterNs = 5000;
// WaitMode::kAdaptive: after a miss (a spin that ran out, or was preempted) this many waits
// yield (about 30 small collectives: header and data waits); each wait that ends within its
// spin unpreempted counts one down.
constexpr int kYieldCreditWaits = 64;

}  // namespace shm_detail

using namespace shm_detail;  // NOLINT: the transport's private layout, in its private headers only

template <class Ready>
inline void ShmTransport::wait_until(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters, Ready ready,
                              const WaitCtx& w) {
  if (ready()) return;
  const int64_t t0 = now_ns();
  // Placement: publish the CPU this wait runs on, and read the awaited peer's. When the peer last
  // waited on this same CPU it is (almost always: migrations are rare) queued behind us, and no
  // spin of ours can end before the scheduler runs it: give the CPU up at once (a yield, or the
  // futex sleep; the peer's store's futex_wake wakes us).
  // Only where sharing is expected (ranks outnumber CPUs, or another process's load was seen):
  // with a CPU per rank, the load balancer separates two ranks that meet on one CPU only if both
  // stay runnable there, which a spinning waiter does and one that gives the CPU up does not.
  const int64_t no_yield_until = no_yield_until_.load(std::memory_order_relaxed);
  bool colocated = false;
  if (const int cpu = sched_getcpu(); cpu >= 0) {
    auto* own = reinterpret_cast<SegmentHeader*>(base_[rank_]);
    if (own->on_cpu.load(std::memory_order_relaxed) != cpu + 1) own->on_cpu.store(cpu + 1, std::memory_order_relaxed);
    if ((world_ > cfg_.cpus || t0 < no_yield_until) && w.peer >= 0 && w.peer != rank_ && base_[w.peer] != nullptr)
      colocated = reinterpret_cast<SegmentHeader*>(base_[w.peer])->on_cpu.load(std::memory_order_relaxed) == cpu + 1;
    if (colocated) n_colocated_.fetch_add(1, std::memory_order_relaxed);
  }
  // Spin phase: poll the word with `pause`. A yielding wait (WaitMode::kYield, or kAdaptive after
  // a miss) also hands the CPU to whoever else is runnable on it every yield_every_ns,
  // and spins yield_ns longer: when the peer sits runnable on OUR CPU (ranks outnumber CPUs, or
  // another process shares the CPU) only that lets it run before our spin budget is gone.
  const WaitMode mode = cfg_.wait_mode;
  const bool adaptive = mode == WaitMode::kAdaptive;
  const bool yielding = (mode == WaitMode::kYield ||
                         (adaptive && yield_credit_.load(std::memory_order_relaxed) > 0)) &&
                        t0 >= no_yield_until;
  // Co-located with the peer: no pure spin. A yielding wait yields at once (the cheapest way to
  // hand the peer our CPU while no other process competes for it); any other sleeps at once.
  const bool active = !colocated || yielding;
  const int64_t active_end = t0 + (colocated ? 0 : cfg_.spin_ns) + (yielding ? cfg_.yield_ns : 0);
  int64_t next_yield = t0 + (colocated ? 0 : cfg_.yield_every_ns);
  long nivcsw0 = -1;  // kAdaptive: involuntary switches when the probe started (-1: not yet)
  bool done = false;
  while (active) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (ready()) {
        done = true;
        break;
      }
    }
    if (done) break;
    const int64_t now = now_ns();
    if (yielding && now >= next_yield) {
      sched_yield();
      if (ready()) {
        done = true;
        break;
      }
      const int64_t back = now_ns();
      if (back - now >= cfg_.yield_lost_ns) {
        // A lost yield (see ShmConfig::from_knobs): stop yielding, and sleep now.
        n_yields_lost_.fetch_add(1, std::memory_order_relaxed);
        if (cfg_.yield_backoff_ns > 0) no_yield_until_.store(back + cfg_.yield_backoff_ns, std::memory_order_relaxed);
        break;
      }
      next_yield = back + cfg_.yield_every_ns;
    }
    if (now >= active_end) break;
    if (closing()) fail_closing(w);
    if (adaptive && nivcsw0 < 0 && now - t0 >= kProbeAfterNs) nivcsw0 = thread_nivcsw();
  }
  if (adaptive && active) {
    // A miss: the spin ran out (the peer did not get to run within our budget: on a shared CPU it
    // may be queued behind us), or this thread was preempted while spinning (its CPU is shared
    // right now). Then the next waits yield while they spin. A wait that ended within its spin
    // unpreempted counts the credit down: back to pure spinning once the sharing stops.
    const bool preempted = nivcsw0 >= 0 && thread_nivcsw() > nivcsw0;
    if (!done || preempted) {
      yield_credit_.store(kYieldCreditWaits, std::memory_order_relaxed);
    } else if (yield_credit_.load(std::memory_order_relaxed) > 0) {
      yield_credit_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (done) return;
  n_slept_.fetch_add(1, std::memory_order_relaxed);
  // Sleep phase: futex in slices, checking peers and the deadline between slices.
  const int64_t deadline = deadline_after(t0, timeout_s());
  int64_t next_liveness = t0;
  for (;;) {
    uint32_t seen = word->load(std::memory_order_acquire);
    if (ready()) return;
    waiters->fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) {
      int64_t slice = std::min<int64_t>(cfg_.liveness_ns, deadline - now_ns());
      futex_wait(word, seen, std::max<int64_t>(slice, 1000));
    }
    waiters->fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    if (closing()) fail_closing(w);
    const int64_t now = now_ns();
    const bool live_check = now >= next_liveness;
    if (live_check) next_liveness = now + cfg_.liveness_ns;
    if (w.peer >= 0 && w.peer != rank_) {
      auto* h = reinterpret_cast<SegmentHeader*>(base_[w.peer]);
      if (h->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAlive)) {
        if (ready()) return;  // it finished its part before closing
        fail_peer_state(w.peer, w);
      }
    }
    check_peers(w, live_check);
    if (now >= deadline) {
      if (ready()) return;
      RC_THROW(TimeoutError, "ringcomm: " << describe(w) << ": Timed out after " << timeout_s()
                                          << " s (RINGCOMM_TIMEOUT / timeout=)");
    }
  }
}

}  // namespace rc
