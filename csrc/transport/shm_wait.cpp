// The waits' placement hint, timeout, counters and policy in words (the waits themselves:
// transport/shm_wait.h).
#include "transport/shm_wait.h"

#include <sstream>

#include "transport/cpu_facts.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmWaits::ShmWaits(int rank, int world, const ShmConfig& cfg, ShmSegments& segs, const ShmLiveness& live)
    : rank_(rank), world_(world), cfg_(cfg), segs_(segs), live_(live) {
  timeout_s_.store(cfg_.timeout_s, std::memory_order_relaxed);
}

bool ShmWaits::placed_with(int peer, bool backing_off) {
  const int cpu = sched_getcpu();
  if (cpu < 0) return false;
  SegmentHeader* own = segs_.header(rank_);
  if (own->on_cpu.load(std::memory_order_relaxed) != cpu + 1) own->on_cpu.store(cpu + 1, std::memory_order_relaxed);
  bool colocated = false;
  if ((cfg_.oversubscribed() || backing_off) && peer >= 0 && peer != rank_ && segs_.mapped(peer))
    colocated = segs_.header(peer)->on_cpu.load(std::memory_order_relaxed) == cpu + 1;
  if (colocated) n_colocated_.fetch_add(1, std::memory_order_relaxed);
  return colocated;
}

bool ShmWaits::load_over(int64_t now) {
  if (cfg_.load_check_ns <= 0) return false;
  if (now >= next_load_check_.load(std::memory_order_relaxed)) {
    next_load_check_.store(now + cfg_.load_check_ns, std::memory_order_relaxed);
    const bool over = load_oversubscribed(read_load(CpuFactSources{}), cfg_.cpus, cfg_.load_slack, cfg_.load_avg_slack);
    load_over_.store(over, std::memory_order_relaxed);
    if (over) n_load_over_.fetch_add(1, std::memory_order_relaxed);
  }
  return load_over_.load(std::memory_order_relaxed);
}

void ShmWaits::set_timeout(double seconds) {
  RC_CHECK(seconds > 0, InvalidArgument, "timeout must be > 0 s, got " << seconds);
  timeout_s_.store(seconds, std::memory_order_relaxed);
}

ShmWaitStats ShmWaits::stats() const {
  ShmWaitStats st;
  st.slept = n_slept_.load(std::memory_order_relaxed);
  st.yields_lost = n_yields_lost_.load(std::memory_order_relaxed);
  st.colocated = n_colocated_.load(std::memory_order_relaxed);
  st.descheduled = n_descheduled_.load(std::memory_order_relaxed);
  st.unpinned_spins = n_unpinned_spins_.load(std::memory_order_relaxed);
  st.unpinned_backoffs = n_unpinned_backoffs_.load(std::memory_order_relaxed);
  st.load_over = n_load_over_.load(std::memory_order_relaxed);
  return st;
}

std::string ShmWaits::describe() const {
  std::ostringstream o;
  const WaitMode mode = cfg_.wait_mode;
  o << "wait ";
  switch (mode) {
    case WaitMode::kSpin: o << "spin"; break;
    case WaitMode::kYield: o << "yield"; break;
    case WaitMode::kAdaptive: o << "adaptive"; break;
    case WaitMode::kAuto: o << "auto"; break;
  }
  o << " (" << world_ << " ranks, " << cfg_.cpus << " CPUs, " << cfg_.ranks_sharing << " ranks on them: "
    << (cfg_.own_cpu() ? "CPUs of its own" : cfg_.oversubscribed() ? "ranks outnumber CPUs" : "ranks may meet on a CPU");
  if (!cfg_.own_cpu())
    o << "; " << cfg_.node_ranks << " node ranks on " << cfg_.cpus << " usable CPUs"
      << (cfg_.unpinned_own ? ": a CPU each in effect" : "");
  o << "): ";
  if (mode == WaitMode::kAuto && cfg_.own_cpu())
    o << "synchronous calls spin up to " << cfg_.own_spin_ns / 1000
      << " us (less if the CPU is lost), then futex; other waits ";
  if (mode == WaitMode::kAuto && cfg_.unpinned_own)
    o << "synchronous calls spin up to " << cfg_.unpinned_spin_ns / 1000
      << " us while the node's load fits its CPUs, the peer last waited elsewhere and no such spin lost "
         "its CPU in the last "
      << cfg_.unpinned_backoff_ns / 1000000 << " ms (less if the CPU is lost), then futex; other waits ";
  o << "spin " << cfg_.spin_ns() / 1000 << " us";
  if (mode == WaitMode::kAuto && cfg_.load_check_ns > 0 && !cfg_.spin_us && !cfg_.oversubscribed())
    o << " (2 us while the node's runnable threads exceed its CPUs + " << cfg_.load_slack << " or its load average that + "
      << cfg_.load_avg_slack << ", read every "
      << cfg_.load_check_ns / 1000000 << " ms)";
  if (mode != WaitMode::kSpin) {
    o << (mode == WaitMode::kAdaptive ? "; yielding " : ", ") << "+" << cfg_.yield_ns / 1000
      << " us with a sched_yield every " << cfg_.yield_every_ns << " ns";
    if (mode == WaitMode::kAdaptive) o << " for " << kYieldCreditWaits << " waits after a miss";
    o << " (none for " << cfg_.yield_backoff_ns / 1000000 << " ms after a yield lost the CPU "
      << cfg_.yield_lost_ns / 1000 << " us)";
  }
  o << ", then futex";
  return o.str();
}

}  // namespace rc
