// Collectives over SlotExec (see ring_cuda.h). The structure mirrors the shm algorithms
// (algo/ring.cpp, chain.cpp, direct.cpp) step for step, and so do their invariants:
//  - ring: each chunk is cut into pieces of one slot; for piece j the ring runs all its steps
//    before piece j+1 starts. Rank r's outgoing stream is RS step 0 (from the input), RS steps
//    1..N-2 (fused: reduce(input, incoming) written straight into the right neighbour's slot —
//    over NVLink/PCIe when the slot is a peer's device memory), [all-reduce: AG step 0 = the
//    finished piece], AG steps 1..N-2 (forwarded). Deadlock freedom with >= 2 slots per channel
//    is the shm ring's argument (algo/ring.cpp): the same sends and receives happen in the same
//    order; the GPU-side waits only ever bind to records made earlier (transport/cuda_ipc.h).
//  - On the GPU every primitive is asynchronous on one stream, so "copy, then forward" orders
//    the forward after the copy, and a slot is released (recv_done) after the reads that use it.
//  - Empty pieces are skipped by sender and receiver alike (both derive them from the chunk).
#include "algo/ring_cuda.h"

#include <algorithm>
#include <cstring>

#include "algo/chunks.h"
#include "algo/ring_schedule.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"

namespace rc {

void HostSlotExec::reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) {
  reduce_cpu(dst, a, b, n, dt, op, scale);
}

void HostSlotExec::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

namespace {

WaitCtx wctx(const SlotAlgoCtx& c, int step, int nsteps) {
  WaitCtx w;
  w.op = c.op;
  w.seq = c.seq;
  w.step = step;
  w.nsteps = nsteps;
  return w;
}

void bounds(int64_t off, int64_t cnt, int64_t j, int64_t pe, int64_t* o, int64_t* n) {
  const int64_t start = j * pe;
  *o = off + start;
  *n = std::max<int64_t>(0, std::min<int64_t>(pe, cnt - start));
}

// Send m elements from src (element offset o in the full buffer, for the slot residue).
void send_copy(const SlotAlgoCtx& c, int peer, const char* src, int64_t o, int64_t m, const WaitCtx& w,
               uint64_t total = 0, bool residue = true) {
  char* dst = c.x->send_slot(peer, w) + (residue ? c.slot_offset(o) : 0);
  if (m > 0) c.x->copy(dst, src, static_cast<size_t>(m) * c.esize);
  c.x->send_post(peer, static_cast<uint64_t>(m) * c.esize, total, c.seq);
}

const char* recv_expect(const SlotAlgoCtx& c, int peer, int64_t o, int64_t m, const WaitCtx& w, bool residue = true) {
  const SlotMeta* meta = nullptr;
  const char* p = c.x->recv_slot(peer, w, &meta);
  const uint64_t bytes = static_cast<uint64_t>(m) * c.esize;
  if (meta->tag != c.seq || meta->bytes != bytes) {
    RC_THROW(Error, "ringcomm: " << c.op << " (seq " << c.seq << ") on rank " << c.rank << ": received a piece of "
                                 << meta->bytes << " bytes tagged seq " << meta->tag << " from rank " << peer
                                 << " at step " << w.step << ", expected " << bytes << " bytes of seq " << c.seq
                                 << " (the ranks' schedules diverged)");
  }
  return p + (residue ? c.slot_offset(o) : 0);
}

void copy_elems(const SlotAlgoCtx& c, char* dst, const char* src, int64_t n) {
  if (n > 0 && dst != src) c.x->copy(dst, src, static_cast<size_t>(n) * c.esize);
}

// Reduce-scatter phase for piece j; the finished piece of this rank's chunk goes to
// final_dst(o) and, if then_send, on to the right neighbour as AG step 0.
template <class FinalDst>
void rs_piece(const SlotAlgoCtx& c, const Chunks& ch, const char* in, int64_t j, int64_t pe, ReduceOp op,
              FinalDst final_dst, bool then_send, int total_steps) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const size_t es = c.esize;
  int64_t o, m;
  const int k0 = ring::rs_send(r, 0, n);
  bounds(ch.off[k0], ch.cnt[k0], j, pe, &o, &m);
  if (m > 0) send_copy(c, R, in + o * es, o, m, wctx(c, 0, total_steps));
  for (int s = 0; s < n - 1; ++s) {
    const int k = ring::rs_recv(r, s, n);
    bounds(ch.off[k], ch.cnt[k], j, pe, &o, &m);
    if (m == 0) continue;
    const WaitCtx w = wctx(c, s, total_steps);
    const char* src = recv_expect(c, L, o, m, w);
    if (s < n - 2) {
      // Fused: combine with our input straight into the right neighbour's slot.
      char* dst = c.x->send_slot(R, w) + c.slot_offset(o);
      c.x->reduce(dst, in + o * es, src, static_cast<size_t>(m), c.dtype, op, 1.0);
      c.x->send_post(R, static_cast<uint64_t>(m) * es, 0, c.seq);
    } else {
      const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
      char* dst = final_dst(o);
      c.x->reduce(dst, in + o * es, src, static_cast<size_t>(m), c.dtype, op, scale);
      if (then_send) send_copy(c, R, dst, o, m, wctx(c, n - 1, total_steps));
    }
    c.x->recv_done(L);
  }
}

