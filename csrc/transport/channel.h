// The one interface every collective algorithm (csrc/algo/) is written against: a slot to a peer,
// a slot from a peer, reduce, copy. Two implementations:
//  - ShmChannel (transport/shm_channel.h): the shm transport's slots, memcpy / streaming stores
//    and the CPU reduce kernels, executed at once on the calling thread;
//  - CudaChannel (transport/cuda_channel.h): the CUDA IPC transport's slots, cudaMemcpyAsync and
//    the CUDA reduce kernels, all enqueued on the caller's stream.
// What differs between them is a property of the channel, never a second algorithm: where a
// piece sits in its slot (the placement), how fused reductions and copies write into a peer's
// slot (the store policy), and whether a received piece is forwarded straight from its slot or
// copied out first (forward_from_slot).
//
// Slot protocol (both implementations): send_slot waits (bounded) until the next slot to `peer`
// is free and returns where to write; the writes issued through reduce_into_slot/copy_into_slot
// are published by send_post. recv_slot waits (bounded) for the next filled slot from `peer`;
// reads issued through reduce/copy are finished before recv_done releases it. Slots to one peer
// are used in order; a caller holds at most one unpublished slot per peer.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/errors.h"
#include "transport/shm_types.h"

namespace rc {

/// Where a piece belongs, for the channel's placement of it within a slot.
struct PiecePlace {
  /// The memory the sender reads the piece from (sender side; nullptr: none).
  const void* like = nullptr;
  /// The piece's byte offset within the collective's full buffer, computed alike by sender and
  /// receiver; -1 when the two ends' offsets differ (direct exchanges).
  int64_t off_bytes = -1;
  /// The piece's bytes (sender side; 0: not known). A channel may move a small piece about its
  /// slot with it (transport/shm_slots.h, the walk); the receiver finds it from the slot's meta.
  int64_t bytes = 0;
};

// The primitives every channel implements, declared once: RC_CHANNEL_PRIMITIVES(virtual, = 0)
// in Channel, RC_CHANNEL_PRIMITIVES(, override) in an implementation.
//  - piece_bytes: payload bytes one slot carries at any placement.
//  - send_slot / try_send_slot: the next slot to `peer` (try_: non-blocking, nullptr when no slot
//    is free; the point-to-point engine polls); send_post publishes it.
//  - recv_slot / try_recv_slot: the next filled slot from `peer` (try_: nullptr when nothing
//    arrived); recv_done releases it.
//  - reduce: dst = a (op) b over n elements in local memory (scale for AVG; see
//    kernels/reduce_cpu.h). reduce_into_slot: slot (from send_slot) = a (op) b over n elements.
//  - copy: dst = src in local memory; the ranges are equal (nothing to do) or disjoint.
//    copy_into_slot: slot (from send_slot) = src.
#define RC_CHANNEL_PRIMITIVES(virt, spec)                                                                    \
  virt size_t piece_bytes() const spec;                                                                      \
  virt char* send_slot(int peer, const WaitCtx& w, const PiecePlace& at) spec;                               \
  virt char* try_send_slot(int peer, const PiecePlace& at) spec;                                             \
  virt void send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) spec;                          \
  virt const char* recv_slot(int peer, const WaitCtx& w, const PiecePlace& at, const SlotMeta** meta) spec;  \
  virt const char* try_recv_slot(int peer, const PiecePlace& at, const SlotMeta** meta) spec;                \
  virt void recv_done(int peer) spec;                                                                        \
  virt void reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) spec; \
  virt void reduce_into_slot(char* slot, const void* a, const void* b, size_t n, DType dt, ReduceOp op) spec; \
  virt void copy(void* dst, const void* src, size_t bytes) spec;                                             \
  virt void copy_into_slot(char* slot, const void* src, size_t bytes) spec;

class Channel {
 public:
  virtual ~Channel() = default;
  /// true: a received piece is forwarded from its slot before it is copied out (the slot is
  /// cache-hot local memory: the next link starts sooner). false: it is copied to its place
  /// first and forwarded from there (stream order; a host-staged slot is read once).
  virtual bool forward_from_slot() const = 0;
  /// Payload bytes one slot carries on every channel, to or from any peer: the piece size of the
  /// direct exchanges (all_to_all, gather, scatter, direct all-reduce) and of point-to-point.
  /// piece_bytes() is the ring neighbours' (ring and chains), which may be larger. Asked once per
  /// collective, never per piece.
  virtual size_t far_piece_bytes() const { return piece_bytes(); }
  /// Whether send_slot_all exists: one slot whose payload EVERY peer receives as its next
  /// message from this rank (written once however many peers read it). Without it a message for
  /// every peer is sent to each (algo/pieces.h, send_copy_all).
  virtual bool has_send_all() const { return false; }
  /// With has_send_all: the slot (waits, bounded); send_post_all publishes it to every peer.
  virtual char* send_slot_all(const WaitCtx& w, const PiecePlace& at) {
    (void)w, (void)at;
    RC_THROW(Unsupported, "ringcomm: this channel has no slot for every peer");
  }
  virtual void send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) {
    (void)bytes, (void)total, (void)tag;
    RC_THROW(Unsupported, "ringcomm: this channel has no slot for every peer");
  }
  RC_CHANNEL_PRIMITIVES(virtual, = 0)
};

}  // namespace rc
