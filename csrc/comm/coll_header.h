// The collective header: what every rank posts before each collective and compares across ranks
// (comm/header_exchange.h). The transport carries it as kHeaderBytes opaque bytes (HeaderBlob,
// transport/shm_types.h: the board entry and the start of LL line 0); this record is its meaning.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "transport/shm_types.h"

namespace rc {

/// Header posted before each collective (compared across ranks). 40 bytes: its first bytes are
/// also the payload of line 0 of an LL outbox (LLLine).
struct CollHeader {
  uint32_t coll = 0;
  uint32_t dtype = 0;
  uint32_t op = 0;
  int32_t root = -1;
  int64_t count = 0;   // element count (meaning depends on the collective)
  int64_t count2 = 0;  // a second count: all_gather's contribution of the posting rank, all_to_all's output total
  // How the collective runs, chosen by the communicator's selection (comm/selection.h) and
  // compared across ranks like the fields above: the algorithm, the protocol and the store
  // policy, as their codes.
  uint8_t algo = 0;
  uint8_t proto = 0;
  uint8_t store = 0;
  // Per-rank facts a protocol needs beside the selection, not compared across ranks:
  // kHeaderCmaBlocks (all_to_all under the cma protocol: this rank's blocks qualify, select.h).
  uint8_t flags = 0;
  // The collective's sequence on the posting rank (its low 32 bits): every rank numbers every
  // collective, so a difference means the ranks' calls no longer pair up (a call one rank ran
  // without an exchange, comm/device.h's fused, that a peer exchanged for).
  uint32_t seq = 0;
};
static_assert(sizeof(CollHeader) == kHeaderBytes && alignof(CollHeader) <= alignof(HeaderBlob),
              "CollHeader is what the transport's header blob carries (the segment layout: board, LL line 0)");
static_assert(std::is_trivially_copyable_v<CollHeader>, "CollHeader travels as bytes");

/// CollHeader::flags bits.
constexpr uint8_t kHeaderCmaBlocks = 1;

/// The header as the transport carries it, and back.
inline HeaderBlob header_blob(const CollHeader& h) {
  HeaderBlob b;
  std::memcpy(b.bytes, &h, kHeaderBytes);
  return b;
}
inline CollHeader coll_header(const HeaderBlob& b) {
  CollHeader h;
  std::memcpy(&h, b.bytes, kHeaderBytes);
  return h;
}

}  // namespace rc