// All-gather phase for piece j, the N-1 receiving steps (the step-0 send is the caller's).
// Each received piece is copied to its place first and forwarded from there: the forward then
// reads local memory (not a host-staged slot twice), and stream order puts it after the copy.
void ag_piece_recv(const SlotAlgoCtx& c, const std::vector<int64_t>& cnt, const std::vector<int64_t>& off, char* out,
                   int64_t j, int64_t pe, int step_base, int total_steps) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const size_t es = c.esize;
  for (int s = 0; s < n - 1; ++s) {
    const int k = ring::ag_recv(r, s, n);
    int64_t o, m;
    bounds(off[k], cnt[k], j, pe, &o, &m);
    if (m == 0) continue;
    const WaitCtx w = wctx(c, step_base + s, total_steps);
    const char* src = recv_expect(c, L, o, m, w);
    copy_elems(c, out + o * es, src, m);
    c.x->recv_done(L);
    if (s < n - 2) send_copy(c, R, out + o * es, o, m, w);
  }
}

}  // namespace

void slot_ring_all_reduce(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  if (c.world == 1 || count == 0) return copy_elems(c, out, in, count);
  const int n = c.world;
  const Chunks ch = all_reduce_chunks(count, n, c.esize);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (ch.max_cnt + pe - 1) / pe;
  const int total_steps = 2 * (n - 1);
  for (int64_t j = 0; j < npieces; ++j) {
    rs_piece(c, ch, in, j, pe, op, [&](int64_t o) { return out + o * c.esize; }, true, total_steps);
    ag_piece_recv(c, ch.cnt, ch.off, out, j, pe, n - 1, total_steps);
  }
}

void slot_ring_reduce_scatter(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return copy_elems(c, out, in, count);
  const Chunks ch = balanced_chunks(count, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (ch.max_cnt + pe - 1) / pe;
  const int64_t own_off = ch.off[r];
  for (int64_t j = 0; j < npieces; ++j) {
    rs_piece(c, ch, in, j, pe, op, [&](int64_t o) { return out + (o - own_off) * c.esize; }, false, n - 1);
  }
}

void slot_ring_all_gather(const SlotAlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts) {
  const int n = c.world, r = c.rank;
  std::vector<int64_t> off(n, 0);
  int64_t total = 0, max_cnt = 0;
  for (int k = 0; k < n; ++k) {
    off[k] = total;
    total += counts[k];
    max_cnt = std::max(max_cnt, counts[k]);
  }
  const size_t es = c.esize;
  // Our own contribution lands in its place first (unless the caller passed it in place; the
  // communicator rejects partial overlaps).
  copy_elems(c, out + off[r] * es, in, counts[r]);
  if (n == 1 || total == 0) return;
  const int R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (max_cnt + pe - 1) / pe;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    bounds(off[r], counts[r], j, pe, &o, &m);
    if (m > 0) send_copy(c, R, out + o * es, o, m, wctx(c, 0, n - 1));
    ag_piece_recv(c, counts, off, out, j, pe, 0, n - 1);
  }
}

// Chains (mirrors algo/chain.cpp): broadcast flows root -> root+1 -> ... -> root-1; reduce
// flows root+1 -> ... -> root, each rank combining its input into the passing piece.
void slot_chain_broadcast(const SlotAlgoCtx& c, char* buf, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return;
  const int pos = static_cast<int>(ring::mod(r - root, n));
  const int L = ring::left(r, n), R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (count + pe - 1) / pe;
  const size_t es = c.esize;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    bounds(0, count, j, pe, &o, &m);
    const WaitCtx w = wctx(c, pos, n - 1);
    if (pos == 0) {
      send_copy(c, R, buf + o * es, o, m, w);
      continue;
    }
    const char* src = recv_expect(c, L, o, m, w);
    copy_elems(c, buf + o * es, src, m);
    c.x->recv_done(L);
    if (pos < n - 1) send_copy(c, R, buf + o * es, o, m, w);
  }
}

void slot_chain_reduce(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  if (n == 1) {
    if (out != nullptr) copy_elems(c, out, in, count);
    return;
  }
  const int pos = static_cast<int>(ring::mod(r - root - 1, n));  // root+1 is first, root last
  const int L = ring::left(r, n), R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (count + pe - 1) / pe;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    bounds(0, count, j, pe, &o, &m);
    const WaitCtx w = wctx(c, pos, n - 1);
    if (pos == 0) {
      send_copy(c, R, in + o * es, o, m, w);
      continue;
    }
    const char* src = recv_expect(c, L, o, m, w);
    if (pos < n - 1) {
      char* dst = c.x->send_slot(R, w) + c.slot_offset(o);
      c.x->reduce(dst, in + o * es, src, static_cast<size_t>(m), c.dtype, op, 1.0);
      c.x->send_post(R, static_cast<uint64_t>(m) * es, 0, c.seq);
    } else {
      c.x->reduce(out + o * es, in + o * es, src, static_cast<size_t>(m), c.dtype, op, scale);
    }
    c.x->recv_done(L);
  }
}

