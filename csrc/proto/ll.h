// The LL (low-latency) protocol: a small collective's header and data travel together in the
// sender's own LL outbox (transport/shm_board.h, "LL outboxes"), 56 payload bytes and a flag per
// 64-byte line, and every peer reads them in place. No slot is taken or released and no head or
// tail word is exchanged: a line is current iff its flag equals the collective's sequence number,
// so one release store per line publishes it and one acquire load per line reads it.
//
// Stream format: the lines of one collective carry the bytes header || data, line i the stream's
// bytes [56 i, 56 i + 56). Line 0 is always written (it carries the header, which a peer's
// wait_header may take from it); data lines only as far as the data goes.
//
// Ordering: the owner writes every line of collective s (payload, then flag with release) before
// it posts its header for s on the board (seq_cst); a reader that found a line not yet current
// waits for the line or the board, whichever comes first. Once the board says s, every line the
// owner wrote for s is current, so a line still stale then means the ranks' streams diverged.
// Reuse without acknowledgement: see transport/shm_board.h (the two outboxes alternate with the board).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/shm_control.h"
#include "transport/shm_types.h"

namespace rc {

class LLProtocol {
 public:
  /// Over the LL outboxes of `t`'s segments; t->ll_max_bytes() == 0 means the protocol is unavailable.
  explicit LLProtocol(ShmControl* t) : t_(t) {}
  /// Data bytes one collective may carry (the outbox's size).
  size_t max_bytes() const { return t_->ll_max_bytes(); }
  /// This rank's header `h` and `bytes` (<= max_bytes()) of `data` into its outbox for collective
  /// `seq`; post_header(seq, h) must follow. Lines whose data all lies in data bytes
  /// [skip_from, skip_from + skip_bytes) are left as they are: no peer may read them.
  void write(uint64_t seq, const HeaderBlob& h, const void* data, size_t bytes, size_t skip_from = 0,
             size_t skip_bytes = 0);
  /// `bytes` of `peer`'s data for collective `seq`, from data byte `from` on, into local memory
  /// `dst` (its header said it wrote them). Waits (bounded) for the lines that hold them (line 0
  /// at least) while still being written; a line that never becomes current although the peer
  /// posted its header raises rc::Error.
  void read(int peer, uint64_t seq, void* dst, size_t bytes, const WaitCtx& w, size_t from = 0);
  /// Private memory of max_bytes() for index i in [0, world): where the reading thread collects
  /// peers' data (one collective at a time uses it).
  char* stage(int i);

 private:
  ShmControl* t_;
  std::vector<char> stage_;  // world x max_bytes(), allocated on first use
};

}  // namespace rc
