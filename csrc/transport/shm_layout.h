// The shm transport's shared-memory layout, private to its implementation files
// (transport/shm_*.cpp and the LL protocol, proto/ll.cpp): the segment header, the header board,
// the channel control words, and where each region sits in a segment. Every rank computes the
// same layout from the same configuration (ShmConfig, normalized), so offsets agree across
// processes. See transport/shm.h for the protocols that use these words.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "transport/futex.h"
#include "transport/heartbeat.h"
#include "transport/shm.h"

namespace rc {
namespace shm_detail {

constexpr uint64_t kMagic = 0x52494e47434f4d4dULL;  // "RINGCOMM"
constexpr uint32_t kVersion = 6;
constexpr size_t kPage = 4096;
constexpr size_t kAbortMsgBytes = 1024;

inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A futex word and its sleeper count on a cache line of their own.
struct alignas(64) Word {
  std::atomic<uint32_t> v;
  std::atomic<uint32_t> waiters;
};

// Publish a new value of a word and wake sleepers. The seq_cst RMW pairs with the waiter's
// seq_cst increment of `waiters` (see the header comment): no lost wake-ups.
inline void publish_add(std::atomic<uint32_t>* v, std::atomic<uint32_t>* waiters, uint32_t add) {
  v->fetch_add(add, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) futex_wake_all(v);
}

struct BoardEntry {
  Word seq;        // the collective sequence number this entry holds (0 = none yet)
  CollHeader h;    // written before seq is published (release), read after it is acquired
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t world;
  int32_t rank;
  int32_t pid;
  uint64_t slot_bytes;
  uint32_t nslots;
  uint32_t far_nslots;
  uint64_t far_slot_bytes;
  uint64_t ll_bytes;
  char pidns[kPidNsBytes];     // the owner's PID-namespace identity (pid_namespace_id(); "" unknown)
  int64_t hb_timeout_ns;       // the owner's RINGCOMM_HEARTBEAT_TIMEOUT_MS
  int64_t hb_period_ns;        // how often the owner's heartbeat thread bumps `heartbeat`
  // Written only by the owner's heartbeat thread (relaxed increments), read by peers in other PID
  // namespaces; on a line of its own so the bumps never share a line with hot words.
  alignas(64) std::atomic<uint64_t> heartbeat;
  alignas(64) Word attached;   // peers that have mapped this segment
  alignas(64) Word state;      // PeerState; kind/msg written before state (release)
  uint32_t abort_kind;
  char abort_msg[kAbortMsgBytes];
  // 1 + the CPU the owner's last wait began on (0: none yet). Stored by the owner's waiting
  // threads only when it changed (relaxed), read by peers' waits as a placement hint: a peer
  // that waits for us on our own CPU cannot see us move while it spins (see wait_until).
  alignas(64) std::atomic<int32_t> on_cpu;
  alignas(64) Word doorbell;   // p2p activity counter (see ring_doorbell)
  alignas(64) BoardEntry board[2];
};

struct ChannelCtl {
  Word head;  // written by the sender only
  Word tail;  // written by the receiver only
  // followed by SlotMeta[nslots]
};
static_assert(sizeof(ChannelCtl) == 128, "ChannelCtl is two cache lines");

// The geometry every rank applies to every segment: the far one clamped to the full one, and
// uniform (far = full) up to 2 ranks, where the only peer is the ring neighbour on both sides.
inline ShmConfig normalized(int world, ShmConfig c) {
  if (world <= 2 || c.far_slot_bytes == 0 || c.far_nslots == 0) {
    c.far_slot_bytes = c.slot_bytes;
    c.far_nslots = c.nslots;
  }
  c.far_slot_bytes = std::min(c.far_slot_bytes, c.slot_bytes);
  c.far_nslots = std::min(c.far_nslots, c.nslots);  // both powers of two: so is the minimum
  return c;
}

// The two LL outboxes follow the segment header's pages; each holds the header and ll_bytes of data.
inline size_t ll_offset() { return round_up(sizeof(SegmentHeader), kPage); }
inline size_t ll_lines(const ShmConfig& c) {
  return (sizeof(CollHeader) + c.ll_bytes + LLLine::kPayload - 1) / LLLine::kPayload;
}
inline size_t ctl_offset(const ShmConfig& c) { return ll_offset() + round_up(2 * ll_lines(c) * sizeof(LLLine), kPage); }
inline size_t ctl_stride(const ShmConfig& c) { return sizeof(ChannelCtl) + sizeof(SlotMeta) * c.nslots; }
inline size_t data_offset(int world, const ShmConfig& c) {
  return round_up(ctl_offset(c) + ctl_stride(c) * kNumLanes * static_cast<size_t>(world), kPage);
}
// Uniform geometry (far = full: up to 2 ranks, the CUDA control plane, the simulation) keeps the
// plain layout: every source index, the owner's own included, has nslots full slots. Otherwise
// channel (lane, src) of `owner`'s segment has the full geometry iff it is the collective channel
// from owner's ring predecessor, and the owner's own index has no slots (nobody sends to itself).
inline bool uniform(const ShmConfig& c) { return c.far_slot_bytes == c.slot_bytes && c.far_nslots == c.nslots; }
inline bool full_channel(int world, int owner, Lane lane, int src) {
  return lane == Lane::kColl && src == (owner + world - 1) % world;
}
inline uint32_t chan_nslots(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  if (uniform(c)) return c.nslots;
  if (src == owner) return 0;
  return full_channel(world, owner, lane, src) ? c.nslots : c.far_nslots;
}
inline size_t chan_slot_stride(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  return (uniform(c) || full_channel(world, owner, lane, src) ? c.slot_bytes : c.far_slot_bytes) + kPage;
}
inline size_t chan_bytes(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  return chan_nslots(world, owner, lane, src, c) * chan_slot_stride(world, owner, lane, src, c);
}


}  // namespace shm_detail
}  // namespace rc
