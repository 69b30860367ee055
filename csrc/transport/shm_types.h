// The vocabulary the shm transport's parts and their users share: lanes, what a wait is for, a
// peer's state, and the records that sit in shared memory where users read them in place (a
// slot's meta, an LL line, the opaque collective header). Their sizes are part of the segment
// layout (transport/shm_layout.h): every rank maps every other rank's segment.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rc {

enum class Lane : int { kColl = 0, kP2P = 1 };
constexpr int kNumLanes = 2;

/// What a wait is for: every error raised by a wait names these.
struct WaitCtx {
  const char* op = "";     // collective / operation name
  uint64_t seq = 0;        // collective sequence number
  int peer = -1;           // the rank waited on
  int step = -1;           // algorithm step (or -1)
  int nsteps = 0;          // number of steps (for messages)
  const char* what = "";   // what is awaited: "data", "free slot", "header", ...
};

enum class PeerState : uint32_t { kAlive = 0, kClosed = 1, kAborted = 2 };

/// Bytes of the header a rank posts before each collective (the board entry, the start of LL line
/// 0). The transport carries them opaquely; the communicator defines the record
/// (comm/coll_header.h) and asserts that it has exactly this size.
constexpr size_t kHeaderBytes = 40;

/// The collective header as the transport stores and returns it: kHeaderBytes bytes, 8-aligned
/// (the alignment of the record it carries), copied whole.
struct HeaderBlob {
  alignas(8) unsigned char bytes[kHeaderBytes];
};
static_assert(sizeof(HeaderBlob) == kHeaderBytes && alignof(HeaderBlob) == 8,
              "HeaderBlob's size and alignment are part of the segment layout (board entry, LL line 0)");

/// One line of an LL outbox (transport/shm_board.h): payload first, the flag last. The owner
/// writes the payload, then stores the flag (release); a reader that loads the flag equal to the
/// collective's 64-bit sequence (acquire) may read the payload. Only the owner writes, and only
/// while no reader may still read the line's previous contents. Line 0's payload starts with the
/// owner's header (kHeaderBytes). The lines' contents are the LL protocol's (proto/ll.h).
struct alignas(64) LLLine {
  static constexpr size_t kPayload = 56;
  char payload[kPayload];
  std::atomic<uint64_t> flag;
};
static_assert(sizeof(LLLine) == 64, "an LL line is one cache line");

struct SlotMeta {
  uint64_t bytes;   // bytes of payload in this slot
  uint64_t total;   // total bytes of the message this slot starts (p2p), or 0
  uint64_t tag;     // message tag / sequence
  uint64_t offset;  // payload starts this many bytes into the slot (transport/shm_slots.h)
  uint64_t pad[4];
};
static_assert(sizeof(SlotMeta) == 64, "SlotMeta is one cache line");

/// The board's 32-bit sequence word for collective `seq` (seq >= 1): in [1, 2^32 - 2], never 0
/// (0 means "no header yet"). The period 2^32 - 2 is even, so the word has the parity of seq and
/// consecutive collectives alternate between the board's two entries (`word & 1`) across the wrap.
inline uint32_t board_seq_of(uint64_t seq) { return static_cast<uint32_t>((seq - 1) % 0xFFFFFFFEull) + 1; }

}  // namespace rc
