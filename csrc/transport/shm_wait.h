// The waits of the shm transport: every wait for a word in shared memory (a slot, a header, a
// free outbox slot, an attachment) spins, optionally yields, then sleeps on the futex in slices
// that check the deadline, the local interrupt and the peers (transport/shm_liveness.h).
//
// Sleeping without a lost wake-up: a waiter loads the word, increments its `waiters` word
// (seq_cst), re-checks readiness, then futex-sleeps on the value it loaded; a publisher changes the
// word with a seq_cst RMW, then wakes only if `waiters` != 0 (shm_detail::publish_add). Both sides
// use seq_cst operations, so either the waiter sees the new value or the publisher sees the
// waiter. Readiness itself is read with acquire by each caller's predicate, which orders the data
// the word publishes before the caller's reads.
//
// Placement: a wait publishes the CPU it runs on in this rank's segment header (`on_cpu`, relaxed,
// only when it changed) and, where CPUs are shared, reads the awaited peer's: a hint, ordering
// nothing. The policy state below (yield credit, yield back-off, counters) is shared by every
// waiting thread of the transport, with relaxed atomics: hints and statistics, never ordering.
//
// WaitMode::kAuto decides per wait from two facts: whether this rank's CPUs are its own, no other
// local rank may run on them (ShmConfig::own_cpu(), from the ranks' affinity masks), and whether
// this thread's caller is blocked on the call (common/caller_wait.h). Both true: no peer rank can
// be queued behind this wait and nothing else of this rank wants the CPU,
// so the wait spins with `pause` for own_spin_ns (a futex sleep and wake costs tens of
// microseconds on a vCPU that went idle, docs/algorithms.md "Waits"), and sleeps once that bound
// is spent: a rank whose peer computes for long burns at most own_spin_ns per wait. A spin that
// lost its CPU (two clock reads descheduled_ns apart: another task ran on it) sleeps at once, so
// that task keeps the CPU and the futex wake, not the scheduler's turn, brings the waiter back.
// Ranks not pinned apart take the same spin (bounded by unpinned_spin_ns) where they in effect
// have a CPU each (ShmConfig::unpinned_own: the node's ranks fit the usable CPUs, from the mask,
// the online CPUs and the cgroup quota), unless one of three facts read at run time says the
// CPU may be another's: the node's runnable threads outnumber its CPUs (read every
// load_check_ns: transport/cpu_facts.h), the awaited peer last waited on this CPU (it may be
// queued behind us), or such a spin lost its CPU within the last unpinned_backoff_ns.
// The load check also shortens every other kAuto wait's spin (2 us) and makes it give the CPU
// up at once to a peer that last waited on it: CPUs oversubscribed, it yields early.
// Otherwise (ranks may meet on a CPU, or the wait runs on a thread beside a caller that may
// compute) the wait is kYield's.
//
// A template, so that each caller's readiness test is inlined into the spin.
#pragma once
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/caller_wait.h"
#include "common/clock.h"
#include "common/errors.h"
#include "transport/futex.h"
#include "transport/shm_config.h"
#include "transport/shm_liveness.h"
#include "transport/shm_segments.h"
#include "transport/shm_types.h"

namespace rc {

/// Counters of the waits' slow paths since creation (any thread; relaxed reads).
struct ShmWaitStats {
  uint64_t slept = 0;        ///< waits that went to the futex sleep
  uint64_t yields_lost = 0;  ///< sched_yields that lost the CPU (each starts the back-off)
  uint64_t colocated = 0;    ///< waits that found their peer on their own CPU (no pure spin)
  uint64_t descheduled = 0;  ///< kAuto spins on a CPU of their own that lost it (then slept)
  uint64_t unpinned_spins = 0;  ///< kAuto waits of ranks not pinned apart that took the long spin
  uint64_t load_over = 0;    ///< load checks that found more runnable threads than CPUs
  uint64_t unpinned_backoffs = 0;  ///< kAuto waits that skipped that spin: one lost its CPU lately
};

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

class ShmWaits {
 public:
  /// `cfg`, `segs` and `live` are the transport's: they outlive this part. cfg's spin_ns may
  /// change before attach() (ShmControl::set_ranks_sharing); waits read it when they start.
  ShmWaits(int rank, int world, const ShmConfig& cfg, ShmSegments& segs, const ShmLiveness& live);

