// ShmControl (transport/shm_control.h): the control plane's parts composed. Setup and teardown
// order the parts' steps.
#include "transport/shm_control.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "common/errors.h"
#include "transport/heartbeat.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmControl::ShmControl(int rank, int world, ShmConfig cfg)
    : rank_(rank), world_(world), cfg_(normalized(world, cfg)), segs_(rank, world, cfg_),
      live_(rank, world, cfg_, segs_), waits_(rank, world, cfg_, segs_, live_), bell_(rank, segs_),
      board_(rank, cfg_, segs_, waits_), cma_(rank, world, cfg_, segs_, live_, waits_) {
  RC_CHECK(world >= 1, InvalidArgument, "world size must be >= 1, got " << world);
  RC_CHECK(rank >= 0 && rank < world, InvalidArgument, "rank " << rank << " out of range [0, " << world << ")");
  RC_CHECK(!has_outbox() || world_ <= kMaxOutboxWorld, InvalidArgument,
           "ringcomm: the shared-memory outboxes address at most " << kMaxOutboxWorld << " ranks, got " << world_);
}

ShmControl::~ShmControl() { close(); }

std::string ShmControl::create() {
  std::string name = segs_.create(pid_namespace_id());
  live_.on_created();
  cma_.on_created();
  return name;
}

void ShmControl::attach(const std::vector<std::string>& names) {
  segs_.map_peers(names, [this](int p, const SegmentHeader* h) {
    live_.on_mapped(p, h);
    cma_.probe(p);
  });
  cma_.post_verdict();
  live_.stop_heartbeat_if_unused();
  // The masks cover this communicator's ranks only: a subgroup's members can be pinned apart while
  // ranks of other groups share their CPUs. So the count is at least what the front knows from
  // pinning, and where the node's ranks outnumber its online CPUs, every one of them counts.
  if (const int masks = ranks_on_own_cpus(); masks > 0) {
    int ranks = std::max(masks, front_sharing_);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0 && node_ranks_ > online) ranks = std::max(ranks, node_ranks_);
    cfg_.set_ranks_sharing(ranks);
  }
  // Ranks not pinned apart: the node's ranks that may run on these CPUs (this group's that meet
  // them, and every group's the front counted) against the usable CPUs.
  cfg_.decide_unpinned(std::max(cfg_.ranks_sharing, node_ranks_));
  // Every peer maps our segment before we unlink it; after that the name is gone and the memory
  // lives exactly as long as the mappings.
  SegmentHeader* own = segs_.header(rank_);
  WaitCtx w;
  w.op = "init";
  w.what = "every peer to map this rank's shared memory";
  // The counter has every peer as a writer, so the wait names no peer (w.peer = -1): a peer that
  // mapped us, finished its own init and closed its communicator is done with this wait, while
  // an aborted or dead one still fails it (check_peers).
  const uint32_t want = static_cast<uint32_t>(world_ - 1);
  try {
    waits_.until(&own->attached.v, &own->attached.waiters,
                 [&] { return own->attached.v.load(std::memory_order_acquire) >= want; }, w);
  } catch (...) {
    unlink_dead_peers(names);
    throw;
  }
  segs_.unlink_own();
  // Every peer posted its verdict right after mapping every segment, before its own wait above.
  cma_.agree();
}

// Every mapped peer's header carries its affinity mask: the local ranks (this one included) whose
// CPUs meet this rank's, or 0 where any mask is unknown.
int ShmControl::ranks_on_own_cpus() const {
  const SegmentHeader* own = segs_.header(rank_);
  if (own->cpu_mask_known == 0) return 0;
  int ranks = 1;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const SegmentHeader* h = segs_.header(p);
    if (h->cpu_mask_known == 0) return 0;
    bool meet = false;
    for (int w = 0; w < kCpuMaskWords && !meet; ++w) meet = (own->cpu_mask[w] & h->cpu_mask[w]) != 0;
    ranks += meet ? 1 : 0;
  }
  return ranks;
}

// A peer that died during init, before unlinking its segment, never will. Its `attached`
// counter counts the ranks that mapped it: once that is every other rank, nobody needs the name
// any more and a rank that finds the owner dead unlinks it (the last mapper does; a second
// unlink of the same name fails with ENOENT, harmlessly). Before that, a rank still reading the
// name from the store would take a missing segment for a stale key, so the name stays.
void ShmControl::unlink_dead_peers(const std::vector<std::string>& names) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || !segs_.mapped(p) || !live_.peer_dead(p)) continue;
    if (segs_.header(p)->attached.v.load(std::memory_order_acquire) >= static_cast<uint32_t>(world_ - 1))
      shm_unlink(names[p].c_str());
  }
}

void ShmControl::set_ranks_sharing(int ranks_sharing, int node_ranks) {
  front_sharing_ = std::max(0, ranks_sharing);
  node_ranks_ = std::max(0, node_ranks);
  cfg_.set_ranks_sharing(ranks_sharing);
}

void ShmControl::close(bool keep_mappings) {
  segs_.unlink_own();
  live_.close();
  segs_.unmap(keep_mappings);
}

void ShmControl::drop_mappings_after_fork() {
  live_.forget_after_fork();
  segs_.forget_after_fork();
}

void ShmControl::abort(uint32_t kind, const std::string& msg) { live_.abort(kind, msg); }

}  // namespace rc
