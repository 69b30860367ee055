// ShmTransport (transport/shm.h), the data plane: a slot operation is routed to the push channel
// or the outbox; send_slot_all uses both.
#include "transport/shm.h"

#include <cstring>

#include "common/errors.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmTransport::ShmTransport(int rank, int world, ShmConfig cfg)
    : ShmControl(rank, world, cfg), slots_(rank_, world_, cfg_, segs_, waits_, bell_),
      out_(rank_, world_, cfg_, segs_, waits_, bell_) {}

bool ShmTransport::pushes(int peer, Lane lane) const { return push_channel(cfg_, world_, peer, lane, rank_); }

bool ShmTransport::pulls(int peer, Lane lane) const { return !push_channel(cfg_, world_, rank_, lane, peer); }

char* ShmTransport::try_send_slot_at(int peer, Lane lane, uint32_t offset, size_t bytes) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  if (has_outbox() && !pushes(peer, lane)) return out_.reserve(lane, peer, offset, nullptr);
  return slots_.try_send(peer, lane, offset, bytes);
}

char* ShmTransport::send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset, size_t bytes) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  if (has_outbox() && !pushes(peer, lane)) {
    RC_CHECK(peer != rank_, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel to itself");
    return out_.reserve(lane, peer, offset, &w);
  }
  return slots_.send(peer, lane, w, offset, bytes);
}

void ShmTransport::send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  if (has_outbox() && !pushes(peer, lane)) return out_.post(lane, bytes, total, tag);
  slots_.post(peer, lane, bytes, total, tag);
}

const char* ShmTransport::try_recv_slot(int peer, Lane lane, const SlotMeta** meta) {
  if (has_outbox() && pulls(peer, lane)) return out_.find(peer, lane, meta);
  return slots_.try_recv(peer, lane, meta);
}

const char* ShmTransport::recv_slot(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta) {
  if (has_outbox() && pulls(peer, lane)) {
    RC_CHECK(peer != rank_, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel from itself");
    return out_.wait(peer, lane, w, meta);
  }
  return slots_.recv(peer, lane, w, meta);
}

void ShmTransport::recv_done(int peer, Lane lane) {
  if (has_outbox() && pulls(peer, lane)) return out_.release(peer, lane);
  slots_.done(peer, lane);
}

char* ShmTransport::send_slot_all(const WaitCtx& w, uint32_t offset, size_t bytes) {
  RC_CHECK(has_outbox(), Unsupported, "ringcomm: send_slot_all needs the outbox layout");
  char* p = out_.reserve(Lane::kColl, kAllDest, offset, &w);
  send_slot_at((rank_ + 1) % world_, Lane::kColl, w, offset, bytes);
  return p;
}

// The outbox slot is published first (its readers start at once); then the successor's copy goes
// through the push channel, copied from the outbox slot just written (cache hot): the owner alone
// writes the slot, and only after its next reservation of it, which waits for every reader.
void ShmTransport::send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) {
  const int succ = (rank_ + 1) % world_;
  char* push = slots_.pending(succ, Lane::kColl);
  const char* src = out_.reserved(Lane::kColl);
  out_.post(Lane::kColl, bytes, total, tag);
  if (bytes > 0) std::memcpy(push, src, bytes);
  send_post(succ, Lane::kColl, bytes, total, tag);
}

}  // namespace rc