  /// Return once ready() holds; `word` is what its publisher bumps (futex word), `waiters` the
  /// sleeper count beside it. Bounded by timeout_s(); raises the local interrupt's error, the
  /// awaited peer's close or abort, any peer's abort or death, or TimeoutError, naming `w`.
  template <class Ready>
  void until(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters, Ready ready, const WaitCtx& w);

  /// Seconds any single wait may take; set_timeout changes it for waits that start afterwards.
  double timeout_s() const { return timeout_s_.load(std::memory_order_relaxed); }
  void set_timeout(double seconds);
  ShmWaitStats stats() const;
  /// The resolved wait policy in words (ShmControl::describe_wait).
  std::string describe() const;

 private:
  // Publish the CPU this wait runs on, and tell whether the awaited peer's last wait began on the
  // same CPU, where sharing is expected (ranks outnumber CPUs, or `backing_off`).
  bool placed_with(int peer, bool backing_off);
  // kAuto with a CPU of its own and a blocked caller: spin until ready() (true) or until
  // `bound` ns are spent or the CPU was lost (false: the caller sleeps). `unpinned`: the ranks
  // are not pinned apart, and a lost CPU starts the back-off.
  template <class Ready>
  bool spin_own_cpu(Ready& ready, const WaitCtx& w, int64_t t0, int64_t bound, bool unpinned);
  // kAuto: whether the node's runnable threads outnumbered its CPUs at the last load check,
  // reading them again when load_check_ns has passed since (false when never read).
  bool load_over(int64_t now);
  // The peer checks every wait makes between spins or sleeps: true when ready() holds after all
  // (the awaited peer finished its part before it closed); raises when the awaited peer closed
  // or aborted, or any peer failed (its liveness probed when `live_check`).
  template <class Ready>
  bool check_peers(Ready& ready, const WaitCtx& w, bool live_check) const;

  int rank_;
  int world_;
  const ShmConfig& cfg_;
  ShmSegments& segs_;
  const ShmLiveness& live_;
  std::atomic<double> timeout_s_;
  // WaitMode::kAdaptive: how many more waits yield while spinning. Set by a waiter whose spin
  // ran out or was preempted, counted down by waits that ended within their spin unpreempted.
  std::atomic<int> yield_credit_{0};
  // Yielding waits: until this now_ns() time no wait calls sched_yield (it spins, then sleeps).
  // Set by a waiter whose sched_yield lost the CPU for yield_lost_ns or more without its word
  // becoming ready: another process's task, not a rank, ran a whole slice on our CPU.
  std::atomic<int64_t> no_yield_until_{0};
  // kAuto, ranks not pinned apart: until this now_ns() time no wait takes the long spin (set by a
  // spin that lost its CPU). The load check's last verdict and when it is next read.
  std::atomic<int64_t> no_unpinned_spin_until_{0};
  std::atomic<bool> load_over_{false};
  std::atomic<int64_t> next_load_check_{0};
  std::atomic<uint64_t> n_slept_{0}, n_yields_lost_{0}, n_colocated_{0}, n_descheduled_{0};
  std::atomic<uint64_t> n_unpinned_spins_{0}, n_load_over_{0}, n_unpinned_backoffs_{0};
};

template <class Ready>
inline bool ShmWaits::check_peers(Ready& ready, const WaitCtx& w, bool live_check) const {
  if (w.peer >= 0 && w.peer != rank_ && live_.peer_left(w.peer)) {
    if (ready()) return true;  // it finished its part before closing
    live_.fail_peer_state(w.peer, w);
  }
  live_.check_peers(w, live_check);
  return false;
}

template <class Ready>
inline bool ShmWaits::spin_own_cpu(Ready& ready, const WaitCtx& w, int64_t t0, int64_t bound, bool unpinned) {
  // Bounded by the knob and by the wait's deadline (the sleep loop raises the TimeoutError); the
  // peers are checked as often as a sleeping waiter checks them, so a long bound never delays
  // noticing a dead or aborted peer.
  const int64_t end = std::min(t0 + bound, deadline_after(t0, timeout_s()));
  int64_t last = t0;
  int64_t next_liveness = t0 + cfg_.liveness_ns;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (ready()) return true;
    }
    const int64_t now = now_ns();
    if (now - last >= cfg_.descheduled_ns) {
      n_descheduled_.fetch_add(1, std::memory_order_relaxed);
      if (unpinned) no_unpinned_spin_until_.store(now + cfg_.unpinned_backoff_ns, std::memory_order_relaxed);
      return false;
    }
    if (now >= end) return false;
    last = now;
    if (live_.closing()) live_.fail_closing(w);
    if (now >= next_liveness) {
      next_liveness = now + cfg_.liveness_ns;
      if (check_peers(ready, w, true)) return true;
    }
  }
}

