// The point-to-point doorbell (transport/shm_doorbell.h).
#include "transport/shm_doorbell.h"

#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

void ShmDoorbell::ring(int owner) {
  SegmentHeader* h = segs_.header(owner);
  publish_add(&h->doorbell.v, &h->doorbell.waiters, 1);
}

uint32_t ShmDoorbell::value() const { return segs_.header(rank_)->doorbell.v.load(std::memory_order_acquire); }

void ShmDoorbell::wait(uint32_t seen, int64_t ns) {
  SegmentHeader* h = segs_.header(rank_);
  h->doorbell.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (h->doorbell.v.load(std::memory_order_seq_cst) == seen) futex_wait(&h->doorbell.v, seen, ns);
  h->doorbell.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace rc
