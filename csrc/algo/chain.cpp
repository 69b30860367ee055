// Pipelined chains: broadcast flows root -> root+1 -> ... -> root-1; reduce flows
// root+1 -> root+2 -> ... -> root, each rank combining its input into the passing piece.
// A chain has no cycle, so any number of slots >= 1 is deadlock free; pieces pipeline so that
// all N-1 links move data at once for large messages. One implementation for every transport.
#include "algo/pieces.h"
#include "algo/ring_schedule.h"
#include "kernels/reduce_cpu.h"

namespace rc {

namespace {

// The chain's piece loop: at position 0 (the head) each piece is sent on from head_src; every
// other position receives it from its left neighbour and hands it, with its WaitCtx, to
// at_link(src, o, m, w), which consumes the slot (and releases it) and sends on where the chain
// goes on. first_sent: the head's piece 0 went out before the header (chain_send_first, the same
// send).
template <class AtLink>
void chain_pieces(const AlgoCtx& c, int64_t count, int pos, const char* head_src, bool first_sent, AtLink at_link) {
  const int n = c.world, r = c.rank;
  const int L = ring::left(r, n), R = ring::right(r, n);
  const int64_t pe = c.piece_elems();
  const int64_t npieces = (count + pe - 1) / pe;
  const size_t es = c.esize;
  for (int64_t j = 0; j < npieces; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    const WaitCtx w = wait_ctx(c, pos, n - 1);
    if (pos == 0) {
      if (j > 0 || !first_sent) send_copy(c, R, head_src + o * es, o, m, w);
      continue;
    }
    at_link(recv_expect(c, L, o, m, w), o, m, w);
  }
}

}  // namespace

void chain_send_first(const AlgoCtx& c, const char* src, int64_t count) {
  if (count == 0 || c.world == 1) return;
  int64_t o, m;
  piece_bounds(0, count, 0, c.piece_elems(), &o, &m);
  send_copy(c, ring::right(c.rank, c.world), src + o * c.esize, o, m, wait_ctx(c, 0, c.world - 1));
}

void chain_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root, bool first_sent) {
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return;
  const int pos = static_cast<int>(ring::mod(r - root, n));
  const int L = ring::left(r, n), R = ring::right(r, n);
  chain_pieces(c, count, pos, buf, first_sent, [&](const char* src, int64_t o, int64_t m, const WaitCtx& w) {
    deliver(c, L, src, buf + o * c.esize, o, m, pos < n - 1, R, w);
  });
}

void chain_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root,
                  bool first_sent) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  if (n == 1) {
    if (out != nullptr) copy_elems(c, out, in, count);
    return;
  }
  // Position along the chain: root+1 is first (0), root is last (n-1).
  const int pos = static_cast<int>(ring::mod(r - root - 1, n));
  const int L = ring::left(r, n), R = ring::right(r, n);
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  chain_pieces(c, count, pos, in, first_sent, [&](const char* src, int64_t o, int64_t m, const WaitCtx& w) {
    if (pos < n - 1) {
      send_reduced(c, R, in + o * es, src, o, m, op, w);
    } else {
      c.ch->reduce(out + o * es, in + o * es, src, static_cast<size_t>(m), c.dtype, op, scale);
    }
    c.ch->recv_done(L);
  });
}

}  // namespace rc