// Direct exchanges (mirrors algo/direct.cpp). Sender and receiver offsets differ here, so the
// slot residue is 0 (plain copies: the copy engine does not care about alignment).
namespace {
int64_t npieces_of(int64_t count, int64_t pe) { return count == 0 ? 1 : (count + pe - 1) / pe; }
}  // namespace

void slot_direct_all_to_all(const SlotAlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_offs, const std::vector<int64_t>& recv_counts,
                            const std::vector<int64_t>& recv_offs) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(send_counts[r] == recv_counts[r], Mismatch,
           "ringcomm: all_to_all on rank " << r << ": sends " << send_counts[r] << " elements to itself but expects "
                                           << recv_counts[r]);
  copy_elems(c, out + recv_offs[r] * es, in + send_offs[r] * es, send_counts[r]);
  const int64_t pe = c.piece_elems();
  for (int s = 1; s < n; ++s) {
    const int dst = static_cast<int>(ring::mod(r + s, n));
    const int src = static_cast<int>(ring::mod(r - s, n));
    const int64_t ns = npieces_of(send_counts[dst], pe), nr = npieces_of(recv_counts[src], pe);
    const uint64_t send_total = static_cast<uint64_t>(send_counts[dst]) * es;
    for (int64_t j = 0; j < std::max(ns, nr); ++j) {
      const WaitCtx w = wctx(c, s - 1, n - 1);
      if (j < ns) {
        int64_t o, m;
        bounds(send_offs[dst], send_counts[dst], j, pe, &o, &m);
        send_copy(c, dst, in + o * es, o, m, w, send_total, false);
      }
      if (j < nr) {
        const SlotMeta* meta = nullptr;
        const char* p = c.x->recv_slot(src, w, &meta);
        const uint64_t want_total = static_cast<uint64_t>(recv_counts[src]) * es;
        if (meta->tag != c.seq || (j == 0 && meta->total != want_total)) {
          RC_THROW(Mismatch, "ringcomm: all_to_all (seq " << c.seq << ") on rank " << r << ": rank " << src << " sends "
                                                          << meta->total / es << " elements but rank " << r << " expects "
                                                          << recv_counts[src]
                                                          << " (input/output split sizes disagree across ranks)");
        }
        int64_t o, m;
        bounds(recv_offs[src], recv_counts[src], j, pe, &o, &m);
        if (meta->bytes != static_cast<uint64_t>(m) * es) {
          RC_THROW(Error, "ringcomm: all_to_all (seq " << c.seq << ") on rank " << r << ": piece " << j << " from rank "
                                                       << src << " has " << meta->bytes << " bytes, expected " << m * es);
        }
        copy_elems(c, out + o * es, p, m);
        c.x->recv_done(src);
      }
    }
  }
}

void slot_direct_gather(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  const int64_t pe = c.piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  if (r != root) {
    for (int64_t j = 0; j < np; ++j) {
      int64_t o, m;
      bounds(0, count, j, pe, &o, &m);
      send_copy(c, root, in + o * es, o, m, wctx(c, 0, 1), 0, false);
    }
    return;
  }
  copy_elems(c, out + r * count * es, in, count);
  for (int64_t j = 0; j < np; ++j) {
    for (int s = 1; s < n; ++s) {
      const int src = static_cast<int>(ring::mod(root + s, n));
      int64_t o, m;
      bounds(src * count, count, j, pe, &o, &m);
      const char* p = recv_expect(c, src, o, m, wctx(c, 0, 1), false);
      copy_elems(c, out + o * es, p, m);
      c.x->recv_done(src);
    }
  }
}

void slot_direct_scatter(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  const int64_t pe = c.piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  if (r != root) {
    for (int64_t j = 0; j < np; ++j) {
      int64_t o, m;
      bounds(0, count, j, pe, &o, &m);
      const char* p = recv_expect(c, root, o, m, wctx(c, 0, 1), false);
      copy_elems(c, out + o * es, p, m);
      c.x->recv_done(root);
    }
    return;
  }
  for (int64_t j = 0; j < np; ++j) {
    for (int s = 1; s < n; ++s) {
      const int dst = static_cast<int>(ring::mod(root + s, n));
      int64_t o, m;
      bounds(dst * count, count, j, pe, &o, &m);
      send_copy(c, dst, in + o * es, o, m, wctx(c, 0, 1), 0, false);
    }
  }
  copy_elems(c, out, in + r * count * es, count);
}

}  // namespace rc
