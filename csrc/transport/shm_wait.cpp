// The wait policy in words and its counters (the waits themselves: transport/shm_wait.h).
#include "transport/shm.h"

#include <sstream>

#include "transport/shm_layout.h"
#include "transport/shm_wait.h"

namespace rc {

using namespace shm_detail;

ShmTransport::WaitStats ShmTransport::wait_stats() const {
  WaitStats st;
  st.slept = n_slept_.load(std::memory_order_relaxed);
  st.yields_lost = n_yields_lost_.load(std::memory_order_relaxed);
  st.colocated = n_colocated_.load(std::memory_order_relaxed);
  return st;
}

std::string ShmTransport::describe_wait() const {
  std::ostringstream o;
  o << "wait ";
  switch (cfg_.wait_mode) {
    case WaitMode::kSpin: o << "spin"; break;
    case WaitMode::kYield: o << "yield"; break;
    case WaitMode::kAdaptive: o << "adaptive"; break;
  }
  o << " (" << world_ << " ranks, " << cfg_.cpus << " CPUs): spin " << cfg_.spin_ns / 1000 << " us";
  if (cfg_.wait_mode != WaitMode::kSpin) {
    o << (cfg_.wait_mode == WaitMode::kAdaptive ? "; yielding " : ", ") << "+" << cfg_.yield_ns / 1000
      << " us with a sched_yield every " << cfg_.yield_every_ns << " ns";
    if (cfg_.wait_mode == WaitMode::kAdaptive) o << " for " << kYieldCreditWaits << " waits after a miss";
    o << " (none for " << cfg_.yield_backoff_ns / 1000000 << " ms after a yield lost the CPU "
      << cfg_.yield_lost_ns / 1000 << " us)";
  }
  o << ", then futex";
  return o.str();
}

}  // namespace rc
