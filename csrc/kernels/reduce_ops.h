// The GPU's element operations, its typed reduce body and THE dtype x op switch, as one header
// that nvcc compiles for the device (kernels/reduce.cu, device/ring_kernel.cu) and a host C++
// compiler compiles for the host (the device ring's host harness, tests/device_proof/): every
// function is __host__ __device__ under nvcc and plain inline elsewhere, so the host runs the very
// code the GPU runs. Semantics: kernels/reduce_cuda.h.
//
// dispatch_reduce(dt, op, v) is the only dtype x op switch on the GPU: it calls
// v.template run<T, Op>() for the element type T and functor Op of (dt, op), or v.none() when the
// pair is unsupported. Every kernel (the plain reduce, the ring) instantiates through it, so the
// set of pairs and their arithmetic cannot drift between them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"

#if defined(__CUDACC__)
#define RC_HD __host__ __device__ __forceinline__
#else
#define RC_HD inline
#endif

namespace rc {
namespace rops {

// ---------------- element operations ------------------------------------------------------------
// Each op is a functor constructed on the host from the scale, applied per element.

template <class T> struct Unsigned { using type = std::make_unsigned_t<T>; };

struct SumWrap {  // integers: two's-complement wrap (unsigned arithmetic has no UB)
  RC_HD explicit SumWrap(double) {}
  template <class T> RC_HD T operator()(T a, T b) const {
    using U = typename Unsigned<T>::type;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
};
struct ProdWrap {
  RC_HD explicit ProdWrap(double) {}
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
    RC_HD explicit Name(double) {}                                                                  \
    template <class T> RC_HD T operator()(T a, T b) const { return static_cast<T>(expr); } \
  };
RC_ELEMENT_OP(MinI, (a < b) ? a : b)
RC_ELEMENT_OP(MaxI, (a > b) ? a : b)
RC_ELEMENT_OP(BAnd, a & b)
RC_ELEMENT_OP(BOr, a | b)
RC_ELEMENT_OP(BXor, a ^ b)
struct LAnd {  // bool MIN
  RC_HD explicit LAnd(double) {}
  RC_HD uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};
struct LOr {  // bool MAX
  RC_HD explicit LOr(double) {}
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
  RC_HD explicit AvgF(double scale) : s(static_cast<S>(scale)) {}
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
  RC_HD explicit HalfArith(double scale) : f(scale) {}
  template <class H> RC_HD H operator()(H a, H b) const {
    return narrow<H>(f(widen<H>(a), widen<H>(b)));
  }
};

// float16 / bfloat16 MIN/MAX on the bit patterns, exactly like the CPU's HalfMinMax: the
// sign-magnitude pattern maps to the ordered key +/-magnitude (-0 == +0); NaN (magnitude > inf)
// wins; on a tie the first operand is kept.
template <int kInfBits, bool kMax> struct HalfMinMax {
  RC_HD explicit HalfMinMax(double) {}
  RC_HD uint16_t operator()(uint16_t a, uint16_t b) const {
    const int ma = a & 0x7FFF, mb = b & 0x7FFF;
    const int ka = (a & 0x8000) ? -ma : ma, kb = (b & 0x8000) ? -mb : mb;
    const bool nan_a = ma > kInfBits, nan_b = mb > kInfBits;
    const bool better = kMax ? (ka > kb) : (ka < kb);
    return (nan_a || (!nan_b && better)) ? a : b;
  }
};

// ---------------- the kernel --------------------------------------------------------------------
/// The functor of a ring's intermediate combining steps: AVG combines like SUM and is scaled only
/// at a chunk's last step (the CPU kernels skip the multiply for a scale of 1; so does this).
template <class Op> struct StepOf { using type = Op; };
template <class S> struct StepOf<AvgF<S>> { using type = SumF; };
template <class S> struct StepOf<HalfArith<AvgF<S>>> { using type = HalfArith<SumF>; };

// ---------------- the typed body ----------------------------------------------------------------

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

// ---------------- THE dtype x op switch (GPU) --------------------------------------------------

template <class T, class S, class V>
auto dispatch_float(ReduceOp op, V& v) {  // float32 / float64
  switch (op) {
    case ReduceOp::kSum: return v.template run<T, SumF>();
    case ReduceOp::kProduct: return v.template run<T, ProdF>();
    case ReduceOp::kMin: return v.template run<T, MinF>();
    case ReduceOp::kMax: return v.template run<T, MaxF>();
    case ReduceOp::kAvg: return v.template run<T, AvgF<S>>();
    default: return v.none();  // bitwise ops
  }
}

template <class H, int kInf, class V>
auto dispatch_half(ReduceOp op, V& v) {  // float16 / bfloat16
  switch (op) {
    case ReduceOp::kSum: return v.template run<H, HalfArith<SumF>>();
    case ReduceOp::kProduct: return v.template run<H, HalfArith<ProdF>>();
    case ReduceOp::kMin: return v.template run<uint16_t, HalfMinMax<kInf, false>>();
    case ReduceOp::kMax: return v.template run<uint16_t, HalfMinMax<kInf, true>>();
    case ReduceOp::kAvg: return v.template run<H, HalfArith<AvgF<float>>>();
    default: return v.none();  // bitwise ops
  }
}

template <class T, class V>
auto dispatch_int(ReduceOp op, V& v) {  // int8 / uint8 / int32 / int64
  switch (op) {
    case ReduceOp::kSum: return v.template run<T, SumWrap>();
    case ReduceOp::kProduct: return v.template run<T, ProdWrap>();
    case ReduceOp::kMin: return v.template run<T, MinI>();
    case ReduceOp::kMax: return v.template run<T, MaxI>();
    case ReduceOp::kBand: return v.template run<T, BAnd>();
    case ReduceOp::kBor: return v.template run<T, BOr>();
    case ReduceOp::kBxor: return v.template run<T, BXor>();
    default: return v.none();  // AVG
  }
}

template <class V>
auto dispatch_bool(ReduceOp op, V& v) {
  switch (op) {
    case ReduceOp::kMin: return v.template run<uint8_t, LAnd>();
    case ReduceOp::kMax: return v.template run<uint8_t, LOr>();
    default: return v.none();
  }
}

template <class V>
auto dispatch_reduce(DType dt, ReduceOp op, V& v) {
  switch (dt) {
    case DType::kFloat32: return dispatch_float<float, float>(op, v);
    case DType::kFloat64: return dispatch_float<double, double>(op, v);
    case DType::kFloat16: return dispatch_half<__half, 0x7C00>(op, v);
    case DType::kBFloat16: return dispatch_half<__nv_bfloat16, 0x7F80>(op, v);
    case DType::kInt8: return dispatch_int<int8_t>(op, v);
    case DType::kUInt8: return dispatch_int<uint8_t>(op, v);
    case DType::kInt32: return dispatch_int<int32_t>(op, v);
    case DType::kInt64: return dispatch_int<int64_t>(op, v);
    case DType::kBool: return dispatch_bool(op, v);
    default: return v.none();
  }
}

}  // namespace rops
}  // namespace rc
