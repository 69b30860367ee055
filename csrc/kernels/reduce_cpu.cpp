// CPU reduce kernels: validation, instruction-set selection, and THE dtype x op switch.
//
// How dispatch works:
//  1. reduce_cpu_simd.h holds the typed loops (written once with vector extensions). It is
//     included three times below, each through reduce_cpu_copy.h (which opens and closes the
//     copy's target region): as namespace `generic` (16-byte vectors, the build's baseline
//     flags) and, on x86-64, as namespace `avx2` inside `#pragma GCC target("avx2,f16c")` (32-byte
//     vectors, F16C conversions) and as namespace `avx512` inside
//     `#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c")` (64-byte vectors). The library is
//     therefore built WITHOUT -mavx2/-mavx512* and still runs on any x86-64; nothing here needs
//     special compile flags. Every copy computes the same bits (the loops are the same source;
//     only the vector width and the conversion instructions differ, and those are exact).
//  2. select<Isa>(dtype, op) below is the only dtype x op switch on the CPU. It returns a pointer
//     to one fully typed loop (`Isa::run<Kind, Op>`), or nullptr for an unsupported pair;
//     reduce_supported() is defined by that same switch so the two can never disagree.
//  3. The copy (generic / avx2 / avx512) is chosen once per process from __builtin_cpu_supports and the
//     knob RINGCOMM_CPU_ISA; each call then does one switch and one indirect call, and the inner
//     loop has no per-element branching on dtype or op.
#include "kernels/reduce_cpu.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/knobs.h"
#include "common/errors.h"
#include "kernels/reduce_cpu_isa.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
// NaN/inf semantics and exact rounding are part of this file's contract.
#error "reduce_cpu.cpp must not be built with -ffast-math or -ffinite-math-only"
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define RC_KERN_HAVE_X86 1
#include <immintrin.h>
#else
#define RC_KERN_HAVE_X86 0
#endif

// 16-byte vector types in the generic copy avoid any psabi/ABI notes; everything in the copies
// is always_inline'd into the typed entry points anyway.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12's avx512fintrin.h initialises the unused half of vcvtph2ps/vcvtps2ph from
// _mm512_undefined_*(), which -Wmaybe-uninitialized reports at every inlined use (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define RC_KERN_NS generic
#define RC_KERN_VBYTES 16
#define RC_KERN_AVX2 0
#define RC_KERN_AVX512 0
#include "kernels/reduce_cpu_copy.h"

#if RC_KERN_HAVE_X86
#define RC_KERN_NS avx2
#define RC_KERN_VBYTES 32
#define RC_KERN_AVX2 1
#define RC_KERN_AVX512 0
#include "kernels/reduce_cpu_copy.h"

#define RC_KERN_NS avx512
#define RC_KERN_VBYTES 64
#define RC_KERN_AVX2 0
#define RC_KERN_AVX512 1
#include "kernels/reduce_cpu_copy.h"
#endif  // RC_KERN_HAVE_X86

#pragma GCC diagnostic pop

namespace rc {
namespace {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t n, double scale);

constexpr int kF16InfBits = 0x7C00;
constexpr int kBF16InfBits = 0x7F80;

// ----- THE dtype x op switch (per instruction-set copy I) ------------------------------------

template <class I, class K, class S>
ReduceFn select_float(ReduceOp op) {  // float32 / float64
  switch (op) {
    case ReduceOp::kSum: return &I::template run<K, typename I::Sum>;
    case ReduceOp::kProduct: return &I::template run<K, typename I::Prod>;
    case ReduceOp::kMin: return &I::template run<K, typename I::MinF>;
    case ReduceOp::kMax: return &I::template run<K, typename I::MaxF>;
    case ReduceOp::kAvg: return &I::template run<K, typename I::template Avg<S>>;
    default: return nullptr;  // bitwise ops
  }
}

template <class I, class K, int kInf>
ReduceFn select_half(ReduceOp op) {  // float16 / bfloat16: arithmetic in fp32, MIN/MAX on bits
  switch (op) {
    case ReduceOp::kSum: return &I::template run<K, typename I::Sum>;
    case ReduceOp::kProduct: return &I::template run<K, typename I::Prod>;
    case ReduceOp::kMin: return &I::template run<typename I::HalfBits, typename I::template HalfMin<kInf>>;
    case ReduceOp::kMax: return &I::template run<typename I::HalfBits, typename I::template HalfMax<kInf>>;
    case ReduceOp::kAvg: return &I::template run<K, typename I::template Avg<float>>;
    default: return nullptr;  // bitwise ops
  }
}

template <class I, class K>
ReduceFn select_int(ReduceOp op) {  // int8 / uint8 / int32 / int64
  switch (op) {
    case ReduceOp::kSum: return &I::template run<K, typename I::SumWrap>;
    case ReduceOp::kProduct: return &I::template run<K, typename I::ProdWrap>;
    case ReduceOp::kMin: return &I::template run<K, typename I::MinI>;
    case ReduceOp::kMax: return &I::template run<K, typename I::MaxI>;
    case ReduceOp::kBand: return &I::template run<K, typename I::BAnd>;
    case ReduceOp::kBor: return &I::template run<K, typename I::BOr>;
    case ReduceOp::kBxor: return &I::template run<K, typename I::BXor>;
    default: return nullptr;  // AVG
  }
}

template <class I>
ReduceFn select_bool(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return &I::template run<typename I::Bool, typename I::LAnd>;
    case ReduceOp::kMax: return &I::template run<typename I::Bool, typename I::LOr>;
    default: return nullptr;
  }
}

