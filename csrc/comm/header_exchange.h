// The collective header exchange shared by every communicator (host and CUDA): before a
// collective each rank posts its header on the shared-memory board and reads every peer's; the
// ranks then check, identically, that they called the same collective with consistent arguments.
// A HeaderMismatch is raised on every rank before any result is written, so the communicator
// stays in step and usable after it.
//
// Data before the header (comm/selection.h: the header_in_slot and ll protocols): a rank whose
// header says header_in_slot hands its first piece to every peer (the direct algorithm's piece 0,
// one slot per peer on the collective lane; for a broadcast only the root; for a reduce_scatter
// one slot, to its ring predecessor) BEFORE it posts its
// header, so one wake-up of a waiting peer delivers both: the peer's acquire of the board word
// orders the slot's publication (an earlier seq_cst RMW of head) before it, so the piece is there
// when the header is seen. A rank whose header says ll wrote header and data into its LL outbox
// first (proto/ll.h). The header itself stays on the board: that is where a peer on any other
// path (another collective, the ring, a rejection) posts, so the check stays exact against every
// kind of peer. When the check fails every rank drains exactly one slot from each peer whose
// header says it handed one off to it (slot_before_header_for; HeaderHooks::on_mismatch), before it
// raises: the slot streams stay in step and no result buffer has been touched. LL lines need no
// draining: the outbox is rewritten, never consumed.
//
// The check: every rank's header must agree on the collective, dtype, op, root, the count (all
// but all_to_all, whose per-rank counts differ) and the selection (algorithm, protocol, store),
// so ranks configured differently raise MismatchError; all_gather's and all_to_all's counts must
// add up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/coll.h"
#include "comm/coll_header.h"
#include "common/errors.h"
#include "common/function_ref.h"
#include "transport/shm_control.h"

namespace rc {

/// Optional steps around the exchange: before_post runs just before this rank's header is
/// posted (the in-slot path hands its first piece off there); on_mismatch gets every rank's
/// header when the check fails, before HeaderMismatch is thrown (the in-slot drain). What
/// on_mismatch throws propagates instead of the HeaderMismatch (a data-phase failure).
struct HeaderHooks {
  FunctionRef<void()> before_post;
  FunctionRef<void(const std::vector<CollHeader>&)> on_mismatch;
};

class HeaderMismatch : public Mismatch {
  using Mismatch::Mismatch;
};

/// Where the exchange sits among the calls: `board_seq` numbers the exchanges (0: = seq, every
/// collective exchanges); `watch_fused`: peers may run a collective without an exchange
/// (comm/device.h's fused), so each header wait also watches the peer's fused word
/// (transport/shm_board.h).
struct ExchangeSeq {
  uint64_t board_seq = 0;
  bool watch_fused = false;
};

/// A mismatch that leaves the ranks out of step (they routed a call differently: a peer ran it
/// on the device without an exchange, or the headers' collective sequences differ): unlike
/// HeaderMismatch, it breaks the communicator (every peer's wait then raises MismatchError).
class RoutingMismatch : public Mismatch {
  using Mismatch::Mismatch;
};

/// Post `mine` (with mine.coll and mine.seq already set) for collective `seq`, read every rank's
/// header into `all` (resized to `world`, in rank order; a caller that keeps the vector between
/// calls allocates nothing), and validate them. Throws HeaderMismatch, or RoutingMismatch when the
/// ranks routed the call differently.
void exchange_headers(ShmControl& t, int rank, int world, uint64_t seq, Coll coll, const CollHeader& mine,
                      std::vector<CollHeader>& all, const HeaderHooks& hooks = {}, ExchangeSeq xs = {});

/// "all_reduce(count=.., dtype=.., op=..)" for messages.
std::string describe_header(const CollHeader& h);

/// The ErrorCode (as stored in the abort flag) that peers' waits raise when this rank fails with
/// `code`: kMismatch and kTimeout as they are, anything else kPeerFailure.
uint32_t abort_kind_of(ErrorCode code);

}  // namespace rc
