#include "transport/shm_channel.h"

#include <cstring>

#include "kernels/copy_cpu.h"
#include "kernels/reduce_cpu.h"

namespace rc {

ShmChannel::ShmChannel(ShmTransport* t, Lane lane, char* scratch, ShmChannelOptions opt)
    : t_(t), lane_(lane), scratch_(scratch), opt_(opt) {}

namespace {
size_t payload_of(size_t slot, ShmChannelOptions::Placement placement) {
  if (placement == ShmChannelOptions::Placement::kPageOffset) return slot;
  return slot > ShmChannel::kResidue ? slot - ShmChannel::kResidue : 0;
}
}  // namespace

// The collective lane's full geometry sits on the ring neighbours' channel; every point-to-point
// channel has the far geometry (shm.h, Layout).
size_t ShmChannel::piece_bytes() const {
  const ShmConfig& c = t_->config();
  return payload_of(lane_ == Lane::kColl ? c.slot_bytes : c.far_slot_bytes, opt_.placement);
}

size_t ShmChannel::far_piece_bytes() const { return payload_of(t_->config().far_slot_bytes, opt_.placement); }

uint32_t ShmChannel::offset_of(const PiecePlace& at) const {
  if (opt_.placement == ShmChannelOptions::Placement::kPageOffset) return ShmTransport::page_offset(at.like);
  return at.off_bytes >= 0 ? static_cast<uint32_t>(at.off_bytes % kResidue) : 0u;
}

char* ShmChannel::send_slot(int peer, const WaitCtx& w, const PiecePlace& at) {
  return t_->send_slot_at(peer, lane_, w, offset_of(at), static_cast<size_t>(at.bytes));
}

char* ShmChannel::try_send_slot(int peer, const PiecePlace& at) {
  return t_->try_send_slot_at(peer, lane_, offset_of(at), static_cast<size_t>(at.bytes));
}

void ShmChannel::send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) {
  t_->send_post(peer, lane_, bytes, total, tag);
}

char* ShmChannel::send_slot_all(const WaitCtx& w, const PiecePlace& at) {
  return t_->send_slot_all(w, offset_of(at), static_cast<size_t>(at.bytes));
}

void ShmChannel::send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) { t_->send_post_all(bytes, total, tag); }

const char* ShmChannel::recv_slot(int peer, const WaitCtx& w, const PiecePlace&, const SlotMeta** meta) {
  return t_->recv_slot(peer, lane_, w, meta);  // at the offset the sender recorded in the meta
}

const char* ShmChannel::try_recv_slot(int peer, const PiecePlace&, const SlotMeta** meta) {
  return t_->try_recv_slot(peer, lane_, meta);
}

void ShmChannel::recv_done(int peer) { t_->recv_done(peer, lane_); }

void ShmChannel::reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) {
  reduce_cpu(dst, a, b, n, dt, op, scale);
}

void ShmChannel::reduce_into_slot(char* slot, const void* a, const void* b, size_t n, DType dt, ReduceOp op) {
  if (stream_ && scratch_ != nullptr) {
    reduce_cpu(scratch_, a, b, n, dt, op, 1.0);
    copy_to_peer(slot, scratch_, n * dtype_size(dt), true);
  } else {
    reduce_cpu(slot, a, b, n, dt, op, 1.0);
  }
}

void ShmChannel::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void ShmChannel::copy_into_slot(char* slot, const void* src, size_t bytes) {
  if (bytes > 0) copy_to_peer(slot, src, bytes, stream_);
}

}  // namespace rc
