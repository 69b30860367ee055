// CUDA reduce kernels and THE dtype x op switch on the GPU (see reduce_cuda.h for semantics).
//
// One kernel template, instantiated once per supported (dtype, op) pair by select() below through
// the only dtype x op switch on the GPU (dispatch_reduce, kernels/reduce_ops.h, with the element
// operations and the typed body); reduce_cuda_supported() is defined by that same switch, so the
// set of pairs cannot drift from what is launched (tests compare it with the CPU table).
//
// Vectorisation: each thread moves 16-byte vectors (uint4) when dst, a and b have the same
// address residue modulo 16 — after a scalar head of at most 15 bytes that brings them to a
// 16-byte boundary. The CUDA channel places each piece in its slot at the residue of its offset in
// the user's buffer (transport/cuda_channel.h), so the fused reduce-and-forward hits this path
// whenever the user's buffers are 16-byte aligned (torch and CuPy allocations are). Otherwise a
// scalar grid-stride loop runs: correct, slower for 1- and 2-byte types.
//
// Built with --fmad=false (CMakeLists.txt): SUM/AVG must not be contracted, like the CPU kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/errors.h"
#include "kernels/reduce_cuda.h"
#include "kernels/reduce_ops.h"

namespace rc {
namespace {

using namespace rops;

constexpr int kThreads = 512;

template <class T, class Op>
__global__ void __launch_bounds__(kThreads) reduce_kernel(T* dst, const T* a, const T* b, size_t n, Op op) {
  reduce_range(dst, a, b, n, op, static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<size_t>(gridDim.x) * blockDim.x);
}

using LaunchFn = void (*)(void* dst, const void* a, const void* b, size_t n, double scale, cudaStream_t s,
                          int blocks);

using EmulateFn = void (*)(void* dst, const void* a, const void* b, size_t n, double scale, size_t nth);

template <class T, class Op>
void launch(void* dst, const void* a, const void* b, size_t n, double scale, cudaStream_t s, int blocks) {
  reduce_kernel<T, Op><<<blocks, kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                  static_cast<const T*>(b), n, Op(scale));
}

template <class T, class Op>
void emulate(void* dst, const void* a, const void* b, size_t n, double scale, size_t nth) {
  const Op op(scale);
  for (size_t t = 0; t < nth; ++t)
    reduce_range(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, op, t, nth);
}

// One supported (dtype, op) pair: its kernel launcher and its host emulation (same code).
struct Kern {
  LaunchFn launch = nullptr;
  EmulateFn emulate = nullptr;
  explicit operator bool() const { return launch != nullptr; }
};
template <class T, class Op> Kern K() { return Kern{&launch<T, Op>, &emulate<T, Op>}; }

// The pair's kernels, through THE dtype x op switch (kernels/reduce_ops.h).
struct KernOf {
  template <class T, class Op> Kern run() { return K<T, Op>(); }
  Kern none() { return Kern{}; }
};
Kern select(DType dt, ReduceOp op) {
  KernOf v;
  return dispatch_reduce(dt, op, v);
}

bool valid_codes(DType dt, ReduceOp op) {
  return static_cast<uint32_t>(dt) < static_cast<uint32_t>(DType::kCount) &&
         static_cast<uint32_t>(op) < static_cast<uint32_t>(ReduceOp::kCount);
}

// Validation shared by the launch and its emulation; returns the pair's kernels (AVG with scale 1
// is SUM bit for bit, x * 1 == x: the multiply is skipped, like on the CPU).
Kern checked(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) {
  RC_CHECK(valid_codes(dt, op), InvalidArgument,
           "ringcomm: unknown dtype/op code " << static_cast<uint32_t>(dt) << "/" << static_cast<uint32_t>(op));
  if (!select(dt, op)) {
    RC_THROW(Unsupported, "ringcomm: reduce op " << op_name(op) << " is not supported for dtype " << dtype_name(dt));
  }
  RC_CHECK(op == ReduceOp::kAvg || scale == 1.0, InvalidArgument,
           "ringcomm: scale " << scale << " given for reduce op " << op_name(op) << " (only AVG takes a scale)");
  if (n == 0) return Kern{};
  RC_CHECK(dst != nullptr && a != nullptr && b != nullptr, InvalidArgument,
           "ringcomm: reduce_cuda got a null buffer for " << n << " elements");
  const size_t es = dtype_size(dt);
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  for (const void* src : {a, b}) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(src);
    RC_CHECK(d == s || d + n * es <= s || s + n * es <= d, InvalidArgument,
             "ringcomm: reduce dst partially overlaps an input (it must alias it exactly or not at all)");
  }
  return select(dt, (op == ReduceOp::kAvg && scale == 1.0) ? ReduceOp::kSum : op);
}

}  // namespace

bool reduce_cuda_supported(DType dt, ReduceOp op) { return valid_codes(dt, op) && static_cast<bool>(select(dt, op)); }

void reduce_cuda(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale,
                 cudaStream_t stream, int max_blocks) {
  const Kern k = checked(dst, a, b, n, dt, op, scale);
  if (n == 0) return;
  if (max_blocks <= 0) {
    int dev = 0, sms = 0;
    RC_CUDA(cudaGetDevice(&dev), "");
    RC_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "");
    max_blocks = 4 * (sms > 0 ? sms : 1);
  }
  // Enough threads for every 16-byte vector once (two per thread per pass in the kernel), capped.
  const size_t vecs = (n * dtype_size(dt) + 15) / 16;
  const size_t want = (vecs + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < static_cast<size_t>(max_blocks) ? (want > 0 ? want : 1) : max_blocks);
  k.launch(dst, a, b, n, scale, stream, blocks);
  RC_CUDA(cudaGetLastError(), " launching the " << dtype_name(dt) << " " << op_name(op) << " reduce kernel on "
                                                 << n << " elements");
}

void reduce_cuda_emulate(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale,
                         size_t nthreads) {
  const Kern k = checked(dst, a, b, n, dt, op, scale);
  RC_CHECK(nthreads >= 1, InvalidArgument, "ringcomm: reduce_cuda_emulate needs >= 1 thread");
  if (n == 0) return;
  k.emulate(dst, a, b, n, scale, nthreads);
}

}  // namespace rc
