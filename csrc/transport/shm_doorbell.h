// The point-to-point doorbell: a counter in each segment's header that rings when a p2p slot to
// its owner is filled or one it sent is freed, so the owner's p2p thread sleeps on one word for
// every peer (comm/p2p_engine.h).
//
// Any rank rings any segment's doorbell (a seq_cst RMW, then a futex wake if a sleeper counted
// itself); only the owner reads and sleeps on its own. The word carries no data: a woken thread
// re-reads the slots and outboxes themselves, whose words order their contents. A sleeper counts
// itself in `waiters` (seq_cst) before it re-reads the value, so a ring after its read wakes it.
#pragma once
#include <cstdint>

#include "transport/shm_segments.h"

namespace rc {

class ShmDoorbell {
 public:
  /// `segs` is the transport's: it outlives this part.
  ShmDoorbell(int rank, const ShmSegments& segs) : rank_(rank), segs_(segs) {}
  /// Ring `owner`'s doorbell (also used to wake this rank's own p2p thread).
  void ring(int owner);
  /// This rank's doorbell now (acquire).
  uint32_t value() const;
  /// Sleep until this rank's doorbell differs from `seen` or ns elapse (no checks: the p2p thread
  /// checks peers itself between sleeps).
  void wait(uint32_t seen, int64_t ns);

 private:
  int rank_;
  const ShmSegments& segs_;
};

}  // namespace rc
