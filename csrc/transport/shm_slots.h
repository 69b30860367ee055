// The push channels: flow-controlled slots in the RECEIVER's segment that the sender writes
// ("push"). The uniform layout has one per lane and source index in every segment; the outbox
// layout only the collective lane from the ring predecessor (transport/shm.h, Layout; every other
// pair goes through the sender's outbox, transport/shm_outbox.h).
//
// Channel protocol (one writer per word):
//   head  - written only by the sender: number of slots it has filled (wrapping uint32).
//   tail  - written only by the receiver: number of slots it has consumed.
//   Slot i = head % nslots (nslots a power of two, so the index survives the counters' wrap) is
//   free for the sender while head - tail < nslots. The sender writes the slot's data and meta,
//   then publishes with a seq_cst (releasing) increment of head; the receiver reads head with
//   acquire, so the data and meta are visible before it touches them. The receiver releases a slot
//   with a seq_cst increment of tail after it has finished reading it; the sender's acquire of tail
//   orders its next write to that slot after the receiver's reads. Each increment wakes a sleeper
//   of its word (transport/shm_wait.h); on the point-to-point lane it also rings the peer's
//   doorbell (transport/shm_doorbell.h).
// The sender keeps its head, and the receiver its tail, in private memory too (each word has
// exactly one writer). A payload starts `offset` bytes into its slot, recorded in the slot's
// meta by the sender: the placement's offset (< 4096: each slot has a page of slack for it) plus
// the walk. Walk: a piece that fits RINGCOMM_SLOT_WALK_BYTES at least twice, at a step of its
// size rounded up to pages, starts at the next step each time its slot comes round (the slot's
// lap, head / nslots, modulo the places), so that the sender seldom writes the lines the receiver
// read last, which it would first have to take back from the receiver's cache. offset + bytes
// stays within the slot's stride (slot bytes + a page); the receiver checks it.
//
// Threading: the sending side of a (lane, peer) is used by one thread at a time (that lane's), and
// so is the receiving side; a sender holds at most one unpublished slot per peer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/shm_path.h"
#include "transport/shm_types.h"

namespace rc {

namespace shm_detail {
struct ChannelCtl;  // transport/shm_layout.h
}  // namespace shm_detail

/// The walk (above): the offset, past the placement's, of a piece of `bytes` on lap `lap` of its
/// slot, with RINGCOMM_SLOT_WALK_BYTES `span` (0: no walk; bytes 0: unknown, no walk). Every
/// place is a multiple of 4096 and ends within span: offset + bytes <= span + 4095.
inline uint32_t slot_walk(uint32_t lap, size_t bytes, size_t span) {
  if (bytes == 0 || span == 0) return 0;
  const size_t step = (bytes + 4095) / 4096 * 4096;
  const size_t places = span / step;
  return places < 2 ? 0 : static_cast<uint32_t>(lap % places * step);
}

class ShmSlots : private ShmPath {
 public:
  /// `cfg` (normalized), `segs`, `waits` and `bell` are the transport's: they outlive this part.
  ShmSlots(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits, ShmDoorbell& bell);

  /// The next free slot to `peer` with the payload `offset` bytes in, plus the walk for a piece
  /// of `bytes` (0: unknown, no walk): waiting (bounded) or not (nullptr when none is free).
  char* send(int peer, Lane lane, const WaitCtx& w, uint32_t offset, size_t bytes = 0);
  char* try_send(int peer, Lane lane, uint32_t offset, size_t bytes = 0);
  /// Where send / try_send put the payload of the slot not yet posted to `peer`.
  char* pending(int peer, Lane lane) const;
  /// Publish that slot.
  void post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag);
  /// The next filled slot from `peer`: waiting (bounded) or not (nullptr when none).
  const char* recv(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta);
  const char* try_recv(int peer, Lane lane, const SlotMeta** meta);
  /// Release the slot returned by recv / try_recv.
  void done(int peer, Lane lane);

 private:
  // Where one channel's slots sit in its owner's segment.
  struct ChanGeom {
    size_t data_off = 0;   // first slot, from the segment's base
    size_t stride = 0;     // slot bytes + one page of slack for the payload offset
    uint32_t nslots = 0;   // a power of two (0: no push channel for this pair)
  };
  ChanGeom geom_of(int owner, Lane lane, int src) const;
  shm_detail::ChannelCtl* ctl(int owner, Lane lane, int src) const;
  SlotMeta* slot_meta(int owner, Lane lane, int src, uint32_t slot) const;
  const char* recv_at(int peer, Lane lane, uint32_t tail, const SlotMeta** meta) const;

  bool single_ = false;  // the outbox layout: one push channel per segment
  size_t ctl_offset_ = 0, ctl_stride_ = 0, data_offset_ = 0;
  // The channels this rank uses, [lane * world + peer]: sending into peer's segment, receiving in
  // its own. Fixed at construction.
  std::vector<ChanGeom> send_geom_, recv_geom_;
  // Sender-local head and receiver-local tail copies, and the payload offset chosen by send,
  // recorded by post: [lane * world + peer].
  std::vector<uint32_t> send_head_;
  std::vector<uint32_t> recv_tail_;
  std::vector<uint32_t> send_off_;
};

}  // namespace rc
