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
}

HeaderBlob ShmBoard::wait(int peer, uint64_t seq, const WaitCtx& w, bool* ll) {
  const uint32_t bs = board_seq_of(seq);
  BoardEntry& e = segs_.header(peer)->board[bs & 1u];
  const LLLine& line0 = ll_outbox(peer, seq)[0];
  auto ll_ready = [&] { return line0.flag.load(std::memory_order_acquire) == seq; };
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "the collective's header (did every rank call the same collective?)";
  // The board word is the futex word: a rank that wrote its outbox posts its board right after,
  // so a sleeper is woken either way; line 0 lets a spinning reader start one publication sooner.
  waits_.until(&e.seq.v, &e.seq.waiters,
               [&] { return ll_ready() || e.seq.v.load(std::memory_order_acquire) == bs; }, ww);
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
