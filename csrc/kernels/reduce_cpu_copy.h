// One instruction-set copy of the typed loops (reduce_cpu_simd.h), compiled for the target it
// needs. NOT a normal header: reduce_cpu.cpp includes it once per copy, having defined that copy's
// RC_KERN_NS, RC_KERN_VBYTES, RC_KERN_AVX2 and RC_KERN_AVX512 (reduce_cpu_simd.h lists them); they
// are undefined at the end, so that each copy defines its own.
//
// A copy that may use AVX2 or AVX-512 intrinsics is compiled inside a target region (GCC:
// push_options / target; Clang: an attribute region) for exactly those instruction sets, never
// "fma": SUM/AVG must not be contracted. The baseline copy gets the build's own flags.

#define RC_KERN_STR_(...) #__VA_ARGS__
#define RC_KERN_PRAGMA_(...) _Pragma(RC_KERN_STR_(__VA_ARGS__))
#if RC_KERN_AVX512
#define RC_KERN_TARGET_ "avx512f,avx512bw,avx512vl,avx2,f16c"
#elif RC_KERN_AVX2
#define RC_KERN_TARGET_ "avx2,f16c"
#endif

#ifdef RC_KERN_TARGET_
#if defined(__clang__)
RC_KERN_PRAGMA_(clang attribute push(__attribute__((target(RC_KERN_TARGET_))), apply_to = function))
#else
#pragma GCC push_options
RC_KERN_PRAGMA_(GCC target(RC_KERN_TARGET_))
#endif
#endif

#include "kernels/reduce_cpu_simd.h"

#ifdef RC_KERN_TARGET_
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#undef RC_KERN_TARGET_
#endif
#undef RC_KERN_PRAGMA_
#undef RC_KERN_STR_
#undef RC_KERN_NS
#undef RC_KERN_VBYTES
#undef RC_KERN_AVX2
#undef RC_KERN_AVX512
