#include "transport/cuda_channel.h"

#include "common/cuda_check.h"
#include "kernels/reduce_cuda.h"

namespace rc {

size_t CudaChannel::piece_bytes() const {
  const size_t slot = t_->config().slot_bytes;
  return slot > kResidue ? slot - kResidue : 0;
}

char* CudaChannel::send_slot(int peer, const WaitCtx& w, const PiecePlace& at) {
  return t_->send_slot(peer, lane_, w, s_) + residue(at);
}

char* CudaChannel::try_send_slot(int peer, const PiecePlace& at) {
  char* p = t_->try_send_slot(peer, lane_, s_);
  return p == nullptr ? nullptr : p + residue(at);
}

void CudaChannel::send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) {
  t_->send_post(peer, lane_, bytes, total, tag, s_);
}

const char* CudaChannel::recv_slot(int peer, const WaitCtx& w, const PiecePlace& at, const SlotMeta** meta) {
  return t_->recv_slot(peer, lane_, w, s_, meta) + residue(at);
}

const char* CudaChannel::try_recv_slot(int peer, const PiecePlace& at, const SlotMeta** meta) {
  const char* p = t_->try_recv_slot(peer, lane_, s_, meta);
  return p == nullptr ? nullptr : p + residue(at);
}

void CudaChannel::recv_done(int peer) { t_->recv_done(peer, lane_, s_); }

void CudaChannel::reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) {
  reduce_cuda(dst, a, b, n, dt, op, scale, s_, t_->config().max_blocks);
}

void CudaChannel::reduce_into_slot(char* slot, const void* a, const void* b, size_t n, DType dt, ReduceOp op) {
  // Over NVLink/PCIe when the slot is a peer's device memory.
  reduce_cuda(slot, a, b, n, dt, op, 1.0, s_, t_->config().max_blocks);
}

void CudaChannel::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s_), " (" << bytes << " bytes)");
}

// A peer's slot (device memory over NVLink/PCIe, or mapped host staging) is written like any
// other destination: one cudaMemcpyAsync on the stream.
void CudaChannel::copy_into_slot(char* slot, const void* src, size_t bytes) { copy(slot, src, bytes); }

}  // namespace rc
