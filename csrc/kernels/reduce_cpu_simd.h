// Typed elementwise reduce loops, written once with GCC/Clang vector extensions and compiled
// once per instruction set. NOT a normal header: reduce_cpu.cpp includes it once per copy (through
// reduce_cpu_copy.h), each time inside its own namespace and (for AVX2 and AVX-512) inside a
// `#pragma GCC target` region, so that every function below -- templates included -- is
// compiled for that instruction set. The dtype x op
// switch is not here; it lives in reduce_cpu.cpp and picks `Isa::run<Kind, Op>` from one of the
// copies.
//
// The includer defines:
//   RC_KERN_NS      namespace name of this copy (generic, avx2, avx512)
//   RC_KERN_VBYTES  vector width in bytes (16: SSE2/NEON baseline; 32: AVX2; 64: AVX-512)
//   RC_KERN_AVX2    1 when AVX2 + F16C intrinsics may be used in this copy, else 0
//   RC_KERN_AVX512  1 when AVX-512 F/BW/VL intrinsics may be used in this copy, else 0 (the
//                   widen/narrow conversions below use 512-bit forms of the AVX2 ones: the
//                   same operations per 128-bit lane, so the same bits)
//
// Invariants every kind/op keeps (the tests check them bit for bit):
//  - One code path per element: full vectors go through Kind::step directly; the last partial
//    vector is copied into a zero-padded stack buffer and goes through the SAME Kind::step, so
//    the "scalar tail" cannot disagree with the vector body.
//  - Each step loads all of its inputs before it stores, so dst == a or dst == b is safe.
//  - No FMA contraction is possible: there is no a*b+c pattern anywhere (and the AVX2 copy does
//    not enable "fma"), so even -mfma -ffp-contract=fast keeps SUM exactly round(a+b) and AVG
//    round(round(a+b)*scale).
//  - Float MIN/MAX: r = (a < b || isnan(a)) ? a : b  (MAX with >), i.e. numpy's scalar rule:
//    a NaN in either input gives a NaN, and the result is always one of the inputs' bit patterns.