template <class I>
ReduceFn select(DType dt, ReduceOp op) {
  switch (dt) {
    case DType::kFloat32: return select_float<I, typename I::F32, float>(op);
    case DType::kFloat64: return select_float<I, typename I::F64, double>(op);
    case DType::kFloat16: return select_half<I, typename I::F16, kF16InfBits>(op);
    case DType::kBFloat16: return select_half<I, typename I::BF16, kBF16InfBits>(op);
    case DType::kInt8: return select_int<I, typename I::I8>(op);
    case DType::kUInt8: return select_int<I, typename I::U8>(op);
    case DType::kInt32: return select_int<I, typename I::I32>(op);
    case DType::kInt64: return select_int<I, typename I::I64>(op);
    case DType::kBool: return select_bool<I>(op);
    default: return nullptr;
  }
}

template <class I>
ReduceFn select_scale(DType dt) {  // scale_cpu: floating dtypes only
  switch (dt) {
    case DType::kFloat32: return &I::template run<typename I::F32, typename I::template Scale<float>>;
    case DType::kFloat64: return &I::template run<typename I::F64, typename I::template Scale<double>>;
    case DType::kFloat16: return &I::template run<typename I::F16, typename I::template Scale<float>>;
    case DType::kBFloat16: return &I::template run<typename I::BF16, typename I::template Scale<float>>;
    default: return nullptr;
  }
}

// ----- instruction-set selection -------------------------------------------------------------

bool cpu_has_avx2_f16c() {
#if RC_KERN_HAVE_X86
  // __builtin_cpu_supports also checks that the OS saves the YMM state (XGETBV).
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if RC_KERN_HAVE_X86
  // __builtin_cpu_supports("avx512f") also checks that the OS saves the ZMM/opmask state.
  __builtin_cpu_init();
  return cpu_has_avx2_f16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

CpuIsa resolve(CpuIsa isa, DType dt) {
  if (isa == CpuIsa::kAuto) return reduce_cpu_isa(dt);
  RC_CHECK(cpu_isa_available(isa), InvalidArgument,
           "ringcomm: CPU reduce kernels for " << cpu_isa_name(isa)
                                               << " are not available on this CPU/build");
  return isa;
}

ReduceFn lookup(CpuIsa isa, DType dt, ReduceOp op) {
#if RC_KERN_HAVE_X86
  if (isa == CpuIsa::kAvx2) return select<kern::avx2::Isa>(dt, op);
  if (isa == CpuIsa::kAvx512) return select<kern::avx512::Isa>(dt, op);
#endif
  (void)isa;
  return select<kern::generic::Isa>(dt, op);
}

ReduceFn lookup_scale(CpuIsa isa, DType dt) {
#if RC_KERN_HAVE_X86
  if (isa == CpuIsa::kAvx2) return select_scale<kern::avx2::Isa>(dt);
  if (isa == CpuIsa::kAvx512) return select_scale<kern::avx512::Isa>(dt);
#endif
  (void)isa;
  return select_scale<kern::generic::Isa>(dt);
}

// ----- validation ----------------------------------------------------------------------------

bool valid_dtype(DType dt) {
  return static_cast<uint32_t>(dt) < static_cast<uint32_t>(DType::kCount);
}
bool valid_op(ReduceOp op) {
  return static_cast<uint32_t>(op) < static_cast<uint32_t>(ReduceOp::kCount);
}

void check_codes(DType dt, ReduceOp op) {
  RC_CHECK(valid_dtype(dt), InvalidArgument, "ringcomm: unknown dtype code " << static_cast<uint32_t>(dt));
  RC_CHECK(valid_op(op), InvalidArgument, "ringcomm: unknown reduce op code " << static_cast<uint32_t>(op));
}

// dst must be the same buffer as src or not overlap it at all (a partial overlap would read
// elements this very call has already overwritten).
void check_alias(const void* dst, const void* src, size_t bytes, const char* src_name) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const bool disjoint = d + bytes <= s || s + bytes <= d;
  RC_CHECK(d == s || disjoint, InvalidArgument,
           "ringcomm: reduce dst partially overlaps " << src_name
                                                      << " (it must alias it exactly or not at all)");
}

size_t checked_bytes(size_t n, DType dt) {
  const size_t esz = dtype_size(dt);
  RC_CHECK(n <= SIZE_MAX / esz, InvalidArgument,
           "ringcomm: element count " << n << " overflows size_t bytes");
  return n * esz;
}

}  // namespace

// ----- public API ----------------------------------------------------------------------------

