// CUDA reduce kernels: the ONE place where dtype x op is dispatched on the GPU (reduce.cu).
//
// Semantics are those of the CPU kernels (kernels/reduce_cpu.h), element for element, so that a
// collective gives the same bits on either device:
//  - the supported (dtype, op) pairs are exactly reduce_supported()'s (tests compare the two
//    tables for every pair);
//  - AVG combines like SUM; a scale != 1 multiplies the combined value, in float for fp32 and the
//    half types and in double for fp64 ((a + b) * s, never contracted into an FMA);
//  - float16 / bfloat16 are widened to fp32, combined (and scaled) and rounded back once
//    (round to nearest even); their MIN/MAX compare the bit patterns like the CPU (NaN wins,
//    -0 == +0 keeps the first operand);
//  - float MIN/MAX: (a < b || isnan(a)) ? a : b (resp. >): NaN propagates;
//  - integer SUM/PRODUCT wrap (two's complement); bool MIN/MAX are logical and/or (0/1 bytes).
// Loads are 16-byte vectors when dst, a and b share their address residue modulo 16 (after a
// short scalar head), scalar otherwise.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"

namespace rc {

/// True when the CUDA switch has a kernel for (dt, op). Host-only; needs no GPU.
bool reduce_cuda_supported(DType dt, ReduceOp op);

/// Enqueue dst[i] = a[i] (op) b[i] (times `scale` for AVG) for i < n on `stream`.
/// dst may alias a or b exactly (not partially). Pointers must be usable by the current device
/// (device memory, IPC-mapped peer memory or mapped pinned host memory). `max_blocks` caps the
/// grid (0: a default for the current device). Throws rc::Unsupported for an unsupported pair,
/// rc::Error (naming the CUDA error) when the launch fails. Returns without synchronising.
void reduce_cuda(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale,
                 cudaStream_t stream, int max_blocks);

/// Run the same kernel body on the host, one "thread" after another (nthreads of them, as if
/// the grid had that many): host buffers, no GPU. Tests compare it with the CPU kernels.
void reduce_cuda_emulate(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale,
                         size_t nthreads);

}  // namespace rc