template <class Ready>
inline void ShmWaits::until(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters, Ready ready,
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
  const WaitMode mode = cfg_.wait_mode;
  const bool auto_sync = mode == WaitMode::kAuto && caller_blocked();
  const bool over = mode == WaitMode::kAuto && load_over(t0);
  const bool backed_off = t0 < no_unpinned_spin_until_.load(std::memory_order_relaxed);
  const bool unpinned = auto_sync && cfg_.unpinned_own && !over && !backed_off;
  if (auto_sync && cfg_.unpinned_own && !over && backed_off) n_unpinned_backoffs_.fetch_add(1, std::memory_order_relaxed);
  const bool colocated = placed_with(w.peer, t0 < no_yield_until || over || unpinned);
  // Spin phase: poll the word with `pause`. A yielding wait (WaitMode::kYield, or kAdaptive after
  // a miss) also hands the CPU to whoever else is runnable on it every yield_every_ns,
  // and spins yield_ns longer: when the peer sits runnable on OUR CPU (ranks outnumber CPUs, or
  // another process shares the CPU) only that lets it run before our spin budget is gone.
  const bool pinned_spin = auto_sync && cfg_.own_cpu() && cfg_.own_spin_ns > 0;
  const bool own_spin = !colocated && (pinned_spin || unpinned);
  const bool adaptive = mode == WaitMode::kAdaptive;
  const bool yielding = !own_spin && (mode == WaitMode::kYield || mode == WaitMode::kAuto ||
                         (adaptive && yield_credit_.load(std::memory_order_relaxed) > 0)) &&
                        t0 >= no_yield_until;
  // Co-located with the peer: no pure spin. A yielding wait yields at once (the cheapest way to
  // hand the peer our CPU while no other process competes for it); any other sleeps at once.
  const bool active = !own_spin && (!colocated || yielding);
  const int64_t active_end = t0 + (colocated ? 0 : cfg_.spin_ns(over)) + (yielding ? cfg_.yield_ns : 0);
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
    if (live_.closing()) live_.fail_closing(w);
    if (adaptive && nivcsw0 < 0 && now - t0 >= shm_detail::kProbeAfterNs) nivcsw0 = shm_detail::thread_nivcsw();
  }
  if (adaptive && active) {
    // A miss: the spin ran out (the peer did not get to run within our budget: on a shared CPU it
    // may be queued behind us), or this thread was preempted while spinning (its CPU is shared
    // right now). Then the next waits yield while they spin. A wait that ended within its spin
    // unpreempted counts the credit down: back to pure spinning once the sharing stops.
    const bool preempted = nivcsw0 >= 0 && shm_detail::thread_nivcsw() > nivcsw0;
    if (!done || preempted) {
      yield_credit_.store(shm_detail::kYieldCreditWaits, std::memory_order_relaxed);
    } else if (yield_credit_.load(std::memory_order_relaxed) > 0) {
      yield_credit_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (own_spin) {
    if (!pinned_spin) n_unpinned_spins_.fetch_add(1, std::memory_order_relaxed);
    done = spin_own_cpu(ready, w, t0, pinned_spin ? cfg_.own_spin_ns : cfg_.unpinned_spin_ns, !pinned_spin);
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
    if (live_.closing()) live_.fail_closing(w);
    const int64_t now = now_ns();
    const bool live_check = now >= next_liveness;
    if (live_check) next_liveness = now + cfg_.liveness_ns;
    if (check_peers(ready, w, live_check)) return;
    if (now >= deadline) {
      if (ready()) return;
      RC_THROW(TimeoutError, "ringcomm: " << live_.describe(w) << ": Timed out after " << timeout_s()
                                          << " s (RINGCOMM_TIMEOUT / timeout=)");
    }
  }
}

}  // namespace rc
