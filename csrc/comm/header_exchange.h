// The collective header exchange shared by every communicator (host and CUDA): before a
// collective each rank posts its header on the shared-memory board and reads every peer's; the
// ranks then check, identically, that they called the same collective with consistent arguments.
// A HeaderMismatch is raised on every rank before any result is written, so the communicator
// stays in step and usable after it.
//
// Header in the first data slot (small all-reduces and broadcasts, RINGCOMM_HEADER_IN_SLOT): a
// rank whose all_reduce header says kArDirectInSlot, or the root of a broadcast whose header says
// kBcDirectInSlot, hands its first piece to every peer (the direct algorithm's piece 0, one slot
// per peer on the collective lane) BEFORE it posts its header, so
// one wake-up of a waiting peer delivers both: the peer's acquire of the board word orders the
// slot's publication (an earlier seq_cst RMW of head) before it, so the piece is there when the
// header is seen. The header itself stays on the board: that is where a peer on any other path
// (another collective, the ring, a rejection) posts, so the check stays exact against every
// kind of peer. When the check fails every rank drains exactly one slot from each peer whose
// header says it did so (header_in_slot; HeaderHooks::on_mismatch), before it raises: the slot streams stay
// in step and no result buffer has been touched.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/coll.h"
#include "common/errors.h"
#include "transport/shm.h"

namespace rc {

/// all_reduce's algorithm, carried in its header's count2 (compared across ranks).
enum : int64_t {
  kArRing = 0,
  kArDirect = 1,          // header exchange, then the direct algorithm's pieces
  kArDirectInSlot = 2,    // the direct algorithm's piece 0 handed off before the header (above)
  kArTwoShot = 3,         // header exchange, then the two-shot algorithm (direct reduce-scatter + all-gather)
  kArLL = 4,              // every rank's input in its LL outbox with its header (below)
};

/// broadcast's algorithm, carried in its header's count2 (compared across ranks).
enum : int64_t {
  kBcChain = 0,
  kBcDirectInSlot = 2,    // the root hands piece 0 to every peer before its header; peers read the root's slots
  kBcLL = 4,              // the root's message in its LL outbox with its header; every rank's header in its own
};

/// True when rank `poster`, which posted `h`, handed one slot to every peer before posting it:
/// every rank of an in-slot all_reduce, the root of an in-slot broadcast.
inline bool header_in_slot(const CollHeader& h, int poster) {
  if (h.count <= 0) return false;
  switch (static_cast<Coll>(h.coll)) {
    case Coll::kAllReduce: return h.count2 == kArDirectInSlot;
    case Coll::kBroadcast: return h.count2 == kBcDirectInSlot && h.root == poster;
    default: return false;
  }
}

/// True when the rank that posted `h` wrote it, with its data, into its LL outbox first
/// (transport/shm.h): every rank of an LL all_reduce or broadcast (algo/ll.cpp). Its header then
/// reaches the peers from the outbox's line 0 as well as the board, and a mismatch leaves
/// nothing to drain: the outbox is rewritten, never consumed.
inline bool header_ll(const CollHeader& h) {
  if (h.count <= 0) return false;
  switch (static_cast<Coll>(h.coll)) {
    case Coll::kAllReduce: return h.count2 == kArLL;
    case Coll::kBroadcast: return h.count2 == kBcLL;
    default: return false;
  }
}

/// Optional steps around the exchange: before_post runs just before this rank's header is
/// posted (the in-slot path hands its first piece off there); on_mismatch gets every rank's
/// header when the check fails, before HeaderMismatch is thrown (the in-slot drain). What
/// on_mismatch throws propagates instead of the HeaderMismatch (a data-phase failure).
struct HeaderHooks {
  std::function<void()> before_post;
  std::function<void(const std::vector<CollHeader>&)> on_mismatch;
};

class HeaderMismatch : public Mismatch {
  using Mismatch::Mismatch;
};

/// Post `mine` (with mine.coll already set) for collective `seq`, read every rank's header, and
/// validate them. Returns all headers in rank order. Throws HeaderMismatch.
std::vector<CollHeader> exchange_headers(ShmTransport& t, int rank, int world, uint64_t seq, Coll coll,
                                         const CollHeader& mine, const HeaderHooks& hooks = {});

/// "all_reduce(count=.., dtype=.., op=..)" for messages.
std::string describe_header(const CollHeader& h);

/// The ErrorCode (as stored in the abort flag) that peers' waits raise when this rank fails with
/// `code`: kMismatch and kTimeout as they are, anything else kPeerFailure.
uint32_t abort_kind_of(ErrorCode code);

/// Monotonic nanoseconds.
int64_t now_ns();

}  // namespace rc
