// Direct exchanges: all-to-all, gather, scatter. Each pair of ranks uses its own channel.
// all-to-all runs N-1 rounds; in round s rank r sends to r+s and receives from r-s, alternating
// one piece out and one piece in. Receiving never waits on sending, so rounds cannot deadlock
// (a chain of full channels around a cycle would need every rank to be ahead of its successor).
// Every all-to-all message carries its total size in its first slot (an empty block is one
// empty slot), so a receiver whose expected size differs detects it instead of misreading.
#include <algorithm>
#include <string>
#include <vector>

#include "algo/pieces.h"
#include "algo/ring_schedule.h"
#include "kernels/reduce_cpu.h"

namespace rc {

namespace {

int64_t npieces_of(int64_t count, int64_t pe) { return count == 0 ? 1 : (count + pe - 1) / pe; }

}  // namespace

void direct_all_to_all(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& send_offs, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& recv_offs) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(send_counts[r] == recv_counts[r], Mismatch,
           "ringcomm: all_to_all on rank " << r << ": sends " << send_counts[r] << " elements to itself but expects "
                                           << recv_counts[r]);
  if (send_counts[r] > 0) std::memcpy(out + recv_offs[r] * es, in + send_offs[r] * es, send_counts[r] * es);
  const int64_t pe = c.piece_elems();
  for (int s = 1; s < n; ++s) {
    const int dst = static_cast<int>(ring::mod(r + s, n));
    const int src = static_cast<int>(ring::mod(r - s, n));
    const int64_t ns = npieces_of(send_counts[dst], pe), nr = npieces_of(recv_counts[src], pe);
    const uint64_t send_total = static_cast<uint64_t>(send_counts[dst]) * es;
    for (int64_t j = 0; j < std::max(ns, nr); ++j) {
      WaitCtx w = wait_ctx(c, s - 1, n - 1);
      if (j < ns) {
        int64_t o, m;
        piece_bounds(send_offs[dst], send_counts[dst], j, pe, &o, &m);
        send_copy(c, dst, in + o * es, m * es, w, send_total);
      }
      if (j < nr) {
        const SlotMeta* meta = nullptr;
        WaitCtx wr = w;
        const char* p = c.t->recv_slot(src, Lane::kColl, wr, &meta);
        const uint64_t want_total = static_cast<uint64_t>(recv_counts[src]) * es;
        if (meta->tag != c.seq || (j == 0 && meta->total != want_total)) {
          RC_THROW(Mismatch, "ringcomm: all_to_all (seq " << c.seq << ") on rank " << r << ": rank " << src
                             << " sends " << meta->total / es << " elements but rank " << r << " expects "
                             << recv_counts[src] << " (input/output split sizes disagree across ranks)");
        }
        int64_t o, m;
        piece_bounds(recv_offs[src], recv_counts[src], j, pe, &o, &m);
        if (meta->bytes != static_cast<uint64_t>(m) * es) {
          RC_THROW(Error, "ringcomm: all_to_all (seq " << c.seq << ") on rank " << r << ": piece " << j << " from rank "
                          << src << " has " << meta->bytes << " bytes, expected " << m * es);
        }
        if (m > 0) std::memcpy(out + o * es, p, m * es);
        c.t->recv_done(src, Lane::kColl);
      }
    }
  }
}

void direct_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  if (n == 1) {
    if (out != in) std::memcpy(out, in, count * es);
    return;
  }
  const int64_t pe = c.piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  // The ring's order of operations, so that both algorithms give bit-identical results (and
  // gloo's, at world sizes 2 and 3): an element of all-reduce chunk k (ring::ar_chunk_*) is
  // combined as x[k+1], then x[k+2] (op) that, ..., then x[k] (op) that, scaled for AVG at that
  // last step. Every rank computes every element the same way: bit-identical on all ranks.
  // Piece j: send it to every peer, take piece j from every peer, combine, release the slots. A
  // rank sends piece j only after it consumed piece j-1 from every peer, and consuming never
  // waits on sending: no cycle, any slot count.
  const int64_t ce = ring::ar_chunk_elems(count, n, es);
  std::vector<const char*> src(n, nullptr);
  for (int64_t j = 0; j < np; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    const size_t bytes = m * es;
    for (int s = 1; s < n; ++s) send_copy(c, static_cast<int>(ring::mod(r + s, n)), in + o * es, bytes, wait_ctx(c, 0, 1));
    for (int p = 0; p < n; ++p) src[p] = (p == r) ? in + o * es : recv_expect(c, p, bytes, wait_ctx(c, 0, 1));
    for (int64_t a = o; a < o + m;) {
      const int k = static_cast<int>(std::min<int64_t>(a / ce, n - 1));
      const int64_t b = std::min<int64_t>(o + m, (k + 1) * ce);
      const size_t rel = static_cast<size_t>(a - o) * es;
      const size_t len = static_cast<size_t>(b - a);
      auto x = [&](int p) { return src[ring::mod(p, n)] + rel; };
      char* dst = out + a * es;
      if (n == 2) {
        reduce_cpu(dst, x(k), x(k + 1), len, c.dtype, op, scale);
      } else {
        reduce_cpu(c.scratch, x(k + 2), x(k + 1), len, c.dtype, op, 1.0);
        for (int t = 3; t < n; ++t) reduce_cpu(c.scratch, x(k + t), c.scratch, len, c.dtype, op, 1.0);
        reduce_cpu(dst, x(k), c.scratch, len, c.dtype, op, scale);
      }
      a = b;
    }
    for (int p = 0; p < n; ++p)
      if (p != r) c.t->recv_done(p, Lane::kColl);
  }
}

void direct_gather(const AlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  const int64_t pe = c.piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  if (r != root) {
    for (int64_t j = 0; j < np; ++j) {
      int64_t o, m;
      piece_bounds(0, count, j, pe, &o, &m);
      send_copy(c, root, in + o * es, m * es, wait_ctx(c, 0, 1));
    }
    return;
  }
  if (out + r * count * es != in) std::memmove(out + r * count * es, in, count * es);
  // Interleave the sources piece by piece so every sender streams at once.
  for (int64_t j = 0; j < np; ++j) {
    for (int s = 1; s < n; ++s) {
      const int src = static_cast<int>(ring::mod(root + s, n));
      int64_t o, m;
      piece_bounds(src * count, count, j, pe, &o, &m);
      const char* p = recv_expect(c, src, m * es, wait_ctx(c, 0, 1));
      std::memcpy(out + o * es, p, m * es);
      c.t->recv_done(src, Lane::kColl);
    }
  }
}

void direct_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  const int64_t pe = c.piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  if (r != root) {
    for (int64_t j = 0; j < np; ++j) {
      int64_t o, m;
      piece_bounds(0, count, j, pe, &o, &m);
      const char* p = recv_expect(c, root, m * es, wait_ctx(c, 0, 1));
      std::memcpy(out + o * es, p, m * es);
      c.t->recv_done(root, Lane::kColl);
    }
    return;
  }
  for (int64_t j = 0; j < np; ++j) {
    for (int s = 1; s < n; ++s) {
      const int dst = static_cast<int>(ring::mod(root + s, n));
      int64_t o, m;
      piece_bounds(dst * count, count, j, pe, &o, &m);
      send_copy(c, dst, in + o * es, m * es, wait_ctx(c, 0, 1));
    }
  }
  if (in + r * count * es != out) std::memmove(out, in + r * count * es, count * es);
}

}  // namespace rc
