// The shm transport's shared-memory layout, private to its implementation files
// (transport/shm_*.cpp): the segment header, the header board, the channel and outbox control
// words, and where each region sits in a segment. Every rank computes the same layout from the
// same configuration (ShmConfig, normalized), so offsets agree across processes. Which part
// writes which word, and with what ordering, is stated in that part's header
// (transport/shm_segments.h, shm_liveness.h, shm_wait.h, shm_doorbell.h, shm_board.h,
// shm_slots.h, shm_outbox.h).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/futex.h"
#include "transport/heartbeat.h"
#include "transport/shm_config.h"
#include "transport/shm_types.h"

namespace rc {
namespace shm_detail {

constexpr uint64_t kMagic = 0x52494e47434f4d4dULL;  // "RINGCOMM"
constexpr uint32_t kVersion = 10;
constexpr size_t kPage = 4096;
constexpr size_t kAbortMsgBytes = 1024;

inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A futex word and its sleeper count on a cache line of their own.
struct alignas(64) Word {
  std::atomic<uint32_t> v;
  std::atomic<uint32_t> waiters;
};

// Publish a new value of a word and wake sleepers. The seq_cst RMW pairs with the waiter's
// seq_cst increment of `waiters` (transport/shm_wait.h): no lost wake-ups.
inline void publish_add(std::atomic<uint32_t>* v, std::atomic<uint32_t>* waiters, uint32_t add) {
  v->fetch_add(add, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) futex_wake_all(v);
}

struct BoardEntry {
  Word seq;        // the collective sequence number this entry holds (0 = none yet)
  HeaderBlob h;    // written before seq is published (release), read after it is acquired
};
static_assert(sizeof(BoardEntry) == 128, "a board entry is its word's line and the header's line");

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
  // The CPUs the owner may run on when it created the segment (affinity_mask; written before
  // `magic` is published, never after): peers count the ranks sharing their CPUs from these
  // (ShmControl::attach). cpu_mask_known 0: the owner could not tell.
  uint32_t cpu_mask_known;
  uint64_t cpu_mask[kCpuMaskWords];
  // Written only by the owner's heartbeat thread (relaxed increments), read by peers in other PID
  // namespaces; on a line of its own so the bumps never share a line with hot words.
  alignas(64) std::atomic<uint64_t> heartbeat;
  alignas(64) Word attached;   // peers that have mapped this segment
  alignas(64) Word state;      // PeerState; kind/msg written before state (release)
  uint32_t abort_kind;
  char abort_msg[kAbortMsgBytes];
  // 1 + the CPU the owner's last wait began on (0: none yet). Stored by the owner's waiting
  // threads only when it changed (relaxed), read by peers' waits as a placement hint: a peer
  // that waits for us on our own CPU cannot see us move while it spins (transport/shm_wait.h).
  alignas(64) std::atomic<int32_t> on_cpu;
  alignas(64) Word doorbell;   // p2p activity counter (transport/shm_doorbell.h)
  alignas(64) BoardEntry board[2];
  // The sequence of the last collective the owner ran without a header exchange (a fused device
  // call: transport/shm_board.h, mark_fused); written only by the owner, 0: none.
  alignas(64) std::atomic<uint64_t> fused_seq;
  // Single-copy reads (transport/shm_cma.h). Written by the owner before `magic`: a word holding
  // cma_probe_value(owner pid, this address) and the owner's own address of it, which peers read
  // with process_vm_readv at attach to learn whether they may read the owner's memory.
  uint64_t cma_probe;
  uint64_t cma_probe_addr;
  // The owner's verdict (1: it could read every peer's probe word): written before it reports
  // attaching to any peer, read by every peer after all of them did (ShmControl::attach).
  Word cma_ok;
  // The address, in the owner's memory, of the buffer peers read in the current collective:
  // written by the owner before it posts that collective's header (the board word's release
  // orders it), never while a peer may still read the previous one (shm_cma.h).
  alignas(64) std::atomic<uint64_t> cma_buf;
  // The low 32 bits of the sequence of the last collective whose single-copy reads the owner
  // finished (owner only, publish_add's seq_cst; peers wait on it before returning).
  Word cma_done;
};
inline uint64_t cma_probe_value(int32_t pid, uint64_t addr) {
  return kMagic ^ (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 17) ^ addr;
}

struct ChannelCtl {
  Word head;  // written by the sender only
  Word tail;  // written by the receiver only
  // followed by SlotMeta[nslots]
};
static_assert(sizeof(ChannelCtl) == 128, "ChannelCtl is two cache lines");

// One slot of an outbox (transport/shm_outbox.h). The meta and `key` are written by the owner only,
// while no reader may read the slot; `key` last, with release. `key` packs the message's outbox
// sequence number g (0: none yet) and its reader, so that one atomic load tells a scanning reader
// both: out_key(g, dest). `done` is incremented by the readers only (one each, after their last
// read of the slot), and reset by the owner before it publishes the next key.
struct OutSlot {
  SlotMeta meta;                            // bytes, total, tag, payload offset
  alignas(64) std::atomic<uint64_t> key;    // out_key(g, dest)
  alignas(64) std::atomic<uint32_t> done;   // readers that released it
};
static_assert(sizeof(OutSlot) == 192, "OutSlot is three cache lines");
// dest of a message every rank reads except the owner and its ring successor (which receives
// its copy through the push channel).
constexpr int32_t kAllDest = -1;
constexpr int kMaxOutboxWorld = 0xFFFE;  // dest + 1 fits the key's low 16 bits
inline uint64_t out_key(uint64_t g, int32_t dest) { return (g << 16) | static_cast<uint64_t>(dest + 1); }
inline uint64_t out_key_seq(uint64_t key) { return key >> 16; }
inline int32_t out_key_dest(uint64_t key) { return static_cast<int32_t>(key & 0xFFFF) - 1; }

struct OutboxCtl {
  alignas(64) std::atomic<uint64_t> posted;  // sequence number of the last published message (owner)
  Word pub;    // bumped by the owner after each publication: its readers sleep on it
  Word freed;  // bumped by a reader after each release: the owner sleeps on it for a free slot
  // followed by OutSlot[outbox slots]
};
static_assert(sizeof(OutboxCtl) == 192, "OutboxCtl is three cache lines");

// The geometry every rank applies to every segment: the far slot clamped to the full one; the
// outbox layout from 3 ranks on where the configuration asks for it (the host communicator's),
// else uniform (far = full): up to 2 ranks, where the only peer is the ring neighbour on both
// sides, and for the CUDA control plane and the simulation.
inline ShmConfig normalized(int world, ShmConfig c) {
  c.outbox = c.outbox && world >= 3 && c.far_slot_bytes > 0 && c.far_nslots > 0;
  if (!c.outbox) {
    c.far_slot_bytes = c.slot_bytes;
    c.far_nslots = c.nslots;
  }
  c.far_slot_bytes = std::min(c.far_slot_bytes, c.slot_bytes);
  return c;
}

// The two LL outboxes follow the segment header's pages; each holds the header and ll_bytes of data.
inline size_t ll_offset() { return round_up(sizeof(SegmentHeader), kPage); }
inline size_t ll_lines(const ShmConfig& c) {
  return (kHeaderBytes + c.ll_bytes + LLLine::kPayload - 1) / LLLine::kPayload;
}
inline size_t ctl_offset(const ShmConfig& c) { return ll_offset() + round_up(2 * ll_lines(c) * sizeof(LLLine), kPage); }
inline size_t ctl_stride(const ShmConfig& c) { return sizeof(ChannelCtl) + sizeof(SlotMeta) * c.nslots; }
inline bool uniform(const ShmConfig& c) { return !c.outbox; }
// Uniform layout: channel control words for every lane and source index (the owner's own
// included), then every channel's nslots full slots, in (lane, source) order.
// Outbox layout: the control words of the ONE push channel (collective lane, from the ring
// predecessor), then the two outboxes' control (one per lane), then the push channel's nslots
// full slots, then each outbox's far_nslots slots of far_slot_bytes. Nothing depends on the world.
inline size_t outbox_ctl_bytes(const ShmConfig& c) { return sizeof(OutboxCtl) + sizeof(OutSlot) * c.far_nslots; }
inline size_t data_offset(int world, const ShmConfig& c) {
  if (uniform(c)) return round_up(ctl_offset(c) + ctl_stride(c) * kNumLanes * static_cast<size_t>(world), kPage);
  return round_up(ctl_offset(c) + ctl_stride(c) + kNumLanes * outbox_ctl_bytes(c), kPage);
}
inline size_t outbox_ctl_offset(const ShmConfig& c, Lane lane) {
  return ctl_offset(c) + ctl_stride(c) + static_cast<size_t>(lane) * outbox_ctl_bytes(c);
}
inline size_t outbox_stride(const ShmConfig& c) { return c.far_slot_bytes + kPage; }
inline size_t outbox_data_offset(int world, const ShmConfig& c, Lane lane) {
  return data_offset(world, c) + c.nslots * (c.slot_bytes + kPage) +
         static_cast<size_t>(lane) * c.far_nslots * outbox_stride(c);
}
// Whether rank `src` sends to `owner` on `lane` through a push channel in owner's segment (all
// pairs in the uniform layout; the ring predecessor's collective lane in the outbox layout).
inline bool push_channel(const ShmConfig& c, int world, int owner, Lane lane, int src) {
  return uniform(c) || (lane == Lane::kColl && src == (owner + world - 1) % world);
}

}  // namespace shm_detail
}  // namespace rc
