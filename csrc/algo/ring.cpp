// Ring reduce-scatter / all-gather / all-reduce over slots, pipelined piece by piece.
//
// Each chunk is cut into pieces of one slot. For piece j the ring runs all its steps before
// piece j+1 starts, so N-1 steps of different pieces are in flight around the ring at once.
// Within a piece, rank r's outgoing stream to its right neighbour is
//   RS step 0 (from the input), RS steps 1..N-2 (fused: reduce(input, incoming) written straight
//   into the right neighbour's slot), [all-reduce: AG step 0 = the finished chunk], AG steps
//   1..N-2 (the incoming slot forwarded),
// and its incoming stream from the left is the same sequence of the left neighbour.
// Deadlock freedom with >= 2 slots per channel: the only sends not paid for by a receive are the
// one RS step-0 send per piece, so at most N messages beyond those consumed are ever in flight,
// fewer than the 2N slots around the ring; a rank that holds an incoming slot while waiting for
// an outgoing one therefore always finds its right neighbour able to drain.
// Empty pieces (a chunk shorter than j pieces) are skipped by sender and receiver alike: both
// compute them from the same chunk index.
#include <cstdint>
#include <vector>

#include "algo/chunks.h"
#include "algo/pieces.h"
#include "algo/ring_schedule.h"
#include "kernels/reduce_cpu.h"

namespace rc {

namespace {

// Reduce-scatter phase for piece j. Writes the finished piece of chunk `owner` to
// out + (owner_out_base(owner piece offset)) and, if `then_send`, sends it as AG step 0.
// `final_dst(o)` maps a full-buffer element offset to the destination pointer.
template <class FinalDst>
void rs_piece(const AlgoCtx& c, const Chunks& ch, const char* in, int64_t j, int64_t pe, ReduceOp op,
              FinalDst final_dst, bool then_send, int total_steps) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const size_t es = c.esize;
  int64_t o, m;
  piece_bounds(ch.off[ring::rs_send(r, 0, n)], ch.cnt[ring::rs_send(r, 0, n)], j, pe, &o, &m);
  if (m > 0) send_copy(c, R, in + o * es, m * es, wait_ctx(c, 0, total_steps));
  for (int s = 0; s < n - 1; ++s) {
    const int k = ring::rs_recv(r, s, n);
    piece_bounds(ch.off[k], ch.cnt[k], j, pe, &o, &m);
    if (m == 0) continue;
    WaitCtx w = wait_ctx(c, s, total_steps);
    const char* src = recv_expect(c, L, m * es, w);
    if (s < n - 2) {
      char* dst = c.t->send_slot(R, Lane::kColl, w, in + o * es);
      reduce_to_peer(c, dst, in + o * es, src, m, op);
      c.t->send_post(R, Lane::kColl, m * es, 0, c.seq);
    } else {
      double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
      char* dst = final_dst(o);
      reduce_cpu(dst, in + o * es, src, m, c.dtype, op, scale);
      if (then_send) send_copy(c, R, dst, m * es, wait_ctx(c, n - 1, total_steps));
    }
    c.t->recv_done(L, Lane::kColl);
  }
}

// All-gather phase for piece j, steps 0..N-2 receiving (step-0 send done by the caller).
void ag_piece_recv(const AlgoCtx& c, const std::vector<int64_t>& cnt, const std::vector<int64_t>& off, char* out,
                   int64_t j, int64_t pe, int step_base, int total_steps) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const size_t es = c.esize;
  for (int s = 0; s < n - 1; ++s) {
    const int k = ring::ag_recv(r, s, n);
    int64_t o, m;
    piece_bounds(off[k], cnt[k], j, pe, &o, &m);
    if (m == 0) continue;
    WaitCtx w = wait_ctx(c, step_base + s, total_steps);
    const char* src = recv_expect(c, L, m * es, w);
    if (s < n - 2) send_copy(c, R, src, m * es, w);
    std::memcpy(out + o * es, src, m * es);
    c.t->recv_done(L, Lane::kColl);
  }
}

void copy_or_scale(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  // A world of one: the reduction of one contribution is itself (AVG divides by 1).
  (void)op;
  if (out != in && count > 0) std::memcpy(out, in, static_cast<size_t>(count) * c.esize);
}

}  // namespace

void ring_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  if (c.world == 1 || count == 0) return copy_or_scale(c, in, out, count, op);
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

void ring_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return copy_or_scale(c, in, out, count, op);
  const Chunks ch = balanced_chunks(count, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (ch.max_cnt + pe - 1) / pe;
  const int64_t own_off = ch.off[r];
  for (int64_t j = 0; j < npieces; ++j) {
    rs_piece(c, ch, in, j, pe, op, [&](int64_t o) { return out + (o - own_off) * c.esize; }, false, n - 1);
  }
}

void ring_all_gather(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts) {
  const int n = c.world, r = c.rank;
  std::vector<int64_t> off(n, 0);
  int64_t total = 0, max_cnt = 0;
  for (int k = 0; k < n; ++k) {
    off[k] = total;
    total += counts[k];
    max_cnt = std::max(max_cnt, counts[k]);
  }
  const size_t es = c.esize;
  char* own = out + off[r] * es;
  const size_t own_bytes = static_cast<size_t>(counts[r]) * es;
  const bool in_place = own == in;
  // Out of place, each piece of our contribution is sent from the input and then copied into its
  // place while it is still in cache (one read of the input instead of two). An input that
  // overlaps the output anywhere else is first moved into place as a whole.
  const uintptr_t in_a = reinterpret_cast<uintptr_t>(in), out_a = reinterpret_cast<uintptr_t>(out);
  const bool overlaps = !in_place && own_bytes > 0 && in_a < out_a + total * es && out_a < in_a + own_bytes;
  if (overlaps) std::memmove(own, in, own_bytes);
  const char* src = (in_place || overlaps) ? own : in;
  if (n == 1 || total == 0) {
    if (src != own && own_bytes > 0) std::memcpy(own, src, own_bytes);
    return;
  }
  const int R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (max_cnt + pe - 1) / pe;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    piece_bounds(0, counts[r], j, pe, &o, &m);
    if (m > 0) {
      send_copy(c, R, src + o * es, m * es, wait_ctx(c, 0, n - 1));
      if (src != own) std::memcpy(own + o * es, src + o * es, m * es);
    }
    ag_piece_recv(c, counts, off, out, j, pe, 0, n - 1);
  }
}

}  // namespace rc
