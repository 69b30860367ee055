// CUDA reduce kernels and THE dtype x op switch on the GPU (see reduce_cuda.h for semantics).
//
// One kernel template, instantiated once per supported (dtype, op) pair by select() below — the
// only dtype x op switch on the GPU; reduce_cuda_supported() is defined by that same switch, so
// the set of pairs cannot drift from what is launched (tests compare it with the CPU table).
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

// Element operations and the kernel body are __host__ __device__: the host can run the very same
// code (reduce_cuda_emulate, one "thread" after another), which is how their indexing and
// arithmetic are checked against the CPU kernels on machines without a GPU.
#define RC_HD __host__ __device__ __forceinline__

namespace rc {
namespace {

// ---------------- element operations ------------------------------------------------------------
// Each op is a functor constructed on the host from the scale, applied per element.

template <class T> struct Unsigned { using type = std::make_unsigned_t<T>; };

struct SumWrap {  // integers: two's-complement wrap (unsigned arithmetic has no UB)
  explicit SumWrap(double) {}
  template <class T> RC_HD T operator()(T a, T b) const {
    using U = typename Unsigned<T>::type;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
};
struct ProdWrap {
  explicit ProdWrap(double) {}
  template <class T> RC_HD T operator()(T a, T b) const {
    using U = typename Unsigned<T>::type;
    // uint8 * uint8 promotes to int; the product of two values < 256 fits, and the cast wraps.
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  }
};
// The stateless ops, one line each: a functor whose operator() returns `expr` of (a, b) as T.
#define RC_ELEMENT_OP(Name, expr)                                                             \
  struct Name {                                                                               \
    explicit Name(double) {}                                                                  \
    template <class T> RC_HD T operator()(T a, T b) const { return static_cast<T>(expr); } \
  };
RC_ELEMENT_OP(MinI, (a < b) ? a : b)
RC_ELEMENT_OP(MaxI, (a > b) ? a : b)
RC_ELEMENT_OP(BAnd, a & b)
RC_ELEMENT_OP(BOr, a | b)
RC_ELEMENT_OP(BXor, a ^ b)
struct LAnd {  // bool MIN
  explicit LAnd(double) {}
  RC_HD uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};
struct LOr {  // bool MAX
  explicit LOr(double) {}
  RC_HD uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) | (b != 0); }
};

// float32 / float64 (S = the arithmetic type; equal to T). MIN and MAX keep a NaN operand:
// (a < b || isnan(a)) ? a : b, as the CPU kernels do.
RC_ELEMENT_OP(SumF, a + b)
RC_ELEMENT_OP(ProdF, a * b)
RC_ELEMENT_OP(MinF, (a < b || a != a) ? a : b)
RC_ELEMENT_OP(MaxF, (a > b || a != a) ? a : b)
#undef RC_ELEMENT_OP

template <class S> struct AvgF {  // (a + b) * s in S
  S s;
  explicit AvgF(double scale) : s(static_cast<S>(scale)) {}
  template <class T> RC_HD T operator()(T a, T b) const { return (a + b) * s; }
};

// float16 / bfloat16 arithmetic: widen to fp32, combine, round back once (nearest even).
template <class H> RC_HD float widen(H x);
template <> RC_HD float widen<__half>(__half x) { return __half2float(x); }
template <> RC_HD float widen<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class H> RC_HD H narrow(float x);
template <> RC_HD __half narrow<__half>(float x) { return __float2half_rn(x); }
template <> RC_HD __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class F> struct HalfArith {  // F: a float op (SumF / ProdF / AvgF<float>)
  F f;
  explicit HalfArith(double scale) : f(scale) {}
  template <class H> RC_HD H operator()(H a, H b) const {
    return narrow<H>(f(widen<H>(a), widen<H>(b)));
  }
};

// float16 / bfloat16 MIN/MAX on the bit patterns, exactly like the CPU's HalfMinMax: the
// sign-magnitude pattern maps to the ordered key +/-magnitude (-0 == +0); NaN (magnitude > inf)
// wins; on a tie the first operand is kept.
template <int kInfBits, bool kMax> struct HalfMinMax {
  explicit HalfMinMax(double) {}
  RC_HD uint16_t operator()(uint16_t a, uint16_t b) const {
    const int ma = a & 0x7FFF, mb = b & 0x7FFF;
    const int ka = (a & 0x8000) ? -ma : ma, kb = (b & 0x8000) ? -mb : mb;
    const bool nan_a = ma > kInfBits, nan_b = mb > kInfBits;
    const bool better = kMax ? (ka > kb) : (ka < kb);
    return (nan_a || (!nan_b && better)) ? a : b;
  }
};

// ---------------- the kernel --------------------------------------------------------------------

constexpr int kThreads = 512;

template <class T, class Op>
RC_HD uint4 apply_vec(const uint4& x, const uint4& y, const Op& op) {
  constexpr int kV = 16 / sizeof(T);
  union U {
    uint4 v;
    T e[kV];
    __host__ __device__ U() {}
  } ux, uy, ud;
  ux.v = x;
  uy.v = y;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kV; ++i) ud.e[i] = op(ux.e[i], uy.e[i]);
  return ud.v;
}

