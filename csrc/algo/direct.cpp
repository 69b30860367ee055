// Direct exchanges: all-to-all, gather, scatter, and the direct (one-shot and two-shot)
// all-reduces; one implementation for every transport. Messages between two ranks arrive in the
// order sent, over a per-pair channel or the sender's outbox, whose slots all its receivers
// share (transport/shm_outbox.h): so no algorithm here sends many messages before it
// receives any, except where its receivers read them without waiting on anything (the one-shot's,
// broadcast's, gather's and scatter's pieces, read in order); a message for every peer is written
// once where the channel allows (send_copy_all);
// in the exchanges the two ends of a message place it at different offsets of their buffers, so
// pieces carry no common offset (place -1); the all-reduces' pieces sit at the same offset of
// both ends' full buffers. Pieces have the far geometry's size (Channel::far_piece_bytes), which
// every channel carries.
// all-to-all runs N-1 rounds; in round s rank r sends to r+s and receives from r-s, alternating
// one piece out and one piece in: the message a rank sends at (round s, piece j) is read by its
// receiver at the same (s, j), so two_shot_all_reduce's argument applies (the least rank always
// moves; a shared outbox needs 2 slots).
// Every all-to-all message carries its total size in its first slot (an empty block is one
// empty slot), so a receiver whose expected size differs detects it instead of misreading.
// Round 1's messages go to the ring successor, whose channel carries the ring's slots
// (Channel::piece_bytes, at least the far size): a large block travels there in pieces of a
// 32nd of the block, between the far and the ring piece size, so that it takes fewer
// hand-offs and still pipelines through the slots; every other round uses far pieces. Both ends
// compute the piece from the block's size, which they agree on (or the first slot's total
// raises). At 2 ranks round 1 is the whole exchange.
#include <algorithm>
#include <string>
#include <vector>

#include "algo/chunks.h"
#include "algo/pieces.h"
#include "algo/ring_schedule.h"

