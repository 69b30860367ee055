// The shm transport's segments: every rank owns ONE POSIX shared-memory segment and maps every
// peer's. This part creates this rank's segment, maps the peers' with the agreement checks,
// unlinks the name and unmaps; every other part finds its words through base() / header().
//
// Lifetime: a segment is created with a random name (O_EXCL, mode 0600), allocated whole (no
// SIGBUS on a small /dev/shm mid-collective), mapped by every peer, and unlinked by its owner as
// soon as every peer has reported attaching (the header's `attached` counter), so even kill -9
// afterwards leaves nothing in /dev/shm. A peer maps only a segment its own user created with mode
// 0600 and the size, version, world, rank and geometry it expects.
//
// Who writes the segment header: create() writes the identity and geometry fields once, then
// stores `magic` with release; a peer that acquires `magic` reads them (map_peers). `attached` is
// bumped once by each peer after it mapped the segment (seq_cst RMW, with a futex wake). The other
// header words belong to the parts named in transport/shm_layout.h.
//
// Threading: create(), map_peers(), unlink_own() and unmap() run on the thread that sets up or
// closes the transport, while no other thread uses it; base() and header() are read by every
// thread in between (the mappings do not change then).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "transport/shm_config.h"

namespace rc {

namespace shm_detail {
struct SegmentHeader;  // transport/shm_layout.h
}  // namespace shm_detail

class ShmSegments {
 public:
  /// `cfg` (normalized) is the transport's: it outlives this part.
  ShmSegments(int rank, int world, const ShmConfig& cfg);

  /// Create, allocate and map this rank's segment and write its header (identity `pidns`,
  /// geometry, heartbeat bounds). Returns its name for the rendezvous.
  std::string create(const std::string& pidns);
  /// Map every peer's segment (names in rank order), check that it agrees with ours, call
  /// on_mapped(p, its header), then report the attachment to its owner.
  void map_peers(const std::vector<std::string>& names,
                 const std::function<void(int, const shm_detail::SegmentHeader*)>& on_mapped);
  /// Unlink this rank's name if it is still linked (idempotent).
  void unlink_own();
  /// Forget every mapping; unmap it unless keep_mappings (see ShmControl::close).
  void unmap(bool keep_mappings);
  /// In a forked child: unmap without writing to any segment, and never unlink a name.
  void forget_after_fork();

  bool mapped(int owner) const { return !base_.empty() && base_[owner] != nullptr; }
  char* base(int owner) const { return base_[owner]; }
  shm_detail::SegmentHeader* header(int owner) const {
    return reinterpret_cast<shm_detail::SegmentHeader*>(base_[owner]);
  }
  /// Bytes of one segment (the same on every rank).
  /// The geometry and footprint in one line (ShmControl::describe_geometry).
  std::string describe_geometry() const;

 private:
  int rank_;
  int world_;
  const ShmConfig& cfg_;
  size_t bytes_ = 0;
  std::string own_name_;
  bool own_unlinked_ = true;
  std::vector<char*> base_;  // mapped segments, by owner rank
};

}  // namespace rc
