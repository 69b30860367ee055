// Direct exchanges: all-to-all, gather, scatter, and the direct all-reduce; one implementation
// for every transport. Each pair of ranks uses its own channel; the two ends of a message place
// it at different offsets of their buffers, so pieces carry no common offset (place -1). Pieces
// have the far geometry's size (Channel::far_piece_bytes), which every channel carries.
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
  copy_elems(c, out + recv_offs[r] * es, in + send_offs[r] * es, send_counts[r]);
  const int64_t pe = c.far_piece_elems();
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
        send_copy(c, dst, in + o * es, -1, m, w, send_total);
      }
      if (j < nr) {
        const SlotMeta* meta = nullptr;
        WaitCtx wr = w;
        const char* p = c.ch->recv_slot(src, wr, PiecePlace{}, &meta);
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
        copy_elems(c, out + o * es, p, m);
        c.ch->recv_done(src);
      }
    }
  }
}

void direct_send_first(const AlgoCtx& c, const char* in, int64_t count) {
  const int n = c.world, r = c.rank;
  if (count == 0 || n == 1) return;
  int64_t o, m;
  piece_bounds(0, count, 0, c.far_piece_elems(), &o, &m);
  for (int s = 1; s < n; ++s) send_copy(c, static_cast<int>(ring::mod(r + s, n)), in + o * c.esize, o, m, wait_ctx(c, 0, 1));
}

void combine_in_ring_order(const AlgoCtx& c, const char* const* src, char* out, int64_t o, int64_t m,
                           int64_t count, ReduceOp op, char* acc) {
  const int n = c.world;
  const size_t es = c.esize;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  const int64_t ce = ring::ar_chunk_elems(count, n, es);
  for (int64_t a = o; a < o + m;) {
    const int k = static_cast<int>(std::min<int64_t>(a / ce, n - 1));
    const int64_t b = std::min<int64_t>(o + m, (k + 1) * ce);
    const size_t rel = static_cast<size_t>(a - o) * es;
    const size_t len = static_cast<size_t>(b - a);
    auto x = [&](int p) { return src[ring::mod(p, n)] + rel; };
    char* dst = out + a * es;
    if (n == 2) {
      c.ch->reduce(dst, x(k), x(k + 1), len, c.dtype, op, scale);
    } else {
      char* at = acc + rel;
      c.ch->reduce(at, x(k + 2), x(k + 1), len, c.dtype, op, 1.0);
      for (int t = 3; t < n; ++t) c.ch->reduce(at, x(k + t), at, len, c.dtype, op, 1.0);
      c.ch->reduce(dst, x(k), at, len, c.dtype, op, scale);
    }
    a = b;
  }
}

void direct_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, bool first_sent) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  if (n == 1) return copy_elems(c, out, in, count);
  RC_CHECK(n == 2 || c.scratch != nullptr, Unsupported,
           "ringcomm: the direct all_reduce with more than 2 ranks needs the channel's scratch memory");
  const int64_t pe = c.far_piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  // Piece j: send it to every peer, take piece j from every peer, combine (in the ring's order,
  // combine_in_ring_order), release the slots. A rank sends piece j only after it consumed
  // piece j-1 from every peer, and consuming never waits on sending: no cycle, any slot count.
  // With first_sent, piece 0 went out before the header exchange (direct_send_first, the same
  // sends in the same order).
  std::vector<const char*> src(n, nullptr);
  for (int64_t j = 0; j < np; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    if (j > 0 || !first_sent) {
      for (int s = 1; s < n; ++s) send_copy(c, static_cast<int>(ring::mod(r + s, n)), in + o * es, o, m, wait_ctx(c, 0, 1));
    }
    for (int p = 0; p < n; ++p) src[p] = (p == r) ? in + o * es : recv_expect(c, p, o, m, wait_ctx(c, 0, 1));
    // The accumulator (3+ ranks) is the scratch, one piece; it starts at the piece's element o.
    combine_in_ring_order(c, src.data(), out, o, m, count, op, c.scratch);
    for (int p = 0; p < n; ++p)
      if (p != r) c.ch->recv_done(p);
  }
}

void direct_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root, bool first_sent) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0 || n == 1) return;
  const int64_t pe = c.far_piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  // The root sends piece j to every peer, in the order direct_send_first does for piece 0; a
  // peer consumes the root's pieces in order. Nothing waits on the root's receiving: no cycle.
  for (int64_t j = 0; j < np; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    if (r == root) {
      if (j > 0 || !first_sent) {
        for (int s = 1; s < n; ++s) send_copy(c, static_cast<int>(ring::mod(r + s, n)), buf + o * es, o, m, wait_ctx(c, 0, 1));
      }
    } else {
      copy_elems(c, buf + o * es, recv_expect(c, root, o, m, wait_ctx(c, 0, 1)), m);
      c.ch->recv_done(root);
    }
  }
}

namespace {

// Gather (kGather) and scatter: each non-root rank exchanges its `count` elements with the root,
// piece by piece; the root exchanges block p of its full buffer with every rank p, interleaving
// the peers piece by piece so that every peer streams at once. Pieces flow to the root in a
// gather and from it in a scatter; the root's own block is copied locally (a gather copies it
// first, a scatter after its sends, so that the peers start sooner).
template <bool kGather>
void direct_rooted(const AlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  if (count == 0) return;
  const int64_t pe = c.far_piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  const bool sends = kGather == (r != root);
  // Piece j of the block that starts at element `base` of this rank's in (sending) or out.
  auto piece = [&](int peer, int64_t base, int64_t j) {
    int64_t o, m;
    piece_bounds(base, count, j, pe, &o, &m);
    if (sends) {
      send_copy(c, peer, in + o * es, -1, m, wait_ctx(c, 0, 1));
    } else {
      const char* p = recv_expect(c, peer, -1, m, wait_ctx(c, 0, 1));
      copy_elems(c, out + o * es, p, m);
      c.ch->recv_done(peer);
    }
  };
  if (r != root) {
    for (int64_t j = 0; j < np; ++j) piece(root, 0, j);
    return;
  }
  if (kGather) copy_elems(c, out + r * count * es, in, count);
  for (int64_t j = 0; j < np; ++j) {
    for (int s = 1; s < n; ++s) {
      const int peer = static_cast<int>(ring::mod(root + s, n));
      piece(peer, peer * count, j);
    }
  }
  if (!kGather) copy_elems(c, out, in + r * count * es, count);
}

}  // namespace

void direct_gather(const AlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  direct_rooted<true>(c, in, out, count, root);
}

void direct_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, int root) {
  direct_rooted<false>(c, in, out, count, root);
}

}  // namespace rc
