// The shm transport's configuration: slot geometry, wait policy and liveness bounds, resolved from
// the knobs once per transport (transport/shm_config.cpp), and the deadline arithmetic every wait
// shares. Every rank of a communicator computes its segment layout from the same configuration
// (transport/shm_layout.h, normalized), so the offsets agree across processes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/knobs.h"

namespace rc {

/// How a waiter spends the time before it sleeps on the futex (RINGCOMM_WAIT, resolved).
enum class WaitMode : int {
  kSpin = 0,      // pause-spin spin_ns, then sleep: never sched_yield
  kYield = 1,     // spin spin_ns + yield_ns with a sched_yield every yield_every_ns, then sleep
  kAdaptive = 2,  // kSpin; after a miss (the spin ran out, or was preempted) kYield for a while
  kAuto = 3,      // by the facts, per wait: see ShmConfig::own_cpu(), unpinned_own and transport/shm_wait.h
};

/// CPU numbers a SegmentHeader's mask can hold (bit c of word c / 64).
constexpr int kCpuMaskWords = 16;

/// This process's affinity mask in `words` (kCpuMaskWords of them); false when it cannot be read
/// or names a CPU beyond the mask (then nothing is known).
bool affinity_mask(uint64_t* words);

struct ShmConfig {
  size_t slot_bytes = 0;     // RINGCOMM_SLOT_BYTES
  uint32_t nslots = 0;       // RINGCOMM_NSLOTS
  double timeout_s = 300;    // RINGCOMM_TIMEOUT (per communicator override)
  WaitMode wait_mode = WaitMode::kAdaptive;  // RINGCOMM_WAIT (auto decides per wait: transport/shm_wait.h)
  // CPUs this process can use at once when configured: the fewest of its affinity mask's, the
  // online ones and the cgroup CPU quota (transport/cpu_facts.h, usable_cpus).
  int cpus = 1;
  // Local ranks (this one included) that may run on this process's CPUs: the world size until
  // attach() reads every peer's affinity mask (ShmControl::attach), or the front's count.
  int ranks_sharing = 1;
  std::optional<int64_t> spin_us;  // RINGCOMM_SPIN_US where the environment sets it
  int64_t own_spin_ns = 0;   // RINGCOMM_SPIN_OWN_CPU_US
  // kAuto, ranks not pinned apart (!own_cpu()): whether they in effect have a CPU each (the
  // node's ranks, RINGCOMM_UNPINNED_SPARE_CPUS and cpus: cpu_facts.h, unpinned_own_cpus), set by
  // ShmControl::attach; then a synchronous call's waits spin unpinned_spin_ns as pinned ranks
  // spin own_spin_ns, while the load check and the back-off allow (transport/shm_wait.h).
  bool unpinned_own = false;
  int node_ranks = 1;             // the local ranks that decision counted
  int unpinned_spare = 0;         // RINGCOMM_UNPINNED_SPARE_CPUS
  int64_t unpinned_spin_ns = 0;   // RINGCOMM_SPIN_UNPINNED_US
  int64_t unpinned_backoff_ns = 0;  // RINGCOMM_UNPINNED_BACKOFF_MS
  int64_t load_check_ns = 0;      // RINGCOMM_LOAD_CHECK_MS (0: the runnable threads are never read)
  int load_slack = 0;             // RINGCOMM_LOAD_SLACK
  double load_avg_slack = 0;      // RINGCOMM_LOAD_AVG_SLACK
  int64_t descheduled_ns = 0;     // RINGCOMM_DESCHEDULED_US
  int64_t yield_ns = 0;      // RINGCOMM_YIELD_US: yielding waits spin this much longer
  int64_t yield_every_ns = 0;  // RINGCOMM_YIELD_EVERY_NS: yielding waits sched_yield this often
  int64_t yield_lost_ns = 0;   // RINGCOMM_YIELD_LOST_US: a sched_yield this long lost the CPU
  int64_t yield_backoff_ns = 0;  // RINGCOMM_YIELD_BACKOFF_MS: then no yields for this long (0: never)
  int64_t liveness_ns = 0;   // RINGCOMM_LIVENESS_MS: how often a sleeping waiter checks peers
  int64_t heartbeat_timeout_ns = 0;  // RINGCOMM_HEARTBEAT_TIMEOUT_MS: a still heartbeat means dead
  // The outbox layout (world >= 3; see transport/shm.h, Layout): each rank's two outboxes have
  // far_nslots slots of far_slot_bytes. Without it (uniform) far = full (slot_bytes, nslots).
  // far_slot_bytes is clamped to at most slot_bytes.
  bool outbox = false;
  size_t far_slot_bytes = 0;   // RINGCOMM_FAR_SLOT_BYTES
  size_t slot_walk_bytes = 0;  // RINGCOMM_SLOT_WALK_BYTES (0: no walk; transport/shm_slots.h)
  uint32_t far_nslots = 0;     // RINGCOMM_OUTBOX_SLOTS
  size_t ll_bytes = 0;         // RINGCOMM_LL_MAX_BYTES: data bytes one LL outbox carries
  bool cma = false;            // RINGCOMM_CMA_MIN_BYTES > 0: probe for single-copy reads (shm_cma.h)
  size_t local_stream_min_bytes = 0;  // RINGCOMM_LOCAL_STREAM_MIN_BYTES (0: never; ShmCma::copy_own)
  /// Uniform geometry (far = full) from the knobs `k` (their range checks throw
  /// InvalidArgument): what the CUDA control plane and the simulation use.
  static ShmConfig from_knobs(const Knobs& k, int world_size, double timeout_s);
  /// from_knobs plus the outboxes (world >= 3): the host communicator's transport.
  static ShmConfig host_from_knobs(const Knobs& k, int world_size, double timeout_s);
  /// The spin before a wait yields or sleeps: RINGCOMM_SPIN_US (spin_us), else short (2 us)
  /// when more ranks share this process's CPUs than there are (oversubscribed(): the awaited
  /// rank may need our CPU), else 50 us.
  /// `load_over`: the node's runnable threads outnumber its CPUs now (ShmWaits' load check),
  /// which shortens the spin as oversubscribed() does.
  int64_t spin_ns(bool load_over = false) const {
    return (spin_us ? *spin_us : (oversubscribed() || load_over) ? 2 : 50) * 1000;
  }
  /// Set ranks_sharing from a count of local ranks on this process's CPUs (< 1: unknown,
  /// nothing changes).
  void set_ranks_sharing(int ranks);
  /// More of those ranks than CPUs: waits spin briefly (spin_ns()) and give the CPU up at once
  /// to a peer that last waited on it (ShmWaits::placed_with).
  bool oversubscribed() const { return ranks_sharing > cpus; }
  /// No other local rank may run on this process's CPUs (pinned apart). Only then can a spin here
  /// never keep a peer rank off a CPU, and kAuto lets a synchronous call's waits
  /// (common/caller_wait.h) spin own_spin_ns. Ranks that may meet on a CPU (unpinned) yield:
  /// beside other busy processes the CPU a late peer needs may be the one a spinner holds.
  bool own_cpu() const { return ranks_sharing == 1; }
  /// Decide unpinned_own from the local ranks that may run on these CPUs (`ranks`, this one
  /// included) against cpus and unpinned_spare; false where own_cpu() already holds.
  void decide_unpinned(int ranks);
};

/// Bytes of one rank's segment for `world` ranks with configuration `cfg` (computes only): in the
/// outbox layout the same for every world >= 3 (shm.h, Layout).
size_t footprint_bytes(int world, const ShmConfig& cfg);

/// now_ns + seconds, saturated: an infinite or huge timeout gives a deadline in the far future
/// (INT64_MAX), never an overflowed one in the past; seconds <= 0 (or NaN) gives now_ns.
int64_t deadline_after(int64_t now_ns, double seconds);

}  // namespace rc
