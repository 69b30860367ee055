// ShmConfig from the communicator's rc::Knobs (slot geometry, wait policy, liveness, LL outbox
// size) and the footprint of a segment; deadline arithmetic shared by every wait.
#include "transport/shm_config.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "transport/cpu_facts.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

namespace {

// The CPUs this process may run on (its affinity mask), in increasing order; empty when the
// kernel does not say. The set grows until it holds the kernel's mask (EINVAL: larger).
std::vector<int> affinity_list() {
  std::vector<int> cpus;
  for (int n = 1024; n <= (1 << 20); n *= 4) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) break;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const int err = errno;
    if (rc == 0)
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (rc == 0 || err != EINVAL) break;
  }
  return cpus;
}

// CPUs this process can use at once, at least 1: the fewest of its affinity mask's, the online
// ones and the cgroup CPU quota (transport/cpu_facts.h).
int usable_cpu_count() {
  const int n = usable_cpus(read_cpu_facts(CpuFactSources{}, static_cast<int>(affinity_list().size())));
  return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

int64_t deadline_after(int64_t now_ns, double seconds) {
  constexpr int64_t kFar = std::numeric_limits<int64_t>::max();
  if (!(seconds > 0)) return now_ns;
  const double ns = seconds * 1e9;
  // Compare in double before converting: a double >= 2^63 does not fit an int64 (UB).
  if (!(ns < static_cast<double>(kFar - now_ns))) return kFar;
  return now_ns + static_cast<int64_t>(ns);
}

bool affinity_mask(uint64_t* words) {
  const std::vector<int> cpus = affinity_list();
  if (cpus.empty() || cpus.back() >= 64 * kCpuMaskWords) return false;  // beyond the header's words
  for (int w = 0; w < kCpuMaskWords; ++w) words[w] = 0;
  for (const int c : cpus) words[c / 64] |= uint64_t{1} << (c % 64);
  return true;
}

void ShmConfig::set_ranks_sharing(int ranks) {
  if (ranks < 1) return;
  ranks_sharing = ranks;
}

void ShmConfig::decide_unpinned(int ranks) {
  node_ranks = std::max(1, ranks);
  unpinned_own = !own_cpu() && unpinned_spin_ns > 0 && unpinned_own_cpus(node_ranks, cpus, unpinned_spare);
}

ShmConfig ShmConfig::from_knobs(const Knobs& k, int world_size, double timeout_s) {
  ShmConfig c;
  // Slot size and count: bytes in flight per channel = slot_bytes * nslots. Slots small enough to
  // stay in L2/L3 between the sender's write and the receiver's read; enough of them to pipeline.
  const int64_t slot = k.slot_bytes;
  const int64_t nslots = k.nslots;
  RC_CHECK(slot >= 64, InvalidArgument, "RINGCOMM_SLOT_BYTES must be >= 64, got " << slot);
  // A power of two divides 2^32, so the slot index `counter % nslots` stays in step across the
  // wrap of the 32-bit head/tail counters.
  RC_CHECK(nslots >= 2 && nslots <= 1024 && (nslots & (nslots - 1)) == 0, InvalidArgument,
           "RINGCOMM_NSLOTS must be in [2, 1024] and a power of two (the ring's fused forward needs two; "
           "the slot index wraps with the 32-bit counters), got " << nslots);
  c.slot_bytes = round_up(static_cast<size_t>(slot), 64);
  c.nslots = static_cast<uint32_t>(nslots);
  c.timeout_s = timeout_s > 0 ? timeout_s : k.timeout;
  RC_CHECK(c.timeout_s > 0, InvalidArgument, "timeout must be > 0 s, got " << c.timeout_s);
  // Wait policy. world_size is the number of ranks on this node (the transport spans one node);
  // against it, the CPUs this process may run on. With more ranks than CPUs the rank a waiter
  // waits for is often runnable on the waiter's own CPU: only yielding (or sleeping) lets it run,
  // and a spinning waiter steals its core, so the spin is short and yields. With a CPU per rank,
  // kAdaptive yields only after a miss (a spin that ran out or was preempted), saving the
  // sched_yield calls (docs/algorithms.md, "Waits"). auto decides per wait from two facts
  // (transport/shm_wait.h): whether this rank's CPUs are its own (own_cpu(): from the world size
  // here, from the ranks' affinity masks once attach() has read them), and whether the waiting
  // thread's caller is blocked on the call.
  c.cpus = usable_cpu_count();
  c.wait_mode = k.wait == "spin"       ? WaitMode::kSpin
                : k.wait == "adaptive" ? WaitMode::kAdaptive
                : k.wait == "yield"    ? WaitMode::kYield
                                       : WaitMode::kAuto;
  if (k.is_set(KnobId::spin_us)) c.spin_us = k.spin_us;
  RC_CHECK(!c.spin_us || *c.spin_us >= 0, InvalidArgument, "RINGCOMM_SPIN_US must be >= 0, got " << *c.spin_us);
  c.set_ranks_sharing(std::max(1, world_size));
  c.own_spin_ns = k.spin_own_cpu_us * 1000;
  RC_CHECK(c.own_spin_ns >= 0, InvalidArgument, "RINGCOMM_SPIN_OWN_CPU_US must be >= 0, got " << c.own_spin_ns / 1000);
  // Ranks not pinned apart (transport/shm_wait.h): whether they in effect have a CPU each is
  // decided once the masks are read (ShmControl::attach, decide_unpinned); the load check and the
  // back-off after a lost spin decide per wait.
  c.unpinned_spin_ns = k.spin_unpinned_us * 1000;
  RC_CHECK(c.unpinned_spin_ns >= 0, InvalidArgument, "RINGCOMM_SPIN_UNPINNED_US must be >= 0, got " << k.spin_unpinned_us);
  c.unpinned_spare = static_cast<int>(k.unpinned_spare_cpus);
  RC_CHECK(k.unpinned_spare_cpus >= 0, InvalidArgument, "RINGCOMM_UNPINNED_SPARE_CPUS must be >= 0, got " << k.unpinned_spare_cpus);
  c.unpinned_backoff_ns = k.unpinned_backoff_ms * 1000000;
  RC_CHECK(c.unpinned_backoff_ns >= 0, InvalidArgument, "RINGCOMM_UNPINNED_BACKOFF_MS must be >= 0, got " << k.unpinned_backoff_ms);
  c.load_check_ns = k.load_check_ms * 1000000;
  RC_CHECK(c.load_check_ns >= 0, InvalidArgument, "RINGCOMM_LOAD_CHECK_MS must be >= 0, got " << k.load_check_ms);
  c.load_slack = static_cast<int>(k.load_slack);
  RC_CHECK(k.load_slack >= 0, InvalidArgument, "RINGCOMM_LOAD_SLACK must be >= 0, got " << k.load_slack);
  c.load_avg_slack = k.load_avg_slack;
  RC_CHECK(c.load_avg_slack >= 0, InvalidArgument, "RINGCOMM_LOAD_AVG_SLACK must be >= 0, got " << k.load_avg_slack);
  c.descheduled_ns = k.descheduled_us * 1000;
  RC_CHECK(c.descheduled_ns > 0, InvalidArgument, "RINGCOMM_DESCHEDULED_US must be > 0, got " << k.descheduled_us);
  c.decide_unpinned(c.ranks_sharing);
  // Yielding waits spin yield_ns longer: sched_yield hands a runnable peer on our CPU the core
  // for a fraction of the cost of a futex sleep and wake-up.
  c.yield_ns = k.yield_us * 1000;
  RC_CHECK(c.yield_ns >= 0, InvalidArgument, "RINGCOMM_YIELD_US must be >= 0, got " << c.yield_ns / 1000);
  c.yield_every_ns = std::max<int64_t>(100, k.yield_every_ns);
  // A lost yield: under the kernel's EEVDF scheduler every sched_yield that finds another task
  // runnable moves the yielder's virtual deadline a whole slice later, so a waiter that yields
  // every few microseconds beside a CPU-bound process of another job hands it slice after slice
  // (calls of milliseconds instead of microseconds). A fellow rank given our CPU runs only
  // until it waits itself (microseconds); a yield that kept the CPU away for a slice-sized time
  // with our word still unset means such a process. Then waits stop yielding for the back-off:
  // they spin and sleep on the futex (a sleep resets the deadline; the waker's futex_wake
  // preempts the other process's task).
  c.yield_lost_ns = k.yield_lost_us * 1000;
  RC_CHECK(c.yield_lost_ns > 0, InvalidArgument, "RINGCOMM_YIELD_LOST_US must be > 0, got " << c.yield_lost_ns / 1000);
  c.yield_backoff_ns = k.yield_backoff_ms * 1000000;
  RC_CHECK(c.yield_backoff_ns >= 0, InvalidArgument,
           "RINGCOMM_YIELD_BACKOFF_MS must be >= 0, got " << c.yield_backoff_ns / 1000000);
  c.liveness_ns = k.liveness_ms * 1000000;
  RC_CHECK(c.liveness_ns > 0, InvalidArgument, "RINGCOMM_LIVENESS_MS must be > 0");
  c.heartbeat_timeout_ns = k.heartbeat_timeout_ms * 1000000;
  RC_CHECK(c.heartbeat_timeout_ns > 0, InvalidArgument, "RINGCOMM_HEARTBEAT_TIMEOUT_MS must be > 0");
  return c;
}

ShmConfig ShmConfig::host_from_knobs(const Knobs& k, int world_size, double timeout_s) {
  ShmConfig c = from_knobs(k, world_size, timeout_s);
  const int64_t far = k.far_slot_bytes;
  RC_CHECK(far >= 64, InvalidArgument, "RINGCOMM_FAR_SLOT_BYTES must be >= 64, got " << far);
  c.far_slot_bytes = round_up(static_cast<size_t>(far), 64);
  const int64_t out = k.outbox_slots;
  RC_CHECK(out >= 2 && out <= 1024 && (out & (out - 1)) == 0, InvalidArgument,
           "RINGCOMM_OUTBOX_SLOTS must be in [2, 1024] and a power of two, got " << out);
  c.far_nslots = static_cast<uint32_t>(out);
  c.outbox = true;
  RC_CHECK(k.slot_walk_bytes >= 0, InvalidArgument, "RINGCOMM_SLOT_WALK_BYTES must be >= 0, got " << k.slot_walk_bytes);
  c.slot_walk_bytes = std::min(static_cast<size_t>(k.slot_walk_bytes), c.slot_bytes);
  const int64_t ll = k.ll_max_bytes;
  RC_CHECK(ll >= 0 && ll <= (int64_t{1} << 20), InvalidArgument,
           "RINGCOMM_LL_MAX_BYTES must be in [0, 1M], got " << ll);
  c.ll_bytes = static_cast<size_t>(ll);
  RC_CHECK(k.cma_min_bytes >= 0, InvalidArgument, "RINGCOMM_CMA_MIN_BYTES must be >= 0, got " << k.cma_min_bytes);
  c.cma = k.cma_min_bytes > 0;
  RC_CHECK(k.local_stream_min_bytes >= 0, InvalidArgument,
           "RINGCOMM_LOCAL_STREAM_MIN_BYTES must be >= 0, got " << k.local_stream_min_bytes);
  c.local_stream_min_bytes = static_cast<size_t>(k.local_stream_min_bytes);
  return c;
}

size_t footprint_bytes(int world, const ShmConfig& cfg) {
  RC_CHECK(world >= 1, InvalidArgument, "world size must be >= 1, got " << world);
  const ShmConfig c = normalized(world, cfg);
  const size_t full = static_cast<size_t>(c.nslots) * (c.slot_bytes + kPage);
  if (uniform(c)) return data_offset(world, c) + full * kNumLanes * static_cast<size_t>(world);
  // One push channel and two outboxes: nothing here depends on the world size.
  return data_offset(world, c) + full + kNumLanes * static_cast<size_t>(c.far_nslots) * outbox_stride(c);
}

}  // namespace rc
