// Piece helpers shared by the algorithms: moving one piece through a slot of the channel, with
// the slot's tag and size checked on receipt (a mismatch means the ranks' schedules diverged: a
// bug or a mismatched call that the header exchange could not see).
#pragma once
#include <algorithm>
#include <cstdint>

#include "algo/context.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"

namespace rc {

inline WaitCtx wait_ctx(const AlgoCtx& c, int step, int nsteps) {
  WaitCtx w;
  w.op = c.op;
  w.seq = c.seq;
  w.step = step;
  w.nsteps = nsteps;
  return w;
}

/// Bounds of piece j of a chunk [off, off+cnt): sets o/n (n may be 0).
inline void piece_bounds(int64_t off, int64_t cnt, int64_t j, int64_t pe, int64_t* o, int64_t* n) {
  const int64_t start = j * pe;
  *o = off + start;
  *n = std::max<int64_t>(0, std::min<int64_t>(pe, cnt - start));
}

/// The place of a piece of m elements read from `like` at element offset `o` of the full buffer
/// (o < 0: the two ends' offsets differ, as in the direct exchanges; m 0: the receiver's side).
inline PiecePlace place(const AlgoCtx& c, const void* like, int64_t o, int64_t m = 0) {
  const int64_t es = static_cast<int64_t>(c.esize);
  return PiecePlace{like, o >= 0 ? o * es : -1, m * es};
}

/// Copy m elements from src (full-buffer element offset o, or -1) into the next slot to `peer`
/// and publish it.
inline void send_copy(const AlgoCtx& c, int peer, const char* src, int64_t o, int64_t m, const WaitCtx& w,
                      uint64_t total = 0) {
  const size_t bytes = static_cast<size_t>(m) * c.esize;
  char* dst = c.ch->send_slot(peer, w, place(c, src, o, m));
  if (bytes > 0) c.ch->copy_into_slot(dst, src, bytes);
  c.ch->send_post(peer, bytes, total, c.seq);
  if (c.trace) c.trace->slot_sent();
}

/// send_copy to every peer: the same piece is their next message from this rank. Written once
/// where the channel has a slot for every peer (Channel::send_slot_all), else sent to ranks r+1,
/// r+2, ..., r-1 in turn.
inline void send_copy_all(const AlgoCtx& c, const char* src, int64_t o, int64_t m, const WaitCtx& w) {
  if (c.world == 1) return;
  if (!c.ch->has_send_all()) {
    for (int s = 1; s < c.world; ++s) send_copy(c, (c.rank + s) % c.world, src, o, m, w);
    return;
  }
  const size_t bytes = static_cast<size_t>(m) * c.esize;
  char* dst = c.ch->send_slot_all(w, place(c, src, o, m));
  if (bytes > 0) c.ch->copy_into_slot(dst, src, bytes);
  c.ch->send_post_all(bytes, 0, c.seq);
  if (c.trace) c.trace->slot_sent();
}

/// The fused step: the next slot to `peer` = a (op) b over m elements (full-buffer offset o), published.
inline void send_reduced(const AlgoCtx& c, int peer, const char* a, const char* b, int64_t o, int64_t m, ReduceOp op,
                         const WaitCtx& w) {
  char* dst = c.ch->send_slot(peer, w, place(c, a, o, m));
  c.ch->reduce_into_slot(dst, a, b, static_cast<size_t>(m), c.dtype, op);
  c.ch->send_post(peer, static_cast<uint64_t>(m) * c.esize, 0, c.seq);
  if (c.trace) c.trace->slot_sent();
}

/// Wait for the next slot from `peer` and check it carries m elements of this collective.
inline const char* recv_expect(const AlgoCtx& c, int peer, int64_t o, int64_t m, const WaitCtx& w) {
  const SlotMeta* meta = nullptr;
  const char* p = c.ch->recv_slot(peer, w, place(c, nullptr, o), &meta);
  const uint64_t bytes = static_cast<uint64_t>(m) * c.esize;
  if (meta->tag != c.seq || meta->bytes != bytes) {
    RC_THROW(Error, "ringcomm: " << c.op << " (seq " << c.seq << ") on rank " << c.rank << ": received a piece of "
                                 << meta->bytes << " bytes tagged seq " << meta->tag << " from rank " << peer
                                 << " at step " << w.step << ", expected " << bytes << " bytes of seq " << c.seq
                                 << " (the ranks' schedules diverged)");
  }
  if (c.trace) c.trace->slot_received();
  return p;
}

/// out[o, o+m) = the all-reduce of src[0..world) (src[p]: rank p's elements o..o+m) in the
/// ring's order of operations, so that every algorithm gives bit-identical results (and gloo's,
/// at world sizes 2 and 3): an element of all-reduce chunk k (ring::ar_chunk_*) is combined as
/// x[k+1], then x[k+2] (op) that, ..., then x[k] (op) that, scaled for AVG at that last step.
/// Every rank computes every element the same way: bit-identical on all ranks. With 3 or more
/// ranks `acc` (private memory for m elements) holds the partial results; out may be src[rank]
/// (in place), never another src.
void combine_in_ring_order(const AlgoCtx& c, const char* const* src, char* out, int64_t o, int64_t m,
                           int64_t count, ReduceOp op, char* acc);
/// dst[0, len) = the reduction of src[0..world) in the order the chain reduce to root k combines
/// them (x[k+1], then x[k+2] (op) that, ..., x[k] (op) that, scaled for AVG at that last step):
/// the ring's order for all-reduce chunk k. src[p] + rel is rank p's contribution. With 3 or more
/// ranks `acc` (private memory for len elements) holds the partial results; dst may be src[k]
/// (in place), never another src.
void combine_chunk_in_ring_order(const AlgoCtx& c, char* dst, const char* const* src, size_t rel, int k, size_t len,
                                 ReduceOp op, char* acc);

/// Copy m elements between local buffers (equal or disjoint).
inline void copy_elems(const AlgoCtx& c, char* dst, const char* src, int64_t m) {
  if (m > 0 && dst != src) c.ch->copy(dst, src, static_cast<size_t>(m) * c.esize);
}

/// What every all-reduce algorithm does first: refuse an op the dtype does not reduce, then
/// finish at once (true) for count 0, or for a world of one (out = in: the reduction of one
/// contribution is itself, AVG dividing by 1).
inline bool all_reduce_trivial(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  if (count != 0 && c.world != 1) return false;
  copy_elems(c, out, in, count);
  return true;
}

/// A received piece (src, from `peer`'s slot) goes to dst and, if `forward`, on to `next`, in
/// the channel's order; the slot is released after both reads.
inline void deliver(const AlgoCtx& c, int peer, const char* src, char* dst, int64_t o, int64_t m, bool forward,
                    int next, const WaitCtx& w) {
  if (c.ch->forward_from_slot()) {
    if (forward) send_copy(c, next, src, o, m, w);  // forward first: the next link starts sooner
    copy_elems(c, dst, src, m);
    c.ch->recv_done(peer);
  } else {
    copy_elems(c, dst, src, m);
    c.ch->recv_done(peer);
    if (forward) send_copy(c, next, dst, o, m, w);  // ordered after the copy (stream order)
  }
}

}  // namespace rc
