// Recursive halving / doubling all-reduce: log-depth, bit-identical to the ring.
//
// Ranks: P = the largest power of two <= N, q = N - P. The q extra ranks P..N-1 fold into ranks
// 0..q-1 (rank P+i's partner is rank i); ranks 0..P-1 run the recursion. Chunks are the ring's
// all-reduce chunks (ring::ar_chunk_*), N of them; chunk k is combined by rank owner(k) = k for
// k < P and k - P (the partner of the extra rank k) above.
//
// Why raw inputs travel: the ring combines an element of chunk k as x[k+1], x[k+2] (op) that, ...,
// x[k] (op) that (combine_in_ring_order, algo/pieces.h). A halving that combined partial sums on
// the way would associate the operands differently, and floating-point sums, products and AVG
// would differ in their last bits from the ring's (and between world sizes). So the halving moves
// the contributions themselves: each step hands the partner every input this rank holds for the
// half of the chunks the partner's side owns, and after log2(P) steps rank v holds all N inputs
// of its own chunks and combines them in the ring's order. Every element is combined once, by
// its owner, exactly as the ring does: results are bit-identical to the ring's for every dtype
// and op. The price is traffic: each halving step moves about half of the message (the ring's
// reduce-scatter moves (N-1)/N of it in all), log2(P)/2 of the message instead of (N-1)/N.
//
// One iteration per unit j (the j-th far piece of every chunk):
//   fold-in    extra rank P+i -> rank i: unit j of every chunk of its input;
//   halving    masks d = P/2, ..., 1: rank v and v^d swap the units (of every source v holds)
//              of the chunks whose owner lies on the partner's side of bit d;
//   combine    rank v combines unit j of its own chunks from the N gathered inputs;
//   doubling   masks d = 1, ..., P/2: rank v and v^d swap the finished units of the chunks
//              owned by the ranks that agree with them above bit d;
//   fold-out   rank i -> extra rank P+i: unit j of every finished chunk.
// 2 log2(P) hand-offs (plus 2 when N is not a power of two) instead of the ring's 2(N-1).
//
// Each step with one partner is a stream of units packed back to back and cut into far slots,
// so a step of small units costs one slot, not one per unit. Both ends build a step's unit list
// from the same plan in the same order (sources ascending, then chunks ascending; empty units
// carry no bytes), so the streams agree byte for byte; each slot carries this collective's seq
// and its size, checked on receipt.
// Deadlock freedom with 2 slots per channel: within a step the two partners alternate one slot
// out, one slot in (as all_to_all does), and receiving never waits on sending. Every step pairs
// the ranks that run it by a matching and every rank runs the steps in the same order, so by
// induction over the steps each one starts with its channels drained and completes: a rank whose
// partner is still in an earlier step waits only for that partner's sends, which do not depend
// on it.
// In place (in == out): unit j of `in` is read (sent, forwarded, combined) only before the
// doubling and the fold-out write unit j of `out`; the combine writes each element after reading
// it (algo/pieces.h).
// Memory: the received inputs of one iteration are staged in the device's private staging memory
// (AlgoCtx::staging): about (N + (P/2) log2 P) units, far pieces each.
#include <algorithm>
#include <vector>

#include "algo/chunks.h"
#include "algo/pieces.h"
#include "algo/ring_schedule.h"