namespace rc {
namespace kern {
namespace RC_KERN_NS {

#define RC_KINLINE inline __attribute__((always_inline))

constexpr size_t kVB = RC_KERN_VBYTES;

typedef float f32v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef double f64v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef int8_t i8v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef uint8_t u8v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef int16_t i16v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef int32_t i32v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef uint32_t u32v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef int64_t i64v __attribute__((vector_size(RC_KERN_VBYTES)));
typedef uint64_t u64v __attribute__((vector_size(RC_KERN_VBYTES)));

// Unaligned loads/stores; memcpy of a constant size compiles to one (v)movdqu.
template <class V>
RC_KINLINE V load(const char* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
RC_KINLINE void store(char* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// ---------------------------------------------------------------------------------------------
// Ops: functors on whole vectors. Constructed once per call from `scale` (ignored by most).

template <class V> struct UnsignedOf;
template <> struct UnsignedOf<i8v> { typedef u8v type; };
template <> struct UnsignedOf<u8v> { typedef u8v type; };
template <> struct UnsignedOf<i32v> { typedef u32v type; };
template <> struct UnsignedOf<u32v> { typedef u32v type; };
template <> struct UnsignedOf<i64v> { typedef u64v type; };

struct Sum {  // floating (also used for AVG when scale == 1)
  explicit Sum(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return a + b; }
};
struct Prod {
  explicit Prod(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return a * b; }
};
// Integer SUM/PRODUCT in unsigned arithmetic: wraps modulo 2^bits like numpy/torch, no UB.
struct SumWrap {
  explicit SumWrap(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const {
    typedef typename UnsignedOf<V>::type U;
    return (V)((U)a + (U)b);
  }
};
struct ProdWrap {
  explicit ProdWrap(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const {
    typedef typename UnsignedOf<V>::type U;
    return (V)((U)a * (U)b);
  }
};
struct MinF {  // (a < b || isnan(a)) ? a : b
  explicit MinF(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return ((a < b) | (a != a)) ? a : b; }
};
struct MaxF {  // (a > b || isnan(a)) ? a : b
  explicit MaxF(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return ((a > b) | (a != a)) ? a : b; }
};
struct MinI {  // signedness comes from the vector type
  explicit MinI(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return (a < b) ? a : b; }
};
struct MaxI {
  explicit MaxI(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return (a > b) ? a : b; }
};
struct BAnd {
  explicit BAnd(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return a & b; }
};
struct BOr {
  explicit BOr(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return a | b; }
};
struct BXor {
  explicit BXor(double) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return a ^ b; }
};
// bool MIN / MAX: any nonzero byte is true; the result is always 0 or 1.
struct LAnd {
  explicit LAnd(double) {}
  RC_KINLINE u8v operator()(u8v a, u8v b) const { return (u8v)((a != 0) & (b != 0)) & (uint8_t)1; }
};
struct LOr {
  explicit LOr(double) {}
  RC_KINLINE u8v operator()(u8v a, u8v b) const { return (u8v)((a != 0) | (b != 0)) & (uint8_t)1; }
};
// AVG: (a + b) * scale, in S (float for fp32 and the half types, double for fp64).
template <class S> struct Avg {
  S s;
  explicit Avg(double scale) : s(static_cast<S>(scale)) {}
  template <class V> RC_KINLINE V operator()(V a, V b) const { return (a + b) * s; }
};
// scale_cpu: a * scale (b is the same buffer as a and is ignored).
template <class S> struct Scale {
  S s;
  explicit Scale(double scale) : s(static_cast<S>(scale)) {}
  template <class V> RC_KINLINE V operator()(V a, V) const { return a * s; }
};
// fp16/bf16 MIN/MAX straight on the 16-bit patterns (no conversion, so the result is exactly one
// of the inputs, NaN payloads included). Same rule as MinF/MaxF: a sign-magnitude pattern maps to
// the ordered key +/-magnitude (so -0 == +0, like the float compare); NaN is magnitude > inf.
template <int kInfBits, bool kMax> struct HalfMinMax {
  explicit HalfMinMax(double) {}
  RC_KINLINE i16v operator()(i16v a, i16v b) const {
    const i16v ma = a & (int16_t)0x7FFF, mb = b & (int16_t)0x7FFF;
    const i16v sa = a >> 15, sb = b >> 15;  // arithmetic shift: 0 or -1
    const i16v ka = (ma ^ sa) - sa, kb = (mb ^ sb) - sb;
    const i16v nan_a = ma > (int16_t)kInfBits, nan_b = mb > (int16_t)kInfBits;
    const i16v better = kMax ? (ka > kb) : (ka < kb);
    return (nan_a | (~nan_b & better)) ? a : b;
  }
};

// ---------------------------------------------------------------------------------------------
// Kinds: how one step loads, combines and stores kStep elements of kElem bytes.

template <class T, class V> struct Plain {
  static constexpr size_t kElem = sizeof(T);
  static constexpr size_t kStep = sizeof(V) / sizeof(T);
  template <class Op>
  static RC_KINLINE void step(char* d, const char* a, const char* b, const Op& op) {
    const V x = load<V>(a), y = load<V>(b);
    store<V>(d, op(x, y));
  }
};

// fp16/bf16 arithmetic: widen each input to two f32v, combine in fp32, round back once (RNE).
// Cvt::widen splits one vector of 16-bit values into two f32v in whatever lane order is cheapest
// (AVX2 bf16: in-lane unpack; generic: even/odd elements); Cvt::narrow puts them back in exactly
// the inverse order. Elementwise ops do not care about the order in between.
template <class Cvt> struct Widened {
  static constexpr size_t kElem = 2;
  static constexpr size_t kStep = kVB / 2;
  template <class Op>
  static RC_KINLINE void step(char* d, const char* a, const char* b, const Op& op) {
    f32v a0, a1, b0, b1;
    Cvt::widen(a, a0, a1);
    Cvt::widen(b, b0, b1);
    Cvt::narrow(d, op(a0, b0), op(a1, b1));
  }
};

// Portable 16 <-> 32-bit lane moves for the generic copy, without shuffles: viewing a vector
// of 16-bit values as 32-bit lanes, the low halves hold one element of each pair and the high
// halves the other. unpack16 splits them ("lo" = the low halves, "hi" = the high halves), each
// zero-extended and shifted left by kShift (0 or 16); pack16 is the exact inverse for values
// <= 0xFFFF. Endianness only decides which halves are the even elements; the round trip holds
// either way.
template <int kShift>
RC_KINLINE void unpack16(const char* p, u32v& lo, u32v& hi) {
  const u32v x = load<u32v>(p);
  if (kShift == 16) {
    lo = x << 16;
    hi = x & 0xFFFF0000u;
  } else {
    lo = x & 0xFFFFu;
    hi = x >> 16;
  }
}
RC_KINLINE void pack16(char* p, u32v lo, u32v hi) { store<u32v>(p, lo | (hi << 16)); }

// The instruction set's whole-register forms, named once so that the conversions below are
// written once for both x86 widths: IVec is one integer register, HVec the 16-bit halves of one
// f32v (the fp16 source of a widening), FVec one float register.
#if RC_KERN_AVX512
using IVec = __m512i;
using HVec = __m256i;
using FVec = __m512;
#define RC_X86(op) _mm512_##op
#elif RC_KERN_AVX2
using IVec = __m256i;
using HVec = __m128i;
using FVec = __m256;
#define RC_X86(op) _mm256_##op
#endif
#if RC_KERN_AVX512 || RC_KERN_AVX2
RC_KINLINE IVec unpacklo16(IVec a, IVec b) { return RC_X86(unpacklo_epi16)(a, b); }
RC_KINLINE IVec unpackhi16(IVec a, IVec b) { return RC_X86(unpackhi_epi16)(a, b); }
RC_KINLINE IVec packus32(IVec a, IVec b) { return RC_X86(packus_epi32)(a, b); }
RC_KINLINE f32v cvtph_ps(HVec h) { return (f32v)RC_X86(cvtph_ps)(h); }
RC_KINLINE HVec cvtps_ph(f32v f) { return RC_X86(cvtps_ph)((FVec)f, _MM_FROUND_TO_NEAREST_INT); }
#undef RC_X86
#endif

// bf16 <-> fp32 with integer ops. Widening is exact (bf16 is the top half of an fp32).
// Narrowing rounds to nearest even; overflow carries into the exponent and gives inf; a NaN
// keeps its sign and top payload bits and gets the quiet bit (never turns into inf or -0).
struct CvtBF16 {
  static RC_KINLINE u32v round_bits(f32v f) {
    const u32v u = (u32v)f;
    const u32v rne = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (f != f) ? ((u >> 16) | 0x40u) : rne;
  }
#if RC_KERN_AVX512 || RC_KERN_AVX2
  // In-lane unpack with zero puts each bf16 in the top half of an fp32: per 128-bit lane, lo =
  // elements 0-3 and hi = 4-7 of the lane's eight. packus (in-lane, exact for values <= 0xFFFF)
  // restores the original order.
  static RC_KINLINE void widen(const char* p, f32v& lo, f32v& hi) {
    const IVec x = load<IVec>(p), z{};
    lo = (f32v)unpacklo16(z, x);
    hi = (f32v)unpackhi16(z, x);
  }
  static RC_KINLINE void narrow(char* p, f32v lo, f32v hi) {
    store<IVec>(p, packus32((IVec)round_bits(lo), (IVec)round_bits(hi)));
  }
#else
  static RC_KINLINE void widen(const char* p, f32v& lo, f32v& hi) {
    u32v l, h;
    unpack16<16>(p, l, h);
    lo = (f32v)l;
    hi = (f32v)h;
  }
  static RC_KINLINE void narrow(char* p, f32v lo, f32v hi) { pack16(p, round_bits(lo), round_bits(hi)); }
#endif
};

#if RC_KERN_AVX512 || RC_KERN_AVX2
// fp16 <-> fp32 with the F16C conversions (vcvtph2ps / vcvtps2ph; AVX-512F's 16-lane forms under
// AVX-512): exact widening; narrowing with imm 0 = round to nearest even, independent of MXCSR.
struct CvtF16 {
  static RC_KINLINE void widen(const char* p, f32v& lo, f32v& hi) {
    lo = cvtph_ps(load<HVec>(p));
    hi = cvtph_ps(load<HVec>(p + sizeof(HVec)));
  }
  static RC_KINLINE void narrow(char* p, f32v lo, f32v hi) {
    store<HVec>(p, cvtps_ph(lo));
    store<HVec>(p + sizeof(HVec), cvtps_ph(hi));
  }
};
#else
// fp16 <-> fp32 in portable integer/float vector code, bit-identical to F16C (F. Giesen's exact
// conversions, "half_to_float" and "float_to_half_fast3_rtne", vectorised). NaN: F16C keeps the
// sign and top payload bits and sets the quiet bit; so does this.
struct CvtF16 {
  static RC_KINLINE f32v widen1(u32v h) {
    const u32v shifted_exp = u32v{} + (0x7C00u << 13);
    u32v o = (h & 0x7FFFu) << 13;           // exponent + mantissa
    const u32v e = o & shifted_exp;         // exponent only
    o += (127u - 15u) << 23;                // rebias
    const u32v magic = u32v{} + (113u << 23);
    // Inf/NaN: push the exponent to 255. Zero/subnormal: renormalise through one exact fp32
    // subtraction.
    const u32v infnan = o + ((128u - 16u) << 23);
    const u32v sub = (u32v)((f32v)(o + (1u << 23)) - (f32v)magic);
    o = (e == shifted_exp) ? infnan : o;
    o = (e == 0u) ? sub : o;
    return (f32v)(o | ((h & 0x8000u) << 16));
  }
  static RC_KINLINE void widen(const char* p, f32v& lo, f32v& hi) {
    u32v l, h;
    unpack16<0>(p, l, h);
    lo = widen1(l);
    hi = widen1(h);
  }
  static RC_KINLINE u32v round_bits(f32v f) {
    const u32v u = (u32v)f;
    const u32v sign = u & 0x80000000u;
    const u32v a = u ^ sign;  // |f| bits
    // Normal results: rebias, add half-ulp-minus-one plus the odd bit (ties to even), shift.
    const u32v nrm = (a + (((15u - 127u) << 23) + 0xFFFu) + ((a >> 13) & 1u)) >> 13;
    // Subnormal or zero results: one fp32 add aligns the 10 mantissa bits at the bottom and
    // rounds to nearest even.
    const u32v dm = u32v{} + (((127u - 15u) + (23u - 10u) + 1u) << 23);
    const u32v sub = (u32v)((f32v)a + (f32v)dm) - dm;
    // >= 65536: inf, or a quiet NaN carrying the top payload bits.
    // (|f| bits fit in 31 bits: signed compares are exact and native on SSE2.)
    const i32v ai = (i32v)a;
    const u32v big = (ai > 0x7F800000) ? (0x7E00u | ((a >> 13) & 0x3FFu)) : (u32v{} + 0x7C00u);
    u32v r = (ai < (113 << 23)) ? sub : nrm;
    r = (ai >= ((127 + 16) << 23)) ? big : r;
    return r | (sign >> 16);
  }
  static RC_KINLINE void narrow(char* p, f32v lo, f32v hi) { pack16(p, round_bits(lo), round_bits(hi)); }
};
#endif

// ---------------------------------------------------------------------------------------------
// The loop. Exactly one Kind::step per kStep elements; the partial last step runs on padded
// copies (zeros are harmless for every op) so it shares the vector code.
template <class K, class Op>
RC_KINLINE void drive(void* dst, const void* a, const void* b, size_t n, const Op& op) {
  constexpr size_t kBytes = K::kStep * K::kElem;
  char* d = static_cast<char*>(dst);
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  const size_t full = n / K::kStep;
#pragma GCC unroll 4
  for (size_t i = 0; i < full; ++i) K::step(d + i * kBytes, x + i * kBytes, y + i * kBytes, op);
  const size_t rem = n - full * K::kStep;
  if (rem != 0) {
    alignas(32) char tx[kBytes] = {};
    alignas(32) char ty[kBytes] = {};
    alignas(32) char td[kBytes];
    const size_t off = full * kBytes, bytes = rem * K::kElem;
    std::memcpy(tx, x + off, bytes);
    std::memcpy(ty, y + off, bytes);
    K::step(td, tx, ty, op);
    std::memcpy(d + off, td, bytes);
  }
}

// What reduce_cpu.cpp's switch picks from: kinds per dtype, op functors, and the entry point.
struct Isa {
  typedef Plain<float, f32v> F32;
  typedef Plain<double, f64v> F64;
  typedef Widened<CvtF16> F16;
  typedef Widened<CvtBF16> BF16;
  typedef Plain<int16_t, i16v> HalfBits;  // fp16/bf16 MIN/MAX on raw patterns
  typedef Plain<int8_t, i8v> I8;
  typedef Plain<uint8_t, u8v> U8;
  typedef Plain<int32_t, i32v> I32;
  typedef Plain<int64_t, i64v> I64;
  typedef Plain<uint8_t, u8v> Bool;

  typedef rc::kern::RC_KERN_NS::Sum Sum;
  typedef rc::kern::RC_KERN_NS::Prod Prod;
  typedef rc::kern::RC_KERN_NS::SumWrap SumWrap;
  typedef rc::kern::RC_KERN_NS::ProdWrap ProdWrap;
  typedef rc::kern::RC_KERN_NS::MinF MinF;
  typedef rc::kern::RC_KERN_NS::MaxF MaxF;
  typedef rc::kern::RC_KERN_NS::MinI MinI;
  typedef rc::kern::RC_KERN_NS::MaxI MaxI;
  typedef rc::kern::RC_KERN_NS::BAnd BAnd;
  typedef rc::kern::RC_KERN_NS::BOr BOr;
  typedef rc::kern::RC_KERN_NS::BXor BXor;
  typedef rc::kern::RC_KERN_NS::LAnd LAnd;
  typedef rc::kern::RC_KERN_NS::LOr LOr;
  template <class S> using Avg = rc::kern::RC_KERN_NS::Avg<S>;
  template <class S> using Scale = rc::kern::RC_KERN_NS::Scale<S>;
  template <int kInf> using HalfMin = HalfMinMax<kInf, false>;
  template <int kInf> using HalfMax = HalfMinMax<kInf, true>;

  template <class K, class Op>
  static void run(void* dst, const void* a, const void* b, size_t n, double scale) {
    drive<K>(dst, a, b, n, Op(scale));
  }
};

#undef RC_KINLINE

}  // namespace RC_KERN_NS
}  // namespace kern
}  // namespace rc
