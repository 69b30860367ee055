// The fused device ring kernel (device/ring_kernel.cu): one launch runs a whole all_reduce,
// reduce_scatter, all_gather (the ring), broadcast or reduce (the chain along the ring) of one
// rank, its protocol and body being device/ring_proto.h.
#pragma once
#include <cuda_runtime_api.h>

#include <vector>

#include "common/dtype.h"
#include "device/ring_proto.h"

namespace rc {

/// Threads per block (per lane) of the ring kernel.
constexpr int kRingThreads = 512;

/// Enqueue one rank's call on `stream`: a.nlanes blocks, one per lane. Nothing waits on the host;
/// failures reach a.status (device/ring_proto.h). Throws rc::Unsupported for an unsupported
/// (dtype, op) pair (all_gather, broadcast: op is ignored), rc::InvalidArgument for arguments the
/// kernel cannot run with (a.dtype and a.op must be dt's and op's codes), rc::Error when the launch
/// fails.
void ring_cuda(const dev::RingArgs& a, DType dt, ReduceOp op, cudaStream_t stream);

/// Every instantiation of the ring kernel that ring_cuda can launch (its host stubs, one per
/// kernel), made by the same dispatch: what init loads (cudaFuncGetAttributes) before any call,
/// and sizes grids by (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
const std::vector<const void*>& ring_kernels();

}  // namespace rc
