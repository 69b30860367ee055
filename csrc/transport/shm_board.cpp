// The header board (shm.h, "Header board") and the LL outbox region beside it: where a rank
// posts its collective header, how a peer waits for it (from the board, or from line 0 of the
// poster's outbox), and the outbox lines the LL protocol (proto/ll.h) writes and reads.
#include "transport/shm.h"

#include <cstring>

#include "common/errors.h"
#include "transport/shm_layout.h"
#include "transport/shm_wait.h"

namespace rc {

using namespace shm_detail;

void ShmTransport::post_header(uint64_t seq, const CollHeader& h) {
  const uint32_t bs = board_seq_of(seq);
  auto* sh = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  BoardEntry& e = sh->board[bs & 1u];
  e.h = h;
  e.seq.v.store(bs, std::memory_order_seq_cst);
  if (e.seq.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&e.seq.v);
}

CollHeader ShmTransport::wait_header(int peer, uint64_t seq, const WaitCtx& w, bool* ll) {
  const uint32_t bs = board_seq_of(seq);
  auto* sh = reinterpret_cast<SegmentHeader*>(base_[peer]);
  BoardEntry& e = sh->board[bs & 1u];
  const LLLine& line0 = ll_outbox(peer, seq)[0];
  auto ll_ready = [&] { return line0.flag.load(std::memory_order_acquire) == seq; };
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "the collective's header (did every rank call the same collective?)";
  // The board word is the futex word: a rank that wrote its outbox posts its board right after,
  // so a sleeper is woken either way; line 0 lets a spinning reader start one publication sooner.
  wait_until(&e.seq.v, &e.seq.waiters,
             [&] { return ll_ready() || e.seq.v.load(std::memory_order_acquire) == bs; }, ww);
  // The board's release of bs came after every line the poster wrote for seq: line 0 is current
  // now iff the poster wrote its outbox for seq.
  const bool from_ll = ll_ready();
  if (ll) *ll = from_ll;
  if (!from_ll) return e.h;
  CollHeader h;
  std::memcpy(&h, line0.payload, sizeof(h));
  return h;
}

LLLine* ShmTransport::ll_outbox(int owner, uint64_t seq) const {
  return reinterpret_cast<LLLine*>(base_[owner] + ll_offset()) + (board_seq_of(seq) & 1u) * ll_lines_;
}

void ShmTransport::wait_line_or_header(int peer, uint64_t seq, const std::atomic<uint64_t>& flag, const WaitCtx& w) {
  const uint32_t bs = board_seq_of(seq);
  BoardEntry& e = reinterpret_cast<SegmentHeader*>(base_[peer])->board[bs & 1u];
  WaitCtx ww = w;
  ww.peer = peer;
  wait_until(&e.seq.v, &e.seq.waiters,
             [&] { return flag.load(std::memory_order_acquire) == seq || e.seq.v.load(std::memory_order_acquire) == bs; },
             ww);
}

}  // namespace rc
