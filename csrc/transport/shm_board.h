// The header board and the low-latency (LL) outboxes beside it, in each segment's first pages.
//
// Header board: before each collective every rank writes its header (kHeaderBytes, opaque here:
// comm/coll_header.h) to board[w & 1] of its OWN segment, w = board_seq_of(seq), then stores w in
// that entry's word (seq_cst, then a futex wake if a reader sleeps on it); every rank reads every
// peer's header after loading the word equal to w (acquire). Only the owner writes its board. Two
// entries suffice: a rank can only write the entry for seq+2 after it has read every peer's header
// for seq+1, which every peer posts only after finishing its reads of seq.
//
// LL outboxes: beside the board, every segment holds two outboxes (by the parity of the board's
// word, like the board entries) of 64-byte lines (LLLine: 56 payload bytes and an 8-byte flag). A
// rank writes a small collective's header and data into its OWN outbox (the LL protocol,
// proto/ll.h: payload first, then the line's flag = the collective's 64-bit sequence number with
// release) before it posts the header on the board; every peer reads the lines from the owner's
// segment (one copy however many readers: pull, not push). A reader that sees a line's flag equal
// to the sequence (acquire) sees that line's payload: data and flag travel in one cache line, and
// no head, meta or tail word is exchanged. The header is the payload's first bytes (line 0), so
// wait() returns it from line 0 as soon as line 0 is there, without the board. Flags are never
// cleared: a line is current iff its flag equals the sequence. Reuse is safe without
// acknowledgement, by the board's argument: a rank writes outbox[s % 2] for collective s+2 only
// after it finished s+1, which needs every peer's header for s+1, which every peer posts only after
// finishing its reads of s.
//
// Calls without a header exchange (a device that runs a collective as one fused launch, decided
// by every rank from its own call: comm/device.h): they post nothing, and on such a device the
// board is indexed by the exchanges' own count, not by the collective sequence (elsewhere the two
// are equal; comm/core.cpp). Every rank's exchanges pair up when every rank decides alike, so the
// two-entry argument above holds over the exchanges. Such a call stores its collective sequence
// in the owner's fused word instead (mark_fused: a local store, no wait). A peer that waits for
// this rank's header of an exchange at collective sequence t, and sees the fused word >= t while
// the entry does not hold the exchange, knows that this rank ran collective t (or a later one)
// without posting it: the ranks routed the same call differently (wait()'s *fused). The fused
// word is loaded before the entry's word: the owner stores a fused sequence > t only after it
// posted the exchange at t, so a reader that sees it sees that post too (no false alarm).
//
// Threading: post() and the owner's LL writes run on the thread executing the collective (one at a
// time per rank); wait() and wait_line_or_header() on that thread too.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shm_config.h"
#include "transport/shm_segments.h"
#include "transport/shm_types.h"
#include "transport/shm_wait.h"

namespace rc {

class ShmBoard {
 public:
  /// `cfg`, `segs` and `waits` are the transport's: they outlive this part.
  ShmBoard(int rank, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits);

  /// Post this rank's header for collective `seq` (>= 1) on its board (after its LL lines, if any).
  void post(uint64_t seq, const HeaderBlob& h);
  /// `peer`'s header for collective `seq`: from line 0 of its LL outbox when it wrote one for
  /// `seq` (*ll = true), else from its board once posted (*ll = false).
  /// fused_from > 0: the wait also ends when `peer`'s fused word reaches fused_from without the
  /// entry holding `seq`; *fused is then true and the blob is empty.
  HeaderBlob wait(int peer, uint64_t seq, const WaitCtx& w, bool* ll, uint64_t fused_from = 0, bool* fused = nullptr);
  /// Record that this rank ran collective `call_seq` without an exchange, waking a peer that
  /// sleeps on this rank's board.
  void mark_fused(uint64_t call_seq);
  /// Headers this rank has posted (relaxed; for tests and diagnostics).
  uint64_t posted() const { return posted_.load(std::memory_order_relaxed); }
  /// The lines of `owner`'s LL outbox for collective `seq` (the one of its two outboxes that the
  /// board entry for `seq` pairs with): line_count() lines, written only by `owner`.
  LLLine* ll_outbox(int owner, uint64_t seq) const;
  size_t line_count() const { return ll_lines_; }
  /// Wait until `flag` holds `seq` or `peer` has posted its header for `seq`, whichever comes
  /// first: a reader of `peer`'s outbox line waits so, since the owner posts its header only after
  /// its last line.
  void wait_line_or_header(int peer, uint64_t seq, const std::atomic<uint64_t>& flag, const WaitCtx& w);

 private:
  int rank_;
  const ShmSegments& segs_;
  ShmWaits& waits_;
  size_t ll_lines_;  // lines per LL outbox
  std::atomic<uint64_t> posted_{0};
};

}  // namespace rc
