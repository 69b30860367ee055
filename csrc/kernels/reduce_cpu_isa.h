// Instruction-set selection for the CPU reduce kernels (reduce_cpu.h is the interface everyone
// else uses; this header is for tests, benchmarks and logging).
#pragma once
#include <cstddef>
#include <string>

#include "common/dtype.h"

namespace rc {

/// Which compiled copy of the kernels runs.
///  kGeneric: portable vector-extension code (SSE2 on x86-64, NEON on aarch64, ...).
///  kAvx2:    AVX2 + F16C (x86-64 only; chosen when the CPU and OS support it).
///  kAvx512:  AVX-512 F/BW/VL (x86-64 only; RINGCOMM_CPU_ISA=avx512 or reduce_cpu_with_isa).
///            Bit-identical to the other copies.
enum class CpuIsa : int { kAuto = 0, kGeneric = 1, kAvx2 = 2, kAvx512 = 3 };

/// The copy reduce_cpu()/scale_cpu() use for dtype `dt`. Knob RINGCOMM_CPU_ISA (read once, at
/// first use) = avx512 | avx2 | generic forces one copy for every dtype; auto (default) takes
/// AVX-512 for bfloat16 where the CPU has it (its integer widen/round/narrow is compute bound on
/// 32-byte vectors), else AVX2 where present, else generic (float32/float16/integers gain nothing
/// measurable from 64-byte vectors: memory bound). Throws InvalidArgument for a malformed knob or
/// a forced copy this CPU/build cannot run.
CpuIsa reduce_cpu_isa(DType dt);

/// The auto choice in words for the INFO line, e.g. "avx2 (bfloat16 avx512)" or "generic".
std::string describe_reduce_cpu_isa();

/// "generic" / "avx2" / "avx512" / "auto".
const char* cpu_isa_name(CpuIsa isa);

/// Parses "auto" / "generic" / "avx2" / "avx512"; throws InvalidArgument otherwise.
CpuIsa parse_cpu_isa(const char* name);

/// True when this build and this CPU can run `isa` (kAuto and kGeneric: always).
bool cpu_isa_available(CpuIsa isa);

/// reduce_cpu / scale_cpu on an explicit copy (kAuto = reduce_cpu_isa(dt)). Same validation and
/// errors as the plain entry points; InvalidArgument when `isa` is not available.
void reduce_cpu_with_isa(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op,
                         double scale, CpuIsa isa);
void scale_cpu_with_isa(void* dst, const void* src, size_t n, DType dt, double scale, CpuIsa isa);

}  // namespace rc
