// Host shared-memory transport: processes on one machine exchange bytes through POSIX shared
// memory in fixed-size slots, with flow control by atomic sequence counters. ShmTransport is the
// data plane over the control plane it extends (ShmControl, transport/shm_control.h: segments,
// liveness, waits, doorbell, header board); its own parts, each a class with its own header
// stating who writes which words and with what ordering:
//   ShmSlots     (shm_slots.h)     the push channels (head/tail flow control)
//   ShmOutbox    (shm_outbox.h)    the outboxes that peers read in place (pull)
// The segment's words: transport/shm_layout.h. The configuration: transport/shm_config.h.
//
// Layout. Every rank owns ONE segment, of a size that does not depend on the world size in the
// outbox layout (the host communicator's from 3 ranks on; see footprint_bytes):
//  - the header page (liveness, doorbell, header board) and the two LL outboxes;
//  - ONE push channel: the collective lane from the ring predecessor (rank-1), which carries
//    every ring and chain hand-off: `nslots` slots of `slot_bytes`. The sender writes into the
//    RECEIVER's segment ("push");
//  - two outboxes, one per lane (collectives, point-to-point), of `far_nslots` slots of
//    `far_slot_bytes` each (RINGCOMM_OUTBOX_SLOTS, RINGCOMM_FAR_SLOT_BYTES): every other message
//    this rank sends (direct exchanges to any peer, point-to-point to any peer, the successor
//    included) is written into its OWN outbox, and its reader copies it out of this segment
//    ("pull").
// So a segment is header + LL + nslots x (slot_bytes + 4 KiB) + 2 x far_nslots x
// (far_slot_bytes + 4 KiB) + control words, the same at 3 ranks as at 128.
// The uniform layout (up to 2 ranks, where the only peer is the ring neighbour on both sides, and
// the CUDA control plane and the simulation, whose ShmConfig asks for no outbox) keeps a push
// channel of `nslots` slots of `slot_bytes` for every lane and source index, the rank's own
// included, and no outbox: its size grows with the world.
//
// Routing: a slot to or from a peer is the push channel's where the pair has one (every pair in
// the uniform layout; the ring predecessor's collective lane in the outbox layout), else the
// sender's outbox. Either way the slots between one sender and one receiver on one lane are
// consumed in the order they were sent.
#pragma once
#include <cstdint>

#include "transport/shm_config.h"
#include "transport/shm_control.h"
#include "transport/shm_outbox.h"
#include "transport/shm_slots.h"
#include "transport/shm_types.h"

namespace rc {

class ShmTransport : public ShmControl {
 public:
  /// Closes on destruction (ShmControl::close).
  ShmTransport(int rank, int world, ShmConfig cfg);

  // ---- channel, sender side ----
  /// Wait for a free slot in `peer`'s inbox; returns where to write the payload (the channel's
  /// slot bytes: config().slot_bytes to the ring successor on the collective lane, else
  /// config().far_slot_bytes). With `like` the payload gets like's offset within a 4 KiB page: copies between the
  /// slot and user buffers (which numpy/torch place at small in-page offsets) then never have a
  /// small destination-minus-source skew, which costs 4K-aliasing stalls.
  char* send_slot(int peer, Lane lane, const WaitCtx& w, const void* like = nullptr) {
    return send_slot_at(peer, lane, w, page_offset(like));
  }
  /// send_slot with the payload `offset` (< 4096) bytes into the slot, chosen by the caller; a
  /// push channel's slot adds the walk for a piece of `bytes` (0: none; transport/shm_slots.h).
  char* send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset, size_t bytes = 0);
  /// Non-blocking: nullptr when no slot is free.
  char* try_send_slot(int peer, Lane lane, const void* like = nullptr) {
    return try_send_slot_at(peer, lane, page_offset(like));
  }
  char* try_send_slot_at(int peer, Lane lane, uint32_t offset, size_t bytes = 0);
  /// The offset of `like` within its 4 KiB page (0 for nullptr).
  static uint32_t page_offset(const void* like) {
    return like ? static_cast<uint32_t>(reinterpret_cast<uintptr_t>(like) & 4095u) : 0u;
  }
  /// Publish the slot obtained by send_slot/try_send_slot.
  void send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag);
  /// Outbox layout (has_outbox()), collective lane: one slot that every peer receives as its next
  /// message from this rank (the ring successor through its push channel: send_post_all copies the
  /// payload there). At most one unpublished outbox slot per lane at a time.
  char* send_slot_all(const WaitCtx& w, uint32_t offset, size_t bytes = 0);
  void send_post_all(uint64_t bytes, uint64_t total, uint64_t tag);

  // ---- channel, receiver side ----
  /// Wait for the next filled slot from `peer`; returns its payload and meta.
  const char* recv_slot(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta);
  const char* try_recv_slot(int peer, Lane lane, const SlotMeta** meta);
  /// Release the slot returned by recv_slot/try_recv_slot.
  void recv_done(int peer, Lane lane);

 private:
  bool pushes(int peer, Lane lane) const;  // this rank sends to peer through a push channel
  bool pulls(int peer, Lane lane) const;   // this rank receives from peer through its outbox
  // The data plane's parts; they refer to the control plane's.
  ShmSlots slots_;
  ShmOutbox out_;
};

}  // namespace rc
