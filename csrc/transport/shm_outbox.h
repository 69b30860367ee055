// The outboxes of the outbox layout (transport/shm.h, Layout): every message a rank sends that has
// no push channel is written into its OWN segment, and its reader copies it out from there
// ("pull"). Each rank has two outboxes, one per lane, of far_nslots slots of far_slot_bytes.
//
// One writer per outbox: the owner's thread of that lane. The owner numbers the messages of an
// outbox 1, 2, ... (its sequence g) and puts message g in slot g % far_nslots. The slot's `key`
// packs g and the message's reader (`dest`), or kAllDest: every rank except the owner and its
// ring successor (the successor receives its copy through the push channel: send_slot_all); the
// owner keeps each slot's reader count (1, or world - 2) in private memory.
// Publishing g: the owner writes payload and meta, resets `done`, stores key = (g, dest)
// (release), then posted = g (release), then bumps the outbox's `pub` word (seq_cst RMW, a futex
// wake if a reader sleeps on it) and, on the point-to-point lane, rings each reader's doorbell.
// Reading: a reader keeps, per owner and lane, the sequence of the last message it consumed
// (`last`). It loads posted = P (acquire): every message up to P is then visible. Its next
// message is the lowest g in (last, P] whose slot's key holds g and names it (one atomic load
// gives both, so a slot reused meanwhile is never mistaken for it); only g > P - far_nslots can
// be its, since the owner cannot publish g + far_nslots while the reader has not released g. It
// releases the slot by incrementing `done` (seq_cst RMW: its reads happen-before the owner's
// reuse) and bumps the outbox's `freed` word (and, point-to-point, the owner's doorbell). The
// owner writes g only when slot g % far_nslots is unused or its `done` equals the reader count of
// the message it held (acquire). Messages from one owner to one reader are therefore consumed in
// the order they were sent (FIFO per pair, as a push channel), and a message for every reader
// (the one-shot's and the direct broadcast's pieces, two-shot's all-gather phase) is written once.
// Waits sleep on the awaited outbox's `pub` (a reader) or on its own outbox's `freed` (the owner):
// every event that can make them ready bumps that word. Nothing is mapped or allocated after
// init: every pair's messages use the two ranks' outboxes and the one push channel.
//
// Progress: the owner's slots are shared by all its readers, so a message unread by one reader
// delays messages to every other. The algorithms therefore send to many peers only in rounds in
// which each message is read by its receiver at the position it was sent (algo/direct.cpp), and
// the point-to-point engine drains every message (above the eager size, only its announcement)
// into private memory when no receive for it is posted (comm/p2p_engine.h), so an outbox never
// stays full behind an absent receive.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/shm_path.h"
#include "transport/shm_types.h"

namespace rc {

namespace shm_detail {
struct OutSlot;    // transport/shm_layout.h
struct OutboxCtl;
}  // namespace shm_detail

class ShmOutbox : private ShmPath {
 public:
  /// `cfg` (normalized, outbox layout or not), `segs`, `waits` and `bell` are the transport's:
  /// they outlive this part.
  ShmOutbox(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits, ShmDoorbell& bell);

  /// The next slot of this rank's outbox on `lane` for `dest` (or shm_detail::kAllDest: every peer
  /// but the owner's ring successor, transport/shm_layout.h) with the payload
  /// `offset` bytes in, waiting (w) or not (nullptr: returns nullptr when the slot is not free).
  /// At most one reserved slot per lane.
  char* reserve(Lane lane, int dest, uint32_t offset, const WaitCtx* w);
  /// The payload of the reserved slot on `lane`.
  const char* reserved(Lane lane) const;
  /// Publish the reserved slot.
  void post(Lane lane, uint64_t bytes, uint64_t total, uint64_t tag);
  /// The next message for this rank in `peer`'s outbox, or nullptr. A message found and not yet
  /// released is returned again.
  const char* find(int peer, Lane lane, const SlotMeta** meta);
  /// Wait (bounded) for find() to return a message.
  const char* wait(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta);
  /// Release the message find() returned.
  void release(int peer, Lane lane);

 private:
  shm_detail::OutSlot* slot(int owner, Lane lane, uint64_t g) const;
  char* data(int owner, Lane lane, uint64_t g) const;
  shm_detail::OutboxCtl* box(int owner, Lane lane) const;

  // Sender side, per lane, touched by that lane's thread only: the next sequence number, the
  // reserved slot's reader (kNoReserve: none) and payload offset, and per slot the reader and
  // reader count of the message it holds.
  static constexpr int kNoReserve = -2;
  struct OutSend {
    uint64_t next = 1;
    int reserved = kNoReserve;
    uint32_t offset = 0;
    std::vector<int32_t> dest;
    std::vector<uint32_t> readers;
  };
  OutSend send_[kNumLanes];
  // Receiver side, [lane * world + peer], by that lane's thread: the last message consumed, how
  // far its scan found nothing more, the message being read (0: none).
  std::vector<uint64_t> last_, scanned_, cur_;
};

}  // namespace rc