// Thread `tid` of `nth`: its share of dst = a (op) b. dst may alias a or b exactly: each element is
// read and written by the same thread, reads first.
template <class T, class Op>
RC_HD void reduce_range(T* dst, const T* a, const T* b, size_t n, const Op& op, size_t tid, size_t nth) {
  const uintptr_t rd = reinterpret_cast<uintptr_t>(dst) & 15u;
  if (rd == (reinterpret_cast<uintptr_t>(a) & 15u) && rd == (reinterpret_cast<uintptr_t>(b) & 15u)) {
    constexpr size_t kV = 16 / sizeof(T);
    const size_t head0 = rd ? (16 - rd) / sizeof(T) : 0;
    const size_t head = head0 < n ? head0 : n;
    for (size_t t = tid; t < head; t += nth) dst[t] = op(a[t], b[t]);  // < 16 bytes
    const size_t nv = (n - head) / kV;
    const uint4* av = reinterpret_cast<const uint4*>(a + head);
    const uint4* bv = reinterpret_cast<const uint4*>(b + head);
    uint4* dv = reinterpret_cast<uint4*>(dst + head);
    size_t i = tid;
    // Two vectors in flight per thread per iteration: more bytes outstanding per SM.
    for (; i + nth < nv; i += 2 * nth) {
      const uint4 x0 = av[i], y0 = bv[i], x1 = av[i + nth], y1 = bv[i + nth];
      dv[i] = apply_vec<T>(x0, y0, op);
      dv[i + nth] = apply_vec<T>(x1, y1, op);
    }
    if (i < nv) dv[i] = apply_vec<T>(av[i], bv[i], op);
    for (size_t t = head + nv * kV + tid; t < n; t += nth) dst[t] = op(a[t], b[t]);  // < 16 bytes
  } else {
    for (size_t i = tid; i < n; i += nth) dst[i] = op(a[i], b[i]);
  }
}

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

// ---------------- THE dtype x op switch (GPU) --------------------------------------------------

template <class T, class S>
Kern select_float(ReduceOp op) {  // float32 / float64
  switch (op) {
    case ReduceOp::kSum: return K<T, SumF>();
    case ReduceOp::kProduct: return K<T, ProdF>();
    case ReduceOp::kMin: return K<T, MinF>();
    case ReduceOp::kMax: return K<T, MaxF>();
    case ReduceOp::kAvg: return K<T, AvgF<S>>();
    default: return Kern{};  // bitwise ops
  }
}

template <class H, int kInf>
Kern select_half(ReduceOp op) {  // float16 / bfloat16
  switch (op) {
    case ReduceOp::kSum: return K<H, HalfArith<SumF>>();
    case ReduceOp::kProduct: return K<H, HalfArith<ProdF>>();
    case ReduceOp::kMin: return K<uint16_t, HalfMinMax<kInf, false>>();
    case ReduceOp::kMax: return K<uint16_t, HalfMinMax<kInf, true>>();
    case ReduceOp::kAvg: return K<H, HalfArith<AvgF<float>>>();
    default: return Kern{};  // bitwise ops
  }
}

template <class T>
Kern select_int(ReduceOp op) {  // int8 / uint8 / int32 / int64
  switch (op) {
    case ReduceOp::kSum: return K<T, SumWrap>();
    case ReduceOp::kProduct: return K<T, ProdWrap>();
    case ReduceOp::kMin: return K<T, MinI>();
    case ReduceOp::kMax: return K<T, MaxI>();
    case ReduceOp::kBand: return K<T, BAnd>();
    case ReduceOp::kBor: return K<T, BOr>();
    case ReduceOp::kBxor: return K<T, BXor>();
    default: return Kern{};  // AVG
  }
}

Kern select_bool(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return K<uint8_t, LAnd>();
    case ReduceOp::kMax: return K<uint8_t, LOr>();
    default: return Kern{};
  }
}

Kern select(DType dt, ReduceOp op) {
  switch (dt) {
    case DType::kFloat32: return select_float<float, float>(op);
    case DType::kFloat64: return select_float<double, double>(op);
    case DType::kFloat16: return select_half<__half, 0x7C00>(op);
    case DType::kBFloat16: return select_half<__nv_bfloat16, 0x7F80>(op);
    case DType::kInt8: return select_int<int8_t>(op);
    case DType::kUInt8: return select_int<uint8_t>(op);
    case DType::kInt32: return select_int<int32_t>(op);
    case DType::kInt64: return select_int<int64_t>(op);
    case DType::kBool: return select_bool(op);
    default: return Kern{};
  }
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
