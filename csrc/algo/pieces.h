// Piece helpers shared by the algorithms: moving one piece through a slot, with the slot's tag
// and size checked on receipt (a mismatch means the ranks' schedules diverged: a bug or a
// mismatched call that the header exchange could not see).
#pragma once
#include <algorithm>
#include <cstring>

#include "algo/context.h"
#include "common/errors.h"
#include "kernels/copy_cpu.h"
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
  int64_t start = j * pe;
  *o = off + start;
  *n = std::max<int64_t>(0, std::min<int64_t>(pe, cnt - start));
}

/// Copy `bytes` from src into the next slot to `peer` and publish it (with streaming stores when
/// c.stream: see kernels/copy_cpu.h).
inline void send_copy(const AlgoCtx& c, int peer, const char* src, size_t bytes, const WaitCtx& w,
                      uint64_t total = 0) {
  char* dst = c.t->send_slot(peer, Lane::kColl, w, src);
  copy_to_peer(dst, src, bytes, c.stream);
  c.t->send_post(peer, Lane::kColl, bytes, total, c.seq);
}

/// dst (a peer's slot) = a (op) b. With c.stream the result is formed in the private scratch
/// (cache-resident, one slot) and streamed into the slot, since the reduce kernels write with
/// cached stores only.
inline void reduce_to_peer(const AlgoCtx& c, char* dst, const char* a, const char* b, int64_t m, ReduceOp op) {
  if (c.stream && c.scratch != nullptr) {
    reduce_cpu(c.scratch, a, b, static_cast<size_t>(m), c.dtype, op, 1.0);
    copy_to_peer(dst, c.scratch, static_cast<size_t>(m) * c.esize, true);
  } else {
    reduce_cpu(dst, a, b, static_cast<size_t>(m), c.dtype, op, 1.0);
  }
}

/// Wait for the next slot from `peer` and check it carries `bytes` of this collective.
inline const char* recv_expect(const AlgoCtx& c, int peer, size_t bytes, const WaitCtx& w) {
  const SlotMeta* m = nullptr;
  const char* p = c.t->recv_slot(peer, Lane::kColl, w, &m);
  if (m->tag != c.seq || m->bytes != bytes) {
    RC_THROW(Error, "ringcomm: " << c.op << " (seq " << c.seq << ") on rank " << c.rank << ": received a piece of "
                                 << m->bytes << " bytes tagged seq " << m->tag << " from rank " << peer
                                 << " at step " << w.step << ", expected " << bytes << " bytes of seq " << c.seq
                                 << " (the ranks' schedules diverged)");
  }
  return p;
}

}  // namespace rc