namespace rc {

namespace {

int64_t npieces_of(int64_t count, int64_t pe) { return count == 0 ? 1 : (count + pe - 1) / pe; }

// The all-to-all's piece of round s for a block of `block` elements. Round 1: a 32nd of the
// block, between the far and the ring piece size (see above).
int64_t a2a_round_piece(const AlgoCtx& c, int s, int64_t block) {
  const int64_t far = c.far_piece_elems();
  return s == 1 ? std::max(far, std::min(c.piece_elems(), block / 32)) : far;
}

}  // namespace

// The ring's order of operations for elements of all-reduce chunk k (ring::ar_chunk_*), so that
// every all-reduce algorithm gives bit-identical results (and gloo's, at world sizes 2 and 3):
// the element is combined as x[k+1], then x[k+2] (op) that, ..., then x[k] (op) that, scaled for
// AVG at that last step. src[p] + rel is rank p's contribution to the `len` elements. dst is
// written only by the last step, which reads it elementwise (the reduce kernels allow dst equal to
// an input), so dst may be any contribution's own memory (in place). With 3 or more ranks the
// partial results live in `acc` (len elements of private memory).
void combine_chunk_in_ring_order(const AlgoCtx& c, char* dst, const char* const* src, size_t rel, int k, size_t len,
                                 ReduceOp op, char* acc) {
  const int n = c.world;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  auto x = [&](int p) { return src[ring::mod(p, n)] + rel; };
  if (n == 2) {
    c.ch->reduce(dst, x(k), x(k + 1), len, c.dtype, op, scale);
    return;
  }
  c.ch->reduce(acc, x(k + 2), x(k + 1), len, c.dtype, op, 1.0);
  for (int t = 3; t < n; ++t) c.ch->reduce(acc, x(k + t), acc, len, c.dtype, op, 1.0);
  c.ch->reduce(dst, x(k), acc, len, c.dtype, op, scale);
}

void combine_in_ring_order(const AlgoCtx& c, const char* const* src, char* out, int64_t o, int64_t m,
                           int64_t count, ReduceOp op, char* acc) {
  const int n = c.world;
  const size_t es = c.esize;
  const int64_t ce = ring::ar_chunk_elems(count, n, es);
  for (int64_t a = o; a < o + m;) {
    const int k = static_cast<int>(std::min<int64_t>(a / ce, n - 1));
    const int64_t b = std::min<int64_t>(o + m, (k + 1) * ce);
    combine_chunk_in_ring_order(c, out + a * es, src, static_cast<size_t>(a - o) * es, k,
                                static_cast<size_t>(b - a), op, acc);
    a = b;
  }
}

void direct_all_to_all(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& send_offs, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& recv_offs) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(send_counts[r] == recv_counts[r], Mismatch,
           "ringcomm: all_to_all on rank " << r << ": sends " << send_counts[r] << " elements to itself but expects "
                                           << recv_counts[r]);
  copy_elems(c, out + recv_offs[r] * es, in + send_offs[r] * es, send_counts[r]);
  auto round_piece = [&](int s, int64_t block) { return a2a_round_piece(c, s, block); };
  for (int s = 1; s < n; ++s) {
    const int dst = static_cast<int>(ring::mod(r + s, n));
    const int src = static_cast<int>(ring::mod(r - s, n));
    const int64_t pe_s = round_piece(s, send_counts[dst]), pe_r = round_piece(s, recv_counts[src]);
    const int64_t ns = npieces_of(send_counts[dst], pe_s), nr = npieces_of(recv_counts[src], pe_r);
    const uint64_t send_total = static_cast<uint64_t>(send_counts[dst]) * es;
    for (int64_t j = 0; j < std::max(ns, nr); ++j) {
      WaitCtx w = wait_ctx(c, s - 1, n - 1);
      if (j < ns) {
        int64_t o, m;
        piece_bounds(send_offs[dst], send_counts[dst], j, pe_s, &o, &m);
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
        piece_bounds(recv_offs[src], recv_counts[src], j, pe_r, &o, &m);
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
  const int n = c.world;
  if (count == 0 || n == 1) return;
  int64_t o, m;
  piece_bounds(0, count, 0, c.far_piece_elems(), &o, &m);
  send_copy_all(c, in + o * c.esize, o, m, wait_ctx(c, 0, 1));
}

void direct_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, bool first_sent) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(n == 2 || c.scratch != nullptr, Unsupported,
           "ringcomm: the direct all_reduce with more than 2 ranks needs the channel's scratch memory");
  const int64_t pe = c.far_piece_elems();
  const int64_t np = (count + pe - 1) / pe;
  // Every rank combines every element in the ring's order (combine_in_ring_order): results are
  // bit-identical on all ranks and to the ring's.
  // Piece j: send it to every peer, take piece j from every peer, combine, release the slots. A
  // rank sends piece j only after it consumed piece j-1 from every peer, and consuming never
  // waits on sending: no cycle, any slot count. With first_sent, piece 0 went out before the
  // header exchange (direct_send_first, the same sends in the same order).
  std::vector<const char*> src(n, nullptr);
  for (int64_t j = 0; j < np; ++j) {
    int64_t o, m;
    piece_bounds(0, count, j, pe, &o, &m);
    if (j > 0 || !first_sent) send_copy_all(c, in + o * es, o, m, wait_ctx(c, 0, 1));
    for (int p = 0; p < n; ++p) src[p] = (p == r) ? in + o * es : recv_expect(c, p, o, m, wait_ctx(c, 0, 1));
    // The accumulator (3+ ranks) is the scratch, one piece.
    combine_in_ring_order(c, src.data(), out, o, m, count, op, c.scratch);
    for (int p = 0; p < n; ++p)
      if (p != r) c.ch->recv_done(p);
  }
}

// Two-shot: a direct reduce-scatter over the all-reduce chunks (ring::ar_chunk_*), then a direct
// all-gather of the reduced chunks. Rank k owns chunk k, as in the ring (the rank that combines
// chunk k last), and combines it in the ring's order: bit-identical to the ring and the one-shot.
// Per phase each rank copies (N-1)/N of the message into slots, and it combines only its own
// chunk (N-1 reductions of 1/N of the message): the ring's traffic, in two hand-offs instead of
// the ring's 2(N-1); the one-shot copies and combines the whole message N-1 times.
//
// Iteration j handles piece j (far pieces, Channel::far_piece_bytes) of every chunk:
//   phase 1 (step 0), in rounds t = 1..N-1: send piece j of chunk r-t of `in` to rank r-t, and
//     take piece j of chunk r from rank r+t: the ring's order of combination (x[r+1], x[r+2], ...,
//     x[r] last), so each piece is combined into the private accumulator as it arrives and its
//     slot released (round 1's at round 2); the round-t message of rank q is read by rank q-t in
//     ITS round t. Sends run ahead of the rounds while a slot is free at once (try_send_slot):
//     with enough slots every send leaves before the first receive, as a plain send-all would;
//   phase 2 (step 1): send the reduced piece to every peer (send_copy_all: one slot where the
//     channel shares it); take piece j of chunk p from every peer p into `out`.
// A message exists only for a non-empty piece (chunks may be empty when count < world, and the
// last non-empty chunk may be shorter); both ends compute the same pieces from the same chunk
// bounds and skip the same empty ones; messages between two ranks are consumed in the order sent.
// Deadlock freedom, on per-pair channels and on a shared outbox (transport/shm.h) alike, with 2
// or more slots: order every rank's steps by (collective, iteration, phase, round, send before
// receive); a step that blocks is a blocking send (only the round's own send blocks: sends
// leave in round order, so when round t's send blocks no later one has left) or a receive. Take
// a rank whose next step is least. Everything it sent earlier was sent at an earlier step and
// has been read by its receiver, who is at a later step and reads each message at the step it
// was sent; all of it is released but at most one round-1 message held for its reader's round
// 2: a slot is free, so its send completes. Its receive of round t (or of phase 2) awaits a
// message its peer sends at the same step, before its own receive: the peer, at a step not
// less, has sent it, or is at that send itself and completes it. So the least rank always moves.
// In place (in == out): piece j of chunk p != r of `in` is sent (phase 1) before P2_j overwrites it
// (phase 2 of the same iteration), and chunk r is read only by this rank's own combine, which
// writes each element after reading it.
namespace {

// Phase 1 of the two-shot and the whole direct reduce-scatter, for piece j of every chunk of
// `ch`: the rounds described above two_shot_all_reduce; the finished piece of chunk r goes to
// own + (o - ch.off[r]) (o: its full-buffer offset). With first_sent, round 1's message of
// piece 0 went out before the header (direct_reduce_scatter_send_first) and exists even when
// empty, so that its reader always takes exactly that one slot, as drain_in_slot does.
void rs_direct_piece(const AlgoCtx& c, const Chunks& ch, const char* in, char* own, int64_t j, int64_t pe,
                     ReduceOp op, const WaitCtx& w1, bool first_sent) {
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  const double scale = (op == ReduceOp::kAvg) ? 1.0 / n : 1.0;
  // Round t's send (chunk r-t's piece j to rank r-t); blocking, or only if a slot is free now.
  auto p1_send = [&](int t, bool block) {
    const int p = static_cast<int>(ring::mod(r - t, n));
    int64_t o, m;
    piece_bounds(ch.off[p], ch.cnt[p], j, pe, &o, &m);
    if (m == 0) return true;
    if (block) {
      send_copy(c, p, in + o * es, o, m, w1);
      return true;
    }
    char* dst = c.ch->try_send_slot(p, place(c, in + o * es, o, m));
    if (dst == nullptr) return false;
    c.ch->copy_into_slot(dst, in + o * es, static_cast<size_t>(m) * es);
    c.ch->send_post(p, static_cast<uint64_t>(m) * es, 0, c.seq);
    if (c.trace) c.trace->slot_sent();
    return true;
  };
  const bool round1_sent = first_sent && j == 0;
  int sent = round1_sent ? 1 : 0;  // rounds whose send is done
  auto send_ahead = [&] {
    while (sent < n - 1 && p1_send(sent + 1, false)) ++sent;
  };
  int64_t o, m;
  piece_bounds(ch.off[r], ch.cnt[r], j, pe, &o, &m);
  char* fin = own + (o - ch.off[r]) * static_cast<int64_t>(es);
  send_ahead();
  const char* first = nullptr;  // round 1's piece, combined at round 2
  for (int t = 1; t < n; ++t) {
    if (sent < t) {
      p1_send(t, true);
      sent = t;
      send_ahead();
    }
    const int q = static_cast<int>(ring::mod(r + t, n));
    if (m == 0) {
      if (round1_sent && t == 1) {  // the empty message sent before the header
        recv_expect(c, q, o, 0, w1);
        c.ch->recv_done(q);
      }
      continue;
    }
    const char* x = recv_expect(c, q, o, m, w1);
    const size_t len = static_cast<size_t>(m);
    if (n == 2) {  // x[r] (op) x[r+1]: the last and only step
      c.ch->reduce(fin, in + o * es, x, len, c.dtype, op, scale);
      c.ch->recv_done(q);
    } else if (t == 1) {
      first = x;
    } else {
      if (t == 2) {
        c.ch->reduce(c.scratch, x, first, len, c.dtype, op, 1.0);
        c.ch->recv_done(static_cast<int>(ring::mod(r + 1, n)));
      } else {
        c.ch->reduce(c.scratch, x, c.scratch, len, c.dtype, op, 1.0);
      }
      c.ch->recv_done(q);
    }
  }
  if (m > 0 && n > 2) c.ch->reduce(fin, in + o * es, c.scratch, static_cast<size_t>(m), c.dtype, op, scale);
}

}  // namespace

void two_shot_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(n == 2 || c.scratch != nullptr, Unsupported,
           "ringcomm: the two-shot all_reduce with more than 2 ranks needs the channel's scratch memory");
  const int64_t pe = c.far_piece_elems();
  const Chunks chunks = all_reduce_chunks(count, n, es);
  const std::vector<int64_t>& off = chunks.off;
  const std::vector<int64_t>& cnt = chunks.cnt;
  const int64_t np = (chunks.max_cnt + pe - 1) / pe;
  for (int64_t j = 0; j < np; ++j) {
    const WaitCtx w1 = wait_ctx(c, 0, 2), w2 = wait_ctx(c, 1, 2);
    rs_direct_piece(c, chunks, in, out + off[r] * es, j, pe, op, w1, /*first_sent=*/false);
    int64_t o, m;
    piece_bounds(off[r], cnt[r], j, pe, &o, &m);
    if (m > 0) send_copy_all(c, out + o * es, o, m, w2);
    for (int s = 1; s < n; ++s) {
      const int p = static_cast<int>(ring::mod(r - s, n));
      piece_bounds(off[p], cnt[p], j, pe, &o, &m);
      if (m == 0) continue;
      copy_elems(c, out + o * es, recv_expect(c, p, o, m, w2), m);
      c.ch->recv_done(p);
    }
  }
}

