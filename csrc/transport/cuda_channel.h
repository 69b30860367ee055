// The CUDA IPC transport's implementation of Channel (transport/channel.h): one lane of
// CudaIpcTransport, with every primitive enqueued on one stream (the caller's): copies with
// cudaMemcpyAsync, reductions with the CUDA reduce kernels, slot hand-offs ordered by
// host waits on this process's own events (cuda_ipc.h).
//
// Placement: a piece sits in its slot at its full-buffer byte offset mod 16 (0 for direct
// exchanges, whose two ends' offsets differ); sender and receiver compute it alike, the slot then
// shares the user buffer's 16-byte residue and the reduce kernel's vector path applies. A slot
// therefore carries 16 bytes less than its size.
// Order: a received piece is copied out before it is forwarded (forward_from_slot() == false):
// the forward reads local device memory (a host-staged slot is read once), and stream order puts
// it after the copy; a slot is released (recv_done) after the reads that use it.
#pragma once
#include <cuda_runtime_api.h>

#include "transport/channel.h"
#include "transport/cuda_ipc.h"
#include "transport/shm_types.h"

namespace rc {

class CudaChannel final : public Channel {
 public:
  static constexpr size_t kResidue = 16;
  CudaChannel(CudaIpcTransport* t, Lane lane, cudaStream_t s) : t_(t), lane_(lane), s_(s) {}

  bool forward_from_slot() const override { return false; }
  RC_CHANNEL_PRIMITIVES(, override)

 private:
  static size_t residue(const PiecePlace& at) {
    return at.off_bytes >= 0 ? static_cast<size_t>(at.off_bytes) % kResidue : 0;
  }
  CudaIpcTransport* t_;
  Lane lane_;
  cudaStream_t s_;
};

}  // namespace rc
