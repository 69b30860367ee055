// Pipelined chains: broadcast flows root -> root+1 -> ... -> root-1; reduce flows
// root+1 -> root+2 -> ... -> root, each rank combining its input into the passing piece.
// A chain has no cycle, so any number of slots >= 1 is deadlock free; pieces pipeline so that
// all N-1 links move data at once for large messages.
#include "algo/pieces.h"
#include "algo/ring_schedule.h"
#include "kernels/reduce_cpu.h"

namespace rc {

void chain_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return;
  const int pos = static_cast<int>(ring::mod(r - root, n));
  const int L = ring::left(r, n), R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (count + pe - 1) / pe;
  const size_t es = c.esize;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    WaitCtx w = wait_ctx(c, pos, n - 1);
    if (pos == 0) {
      send_copy(c, R, buf + o * es, m * es, w);
      continue;
    }
    const char* src = recv_expect(c, L, m * es, w);
    if (pos < n - 1) send_copy(c, R, src, m * es, w);  // forward first: the next link starts sooner
    std::memcpy(buf + o * es, src, m * es);
    c.t->recv_done(L, Lane::kColl);
  }
}

void chain_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  if (n == 1) {
    if (out != nullptr && out != in) std::memcpy(out, in, count * es);
    return;
  }
  // Position along the chain: root+1 is first (0), root is last (n-1).
  const int pos = static_cast<int>(ring::mod(r - root - 1, n));
  const int L = ring::left(r, n), R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (count + pe - 1) / pe;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    WaitCtx w = wait_ctx(c, pos, n - 1);
    if (pos == 0) {
      send_copy(c, R, in + o * es, m * es, w);
      continue;
    }
    const char* src = recv_expect(c, L, m * es, w);
    if (pos < n - 1) {
      char* dst = c.t->send_slot(R, Lane::kColl, w, in + o * es);
      reduce_to_peer(c, dst, in + o * es, src, m, op);
      c.t->send_post(R, Lane::kColl, m * es, 0, c.seq);
    } else {
      reduce_cpu(out + o * es, in + o * es, src, m, c.dtype, op, scale);
    }
    c.t->recv_done(L, Lane::kColl);
  }
}

}  // namespace rc
