// Ring reduce-scatter / all-gather / all-reduce over the channel's slots, pipelined piece by
// piece; one implementation for every transport (transport/channel.h).
//
// Each chunk is cut into pieces of one slot. For piece j the ring runs all its steps before
// piece j+1 starts, so N-1 steps of different pieces are in flight around the ring at once.
// Within a piece, rank r's outgoing stream to its right neighbour is
//   RS step 0 (from the input), RS steps 1..N-2 (fused: reduce(input, incoming) written straight
//   into the right neighbour's slot), [all-reduce: AG step 0 = the finished chunk], AG steps
//   1..N-2 (the incoming piece forwarded),
// and its incoming stream from the left is the same sequence of the left neighbour.
// Deadlock freedom with >= 2 slots per channel: the only sends not paid for by a receive are the
// one RS step-0 send per piece, so at most N messages beyond those consumed are ever in flight,
// fewer than the 2N slots around the ring; a rank that holds an incoming slot while waiting for
// an outgoing one therefore always finds its right neighbour able to drain. The channel's
// forward order (forward_from_slot) only moves a rank's own copy-out before or after its
// forward; the sequence of sends and receives, and so this argument, is the same. On the CUDA
// channel the GPU-side waits only ever bind to records made earlier (transport/cuda_ipc.h).
// Empty pieces (a chunk shorter than j pieces) are skipped by sender and receiver alike: both
// compute them from the same chunk index.
// Reduction order: an element of all-reduce chunk k is combined along the ring starting at rank
// k+1, rank k's own input last (gloo's order, ring_schedule.h); every rank receives that one
// result, so results are bit-identical on every rank and on every channel.
#include <cstdint>
#include <vector>

#include "algo/chunks.h"
#include "algo/pieces.h"
#include "algo/ring_schedule.h"
#include "kernels/reduce_cpu.h"

namespace rc {

namespace {

// RS step 0 of piece j: chunk rs_send(r, 0)'s piece j of the input to the right neighbour (no
// message for an empty piece). It waits on nothing: piece 0's may go before the header.
void rs_step0_send(const AlgoCtx& c, const Chunks& ch, const char* in, int64_t j, int64_t pe, int total_steps) {
  const int k0 = ring::rs_send(c.rank, 0, c.world);
  int64_t o, m;
  piece_bounds(ch.off[k0], ch.cnt[k0], j, pe, &o, &m);
  if (m > 0) send_copy(c, ring::right(c.rank, c.world), in + o * c.esize, o, m, wait_ctx(c, 0, total_steps));
}

// Reduce-scatter phase for piece j. The finished piece of this rank's chunk goes to
// final_dst(o) (o: its full-buffer element offset) and, if `then_send`, on as AG step 0.
// first_sent: step 0's send of piece 0 went out before the header (rs_step0_send).
template <class FinalDst>
void rs_piece(const AlgoCtx& c, const Chunks& ch, const char* in, int64_t j, int64_t pe, ReduceOp op,
              FinalDst final_dst, bool then_send, int total_steps, bool first_sent) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const size_t es = c.esize;
  int64_t o, m;
  if (j > 0 || !first_sent) rs_step0_send(c, ch, in, j, pe, total_steps);
  for (int s = 0; s < n - 1; ++s) {
    const int k = ring::rs_recv(r, s, n);
    piece_bounds(ch.off[k], ch.cnt[k], j, pe, &o, &m);
    if (m == 0) continue;
    const WaitCtx w = wait_ctx(c, s, total_steps);
    const char* src = recv_expect(c, L, o, m, w);
    if (s < n - 2) {
      send_reduced(c, R, in + o * es, src, o, m, op, w);
    } else {
      const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
      char* dst = final_dst(o);
      c.ch->reduce(dst, in + o * es, src, static_cast<size_t>(m), c.dtype, op, scale);
      if (then_send) send_copy(c, R, dst, o, m, wait_ctx(c, n - 1, total_steps));
    }
    c.ch->recv_done(L);
  }
}

// All-gather phase for piece j, steps 0..N-2 receiving (the step-0 send is the caller's).
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
    const WaitCtx w = wait_ctx(c, step_base + s, total_steps);
    const char* src = recv_expect(c, L, o, m, w);
    deliver(c, L, src, out + o * es, o, m, s < n - 2, R, w);
  }
}

}  // namespace

void ring_send_first(const AlgoCtx& c, const char* in, int64_t count, bool all_reduce) {
  const int n = c.world;
  if (count == 0 || n == 1) return;
  const Chunks ch = all_reduce ? all_reduce_chunks(count, n, c.esize) : balanced_chunks(count, n);
  rs_step0_send(c, ch, in, 0, c.piece_elems(), all_reduce ? 2 * (n - 1) : n - 1);
}

void ring_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, bool first_sent) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  const int n = c.world;
  const Chunks ch = all_reduce_chunks(count, n, c.esize);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (ch.max_cnt + pe - 1) / pe;
  const int total_steps = 2 * (n - 1);
  for (int64_t j = 0; j < npieces; ++j) {
    rs_piece(c, ch, in, j, pe, op, [&](int64_t o) { return out + o * c.esize; }, true, total_steps, first_sent);
    ag_piece_recv(c, ch.cnt, ch.off, out, j, pe, n - 1, total_steps);
  }
}

void ring_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, bool first_sent) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return copy_elems(c, out, in, count);
  const Chunks ch = balanced_chunks(count, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (ch.max_cnt + pe - 1) / pe;
  const int64_t own_off = ch.off[r];
  for (int64_t j = 0; j < npieces; ++j) {
    rs_piece(c, ch, in, j, pe, op, [&](int64_t o) { return out + (o - own_off) * c.esize; }, false, n - 1,
             first_sent);
  }
}

void ring_all_gather_send_first(const AlgoCtx& c, const char* in, int64_t count, int64_t total) {
  const int n = c.world;
  if (n == 1) return;
  int64_t o, m;
  piece_bounds(0, count, 0, c.piece_elems(), &o, &m);
  // The piece's place in the output (its slot offset only): the ring's when the blocks are even.
  const int64_t at = total == count * n ? c.rank * count + o : -1;
  send_copy(c, ring::right(c.rank, n), in + o * c.esize, at, m, wait_ctx(c, 0, n - 1));
}

void ring_all_gather(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts,
                     bool first_sent) {
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
  // Our contribution is sent from `src`. Forwarding from the slot (host), each piece is sent from
  // the input and then copied into its place while it is still in cache (one read of the input
  // instead of two). Otherwise (CUDA) it is copied into its place first and sent from there, in
  // stream order. In place (in == own) there is nothing to copy.
  const char* src = in;
  if (!c.ch->forward_from_slot() || n == 1 || total == 0) {
    copy_elems(c, own, in, counts[r]);
    src = own;
  }
  if (n == 1 || total == 0) return;
  const int R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (max_cnt + pe - 1) / pe;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    piece_bounds(0, counts[r], j, pe, &o, &m);
    if (m > 0) {
      if (j > 0 || !first_sent) send_copy(c, R, src + o * es, off[r] + o, m, wait_ctx(c, 0, n - 1));
      if (src != own) copy_elems(c, own + o * es, src + o * es, m);
    }
    ag_piece_recv(c, counts, off, out, j, pe, 0, n - 1);
  }
}

}  // namespace rc
