// The collective header exchange shared by every communicator (host and CUDA): before a
// collective each rank posts its header on the shared-memory board and reads every peer's; the
// ranks then check, identically, that they called the same collective with consistent arguments.
// A HeaderMismatch is raised on every rank before any data moves, so the communicator stays in
// step and usable after it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "transport/shm.h"

namespace rc {

enum class Coll : uint32_t;

class HeaderMismatch : public Mismatch {
  using Mismatch::Mismatch;
};

/// Post `mine` (with mine.coll already set) for collective `seq`, read every rank's header, and
/// validate them. Returns all headers in rank order. Throws HeaderMismatch.
std::vector<CollHeader> exchange_headers(ShmTransport& t, int rank, int world, uint64_t seq, Coll coll,
                                         const CollHeader& mine);

/// "all_reduce(count=.., dtype=.., op=..)" for messages.
std::string describe_header(const CollHeader& h);

/// The ErrorCode (as stored in the abort flag) that peers' waits raise when this rank fails with
/// `code`: kMismatch and kTimeout as they are, anything else kPeerFailure.
uint32_t abort_kind_of(ErrorCode code);

/// The board's 32-bit sequence word for collective `seq` (seq >= 1): in [1, 2^32 - 2], never 0
/// (0 means "no header yet"). The period 2^32 - 2 is even, so the word has the parity of seq and
/// consecutive collectives alternate between the board's two entries (`word & 1`) across the wrap.
inline uint32_t board_seq_of(uint64_t seq) { return static_cast<uint32_t>((seq - 1) % 0xFFFFFFFEull) + 1; }

/// Monotonic nanoseconds.
int64_t now_ns();

}  // namespace rc
