// Instruction-set selection for the CPU reduce kernels (reduce_cpu.h is the interface everyone
// else uses; this header is for tests, benchmarks and logging).
#pragma once
#include <cstddef>

#include "common/dtype.h"

namespace rc {

/// Which compiled copy of the kernels runs.
///  kGeneric: portable vector-extension code (SSE2 on x86-64, NEON on aarch64, ...).
///  kAvx2:    AVX2 + F16C (x86-64 only; chosen when the CPU and OS support it).
///  kAvx512:  AVX-512 F/BW/VL (x86-64 only; RINGCOMM_CPU_ISA=avx512 or reduce_cpu_with_isa).
///            Bit-identical to the other copies.
enum class CpuIsa : int { kAuto = 0, kGeneric = 1, kAvx2 = 2, kAvx512 = 3 };

/// The copy reduce_cpu()/scale_cpu() use: picked once, at first use, from knob
/// RINGCOMM_CPU_ISA = auto (default: AVX2 where the CPU has it, else generic) | avx512 | avx2 | generic.
/// Throws InvalidArgument for a malformed knob or for avx2 on a CPU without AVX2+F16C.
CpuIsa reduce_cpu_isa();

/// "generic" / "avx2" / "avx512" / "auto".
const char* cpu_isa_name(CpuIsa isa);

/// Parses "auto" / "generic" / "avx2" / "avx512"; throws InvalidArgument otherwise.
CpuIsa parse_cpu_isa(const char* name);

/// True when this build and this CPU can run `isa` (kAuto and kGeneric: always).
bool cpu_isa_available(CpuIsa isa);

/// reduce_cpu / scale_cpu on an explicit copy (kAuto = reduce_cpu_isa()). Same validation and
/// errors as the plain entry points; InvalidArgument when `isa` is not available.
void reduce_cpu_with_isa(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op,
                         double scale, CpuIsa isa);
void scale_cpu_with_isa(void* dst, const void* src, size_t n, DType dt, double scale, CpuIsa isa);

}  // namespace rc
