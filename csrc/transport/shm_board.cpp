// The header board and the LL outboxes beside it (transport/shm_board.h).
#include "transport/shm_board.h"

#include <cstring>

#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmBoard::ShmBoard(int rank, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits)
    : rank_(rank), segs_(segs), waits_(waits), ll_lines_(ll_lines(cfg)) {}

void ShmBoard::post(uint64_t seq, const HeaderBlob& h) {
  const uint32_t bs = board_seq_of(seq);
  BoardEntry& e = segs_.header(rank_)->board[bs & 1u];
  e.h = h;
  e.seq.v.store(bs, std::memory_order_seq_cst);
  if (e.seq.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&e.seq.v);
  posted_.fetch_add(1, std::memory_order_relaxed);
}

void ShmBoard::mark_fused(uint64_t call_seq) {
  SegmentHeader* h = segs_.header(rank_);
  h->fused_seq.store(call_seq, std::memory_order_seq_cst);
  // A sleeper on either entry re-reads the fused word (seq_cst against its `waiters` increment;
  // a wake-up missed between its check and its sleep is caught at its next slice).
  for (BoardEntry& e : h->board) {
    if (e.seq.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&e.seq.v);
  }
}

HeaderBlob ShmBoard::wait(int peer, uint64_t seq, const WaitCtx& w, bool* ll, uint64_t fused_from, bool* fused) {
  const uint32_t bs = board_seq_of(seq);
  SegmentHeader* ph = segs_.header(peer);
  BoardEntry& e = ph->board[bs & 1u];
  if (fused) *fused = false;
  const LLLine& line0 = ll_outbox(peer, seq)[0];
  auto ll_ready = [&] { return line0.flag.load(std::memory_order_acquire) == seq; };
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "the collective's header (did every rank call the same collective?)";
  // The board word is the futex word: a rank that wrote its outbox posts its board right after,
  // so a sleeper is woken either way; line 0 lets a spinning reader start one publication sooner.
  // The fused word first, then the entry (shm_board.h): a fused sequence >= fused_from seen with
  // the entry still not holding `seq` means the peer skipped this exchange.
  auto skipped = [&] {
    if (fused_from == 0 || ph->fused_seq.load(std::memory_order_seq_cst) < fused_from) return false;
    return !ll_ready() && e.seq.v.load(std::memory_order_acquire) != bs;
  };
  waits_.until(&e.seq.v, &e.seq.waiters,
               [&] { return skipped() || ll_ready() || e.seq.v.load(std::memory_order_acquire) == bs; }, ww);
  if (skipped()) {
    if (fused) *fused = true;
    if (ll) *ll = false;
    return HeaderBlob{};
  }
  // The board's release of bs came after every line the poster wrote for seq: line 0 is current
  // now iff the poster wrote its outbox for seq.
  const bool from_ll = ll_ready();
  if (ll) *ll = from_ll;
  if (!from_ll) return e.h;
  HeaderBlob h;
  std::memcpy(h.bytes, line0.payload, kHeaderBytes);
  return h;
}

LLLine* ShmBoard::ll_outbox(int owner, uint64_t seq) const {
  return reinterpret_cast<LLLine*>(segs_.base(owner) + ll_offset()) + (board_seq_of(seq) & 1u) * ll_lines_;
}

void ShmBoard::wait_line_or_header(int peer, uint64_t seq, const std::atomic<uint64_t>& flag, const WaitCtx& w) {
  const uint32_t bs = board_seq_of(seq);
  BoardEntry& e = segs_.header(peer)->board[bs & 1u];
  WaitCtx ww = w;
  ww.peer = peer;
  waits_.until(&e.seq.v, &e.seq.waiters,
               [&] { return flag.load(std::memory_order_acquire) == seq || e.seq.v.load(std::memory_order_acquire) == bs; },
               ww);
}

}  // namespace rc
