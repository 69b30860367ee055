// The point-to-point doorbell: a counter in each segment that rings when a p2p slot to its owner
// is filled or one it sent is freed, so the p2p thread sleeps on one word for every peer.
#include "transport/shm.h"

#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

void ShmTransport::ring_doorbell(int owner) {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[owner]);
  publish_add(&h->doorbell.v, &h->doorbell.waiters, 1);
}

uint32_t ShmTransport::doorbell_value() const {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  return h->doorbell.v.load(std::memory_order_acquire);
}

void ShmTransport::doorbell_wait(uint32_t seen, int64_t ns) {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  h->doorbell.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (h->doorbell.v.load(std::memory_order_seq_cst) == seen) futex_wait(&h->doorbell.v, seen, ns);
  h->doorbell.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace rc