void direct_reduce_scatter_send_first(const AlgoCtx& c, const char* in, int64_t count) {
  const int n = c.world;
  if (count == 0 || n == 1) return;
  const int p = ring::left(c.rank, n);
  int64_t o, m;
  piece_bounds(ring::chunk_offset(count, n, p), ring::chunk_count(count, n, p), 0, c.far_piece_elems(), &o, &m);
  send_copy(c, p, in + o * c.esize, o, m, wait_ctx(c, 0, 1));
}

void direct_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op,
                           bool first_sent) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world;
  if (n == 1 || count == 0) return copy_elems(c, out, in, count);
  RC_CHECK(n == 2 || c.scratch != nullptr, Unsupported,
           "ringcomm: the direct reduce_scatter with more than 2 ranks needs the channel's scratch memory");
  const Chunks chunks = balanced_chunks(count, n);
  const int64_t pe = c.far_piece_elems();
  const int64_t np = (chunks.max_cnt + pe - 1) / pe;
  for (int64_t j = 0; j < np; ++j) rs_direct_piece(c, chunks, in, out, j, pe, op, wait_ctx(c, 0, 1), first_sent);
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
      if (j > 0 || !first_sent) send_copy_all(c, buf + o * es, o, m, wait_ctx(c, 0, 1));
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