namespace rc {

namespace {

struct Unit {
  int src;    // whose input (halving, fold-in) or -1 (a finished unit of `out`)
  int chunk;
};

struct Step {
  int peer = -1;
  std::vector<Unit> send, recv;
};

int floor_pow2(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// The plan of rank r: its steps (fold-in, halving, doubling, fold-out), in order, and the chunks
// it combines. Pure arithmetic, equal on both ends of every step.
struct Plan {
  std::vector<Step> rs, ag;   // rs: fold-in + halving; ag: doubling + fold-out
  std::vector<int> owned;     // chunks this rank combines
  int nstaged = 0;            // units received into staging per iteration
};

Plan make_plan(int r, int n) {
  const int P = floor_pow2(n), q = n - P;
  auto owner = [&](int k) { return k < P ? k : k - P; };
  // The real ranks whose inputs the virtual ranks w = v (mod m), w in [0, P), hold: w and its extra.
  auto sources = [&](int v, int m) {
    std::vector<int> s;
    for (int w = v % m; w < P; w += m) {
      s.push_back(w);
      if (w < q) s.push_back(w + P);
    }
    std::sort(s.begin(), s.end());
    return s;
  };
  Plan plan;
  if (r >= P) {
    Step in, out;
    in.peer = out.peer = r - P;
    for (int k = 0; k < n; ++k) {
      in.send.push_back({r, k});
      out.recv.push_back({-1, k});
    }
    plan.rs.push_back(in);
    plan.ag.push_back(out);
    return plan;
  }
  const int v = r;
  if (v < q) {
    Step in;
    in.peer = v + P;
    for (int k = 0; k < n; ++k) in.recv.push_back({v + P, k});
    plan.rs.push_back(in);
  }
  // Halving: before the step with mask d, v holds the inputs of sources(v, 2d) (the ranks that
  // differ from v in bits 2d and above) for the chunks whose owner agrees with v in those bits.
  for (int d = P / 2; d >= 1; d /= 2) {
    Step st;
    st.peer = v ^ d;
    for (int s : sources(v, 2 * d))
      for (int k = 0; k < n; ++k)
        if (owner(k) / d == (v ^ d) / d) st.send.push_back({s, k});
    for (int s : sources(v ^ d, 2 * d))
      for (int k = 0; k < n; ++k)
        if (owner(k) / d == v / d) st.recv.push_back({s, k});
    plan.rs.push_back(st);
  }
  for (int k = 0; k < n; ++k)
    if (owner(k) == v) plan.owned.push_back(k);
  // Doubling: before the step with mask d, v holds the finished chunks whose owner agrees with v
  // in bits d and above.
  for (int d = 1; d < P; d *= 2) {
    Step st;
    st.peer = v ^ d;
    for (int k = 0; k < n; ++k) {
      if (owner(k) / d == v / d) st.send.push_back({-1, k});
      if (owner(k) / d == (v ^ d) / d) st.recv.push_back({-1, k});
    }
    plan.ag.push_back(st);
  }
  if (v < q) {
    Step out;
    out.peer = v + P;
    for (int k = 0; k < n; ++k) out.send.push_back({-1, k});
    plan.ag.push_back(out);
  }
  for (const Step& st : plan.rs) plan.nstaged += static_cast<int>(st.recv.size());
  return plan;
}

struct Seg {
  char* p;
  size_t bytes;
};

// One step with `peer`: the stream `out` (segments back to back) goes out cut into slots of `pb`
// bytes, the stream `in` arrives the same way; one slot out, then one in, alternating.
void exchange(const AlgoCtx& c, int peer, const std::vector<Seg>& out, const std::vector<Seg>& in, size_t pb,
              const WaitCtx& w) {
  size_t so = 0, si = 0;
  for (const Seg& s : out) so += s.bytes;
  for (const Seg& s : in) si += s.bytes;
  const size_t ns = (so + pb - 1) / pb, nr = (si + pb - 1) / pb;
  size_t oi = 0, ooff = 0, ii = 0, ioff = 0;  // the next byte of each stream: segment, offset
  for (size_t i = 0; i < std::max(ns, nr); ++i) {
    if (i < ns) {
      const size_t bytes = std::min(pb, so - i * pb);
      while (out[oi].bytes == ooff) ++oi, ooff = 0;
      char* dst = c.ch->send_slot(peer, w, PiecePlace{out[oi].p + ooff, -1, static_cast<int64_t>(bytes)});
      for (size_t done = 0; done < bytes;) {
        while (out[oi].bytes == ooff) ++oi, ooff = 0;
        const size_t take = std::min(bytes - done, out[oi].bytes - ooff);
        c.ch->copy_into_slot(dst + done, out[oi].p + ooff, take);
        done += take;
        ooff += take;
      }
      c.ch->send_post(peer, bytes, so, c.seq);
      if (c.trace) c.trace->slot_sent();
    }
    if (i < nr) {
      const size_t bytes = std::min(pb, si - i * pb);
      const SlotMeta* meta = nullptr;
      const char* p = c.ch->recv_slot(peer, w, PiecePlace{}, &meta);
      if (meta->tag != c.seq || meta->bytes != bytes || meta->total != si) {
        RC_THROW(Error, "ringcomm: " << c.op << " (seq " << c.seq << ") on rank " << c.rank << ": received a piece of "
                                     << meta->bytes << " bytes of " << meta->total << " tagged seq " << meta->tag
                                     << " from rank " << peer << " at step " << w.step << ", expected " << bytes
                                     << " bytes of " << si << " of seq " << c.seq << " (the ranks' schedules diverged)");
      }
      if (c.trace) c.trace->slot_received();
      for (size_t done = 0; done < bytes;) {
        while (in[ii].bytes == ioff) ++ii, ioff = 0;
        const size_t take = std::min(bytes - done, in[ii].bytes - ioff);
        c.ch->copy(in[ii].p + ioff, p + done, take);
        done += take;
        ioff += take;
      }
      c.ch->recv_done(peer);
    }
  }
}

}  // namespace

HalvingDoublingWork halving_doubling_work(int rank, int world) {
  const Plan plan = make_plan(rank, world);
  HalvingDoublingWork w;
  for (const auto* steps : {&plan.rs, &plan.ag}) {
    for (const Step& st : *steps) {
      ++w.steps;
      w.sent += static_cast<int64_t>(st.send.size());
      w.received += static_cast<int64_t>(st.recv.size());
    }
  }
  w.combined = static_cast<int64_t>(plan.owned.size());
  return w;
}

void halving_doubling_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  RC_CHECK(c.staging != nullptr && (n == 2 || c.scratch != nullptr), Unsupported,
           "ringcomm: the halving_doubling all_reduce needs the channel's private staging and scratch memory");
  const Plan plan = make_plan(r, n);
  const int64_t u = c.far_piece_elems();
  const size_t pb = c.ch->far_piece_bytes();
  const Chunks chunks = all_reduce_chunks(count, n, es);
  const std::vector<int64_t>& off = chunks.off;
  const std::vector<int64_t>& cnt = chunks.cnt;
  const int64_t max_cnt = chunks.max_cnt;
  // Staging: one unit-sized place per received input unit, the same places every iteration.
  const size_t unit_bytes = static_cast<size_t>(u) * es;
  if (c.staging->size() < plan.nstaged * unit_bytes) c.staging->resize(plan.nstaged * unit_bytes);
  std::vector<char*> stage(static_cast<size_t>(n) * n, nullptr);  // [src * n + chunk]
  {
    size_t next = 0;
    for (const Step& st : plan.rs)
      for (const Unit& x : st.recv) stage[static_cast<size_t>(x.src) * n + x.chunk] = c.staging->data() + unit_bytes * next++;
  }
  const int nsteps = static_cast<int>(plan.rs.size() + plan.ag.size());
  const int64_t iters = (max_cnt + u - 1) / u;
  std::vector<Seg> sseg, rseg;
  std::vector<const char*> src(n, nullptr);
  for (int64_t j = 0; j < iters; ++j) {
    int64_t o = 0, m = 0;
    // Where unit j of chunk k of rank s's input lives on this rank, and its bytes.
    auto input_seg = [&](const Unit& x) {
      piece_bounds(off[x.chunk], cnt[x.chunk], j, u, &o, &m);
      char* p = x.src == r ? const_cast<char*>(in) + o * es : stage[static_cast<size_t>(x.src) * n + x.chunk];
      return Seg{p, static_cast<size_t>(m) * es};
    };
    auto output_seg = [&](const Unit& x) {
      piece_bounds(off[x.chunk], cnt[x.chunk], j, u, &o, &m);
      return Seg{out + o * es, static_cast<size_t>(m) * es};
    };
    // Each step's send and receive units, as segments (seg_of), exchanged with its peer; the
    // steps are numbered across both phases.
    int step = 0;
    auto exchange_steps = [&](const std::vector<Step>& steps, const auto& seg_of) {
      for (const Step& st : steps) {
        sseg.clear();
        rseg.clear();
        for (const Unit& x : st.send) sseg.push_back(seg_of(x));
        for (const Unit& x : st.recv) rseg.push_back(seg_of(x));
        exchange(c, st.peer, sseg, rseg, pb, wait_ctx(c, step++, nsteps));
      }
    };
    exchange_steps(plan.rs, input_seg);
    for (int k : plan.owned) {
      piece_bounds(off[k], cnt[k], j, u, &o, &m);
      if (m == 0) continue;
      for (int p = 0; p < n; ++p) src[p] = p == r ? in + o * es : stage[static_cast<size_t>(p) * n + k];
      combine_in_ring_order(c, src.data(), out, o, m, count, op, c.scratch);
    }
    exchange_steps(plan.ag, output_seg);
  }
}

}  // namespace rc