bool reduce_supported(DType dt, ReduceOp op) {
  if (!valid_dtype(dt) || !valid_op(op)) return false;
  return select<kern::generic::Isa>(dt, op) != nullptr;  // both copies share the same switch
}

void check_reduce_supported(DType dt, ReduceOp op) {
  check_codes(dt, op);
  if (!reduce_supported(dt, op)) {
    RC_THROW(Unsupported,
             "ringcomm: reduce op " << op_name(op) << " is not supported for dtype " << dtype_name(dt));
  }
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kGeneric: return "generic";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(const char* name) {
  const std::string s = name ? name : "";
  if (s == "auto") return CpuIsa::kAuto;
  if (s == "generic") return CpuIsa::kGeneric;
  if (s == "avx2") return CpuIsa::kAvx2;
  if (s == "avx512") return CpuIsa::kAvx512;
  RC_THROW(InvalidArgument, "ringcomm: unknown CPU ISA '" << s << "' (expected auto, generic, avx2 or avx512)");
}

bool cpu_isa_available(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kGeneric: return true;
    case CpuIsa::kAvx2: return cpu_has_avx2_f16c();
    case CpuIsa::kAvx512: return cpu_has_avx512();
  }
  return false;
}

namespace {
// Knob RINGCOMM_CPU_ISA (auto|avx512|avx2|generic), read once; the static is immutable afterwards.
CpuIsa knob_cpu_isa() {
  static const CpuIsa isa = [] {
    const std::string v = read_knob<KnobId::cpu_isa>();
    RC_CHECK(v == "auto" || v == "generic" || v == "avx2" || v == "avx512", InvalidArgument,
             "ringcomm: RINGCOMM_CPU_ISA='" << v << "' is not one of auto, generic, avx2, avx512");
    const CpuIsa want = parse_cpu_isa(v.c_str());
    RC_CHECK(cpu_isa_available(want), InvalidArgument,
             "ringcomm: RINGCOMM_CPU_ISA=" << cpu_isa_name(want) << " is not available on this CPU/build");
    return want;
  }();
  return isa;
}
}  // namespace

CpuIsa reduce_cpu_isa(DType dt) {
  const CpuIsa knob = knob_cpu_isa();
  if (knob != CpuIsa::kAuto) return knob;
  if (dt == DType::kBFloat16 && cpu_has_avx512()) return CpuIsa::kAvx512;
  return cpu_has_avx2_f16c() ? CpuIsa::kAvx2 : CpuIsa::kGeneric;
}

std::string describe_reduce_cpu_isa() {
  const CpuIsa base = reduce_cpu_isa(DType::kFloat32), bf16 = reduce_cpu_isa(DType::kBFloat16);
  if (bf16 == base) return cpu_isa_name(base);
  return std::string(cpu_isa_name(base)) + " (bfloat16 " + cpu_isa_name(bf16) + ")";
}

void reduce_cpu_with_isa(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op,
                         double scale, CpuIsa isa) {
  check_reduce_supported(dt, op);
  RC_CHECK(op == ReduceOp::kAvg || scale == 1.0, InvalidArgument,
           "ringcomm: scale " << scale << " given for reduce op " << op_name(op)
                               << " (only AVG takes a scale)");
  const CpuIsa use = resolve(isa, dt);
  if (n == 0) return;
  RC_CHECK(dst != nullptr && a != nullptr && b != nullptr, InvalidArgument,
           "ringcomm: reduce_cpu got a null buffer for " << n << " elements");
  const size_t bytes = checked_bytes(n, dt);
  check_alias(dst, a, bytes, "a");
  check_alias(dst, b, bytes, "b");
  // AVG with scale 1 is SUM bit for bit (x * 1 == x); skip the multiply.
  const ReduceOp eff = (op == ReduceOp::kAvg && scale == 1.0) ? ReduceOp::kSum : op;
  lookup(use, dt, eff)(dst, a, b, n, scale);
}

void scale_cpu_with_isa(void* dst, const void* src, size_t n, DType dt, double scale, CpuIsa isa) {
  RC_CHECK(valid_dtype(dt), InvalidArgument, "ringcomm: unknown dtype code " << static_cast<uint32_t>(dt));
  if (!is_floating(dt)) {
    RC_THROW(Unsupported,
             "ringcomm: scale is not supported for dtype " << dtype_name(dt) << " (floating dtypes only)");
  }
  const CpuIsa use = resolve(isa, dt);
  if (n == 0) return;
  RC_CHECK(dst != nullptr && src != nullptr, InvalidArgument,
           "ringcomm: scale_cpu got a null buffer for " << n << " elements");
  check_alias(dst, src, checked_bytes(n, dt), "src");
  // b = src as well: the Scale op ignores it (same cache lines, so the extra loads are free).
  lookup_scale(use, dt)(dst, src, src, n, scale);
}

void reduce_cpu(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) {
  reduce_cpu_with_isa(dst, a, b, n, dt, op, scale, CpuIsa::kAuto);
}

void scale_cpu(void* dst, const void* src, size_t n, DType dt, double scale) {
  scale_cpu_with_isa(dst, src, n, dt, scale, CpuIsa::kAuto);
}

}  // namespace rc
