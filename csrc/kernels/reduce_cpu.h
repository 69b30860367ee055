// The ONE place where dtype x op is dispatched on the CPU (the switch is in reduce_cpu.cpp; the
// typed loops in reduce_cpu_simd.h; instruction-set selection in reduce_cpu_isa.h).
#pragma once
#include <cstddef>

#include "common/dtype.h"

namespace rc {

/// True when (dtype, op) is a supported reduction.
///  - SUM, PRODUCT, MIN, MAX: every numeric dtype; bool only for MIN (logical and) and MAX (logical or).
///  - AVG: floating dtypes only.
///  - BAND, BOR, BXOR: integer dtypes (int8, uint8, int32, int64) only.
bool reduce_supported(DType dt, ReduceOp op);

/// Throws rc::Unsupported naming the pair when reduce_supported() is false.
void check_reduce_supported(DType dt, ReduceOp op);

/// dst[i] = a[i] (op) b[i] for i < n. dst may alias a or b (exactly, not partially: a partial
/// overlap throws InvalidArgument). n may be 0. Single-threaded; no allocation; thread-safe.
/// AVG combines like SUM; when `scale` != 1 the combined value is multiplied by `scale`
/// (the algorithm passes 1/N at the last reduction of a chunk), in float for fp32/fp16/bf16
/// (scale is first rounded to float) and in double for fp64. Only AVG takes a scale: any other
/// op with scale != 1 throws InvalidArgument. fp16/bf16 are widened to fp32, combined (and
/// scaled), and rounded back once (round to nearest even).
/// MIN/MAX on floating dtypes: r = (a < b || isnan(a)) ? a : b (MAX with >), numpy's rule: a NaN
/// in either input gives NaN, and r is always one of the inputs bit for bit. bool: MIN is logical
/// and, MAX logical or (any nonzero byte is true; the result is 0 or 1).
/// Integer SUM/PRODUCT wrap (two's complement), like numpy and torch.
/// Errors: rc::Unsupported for an unsupported (dtype, op) pair (checked even when n == 0),
/// rc::InvalidArgument for unknown codes, null buffers with n > 0, or the misuse above.
void reduce_cpu(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op,
                double scale = 1.0);

/// dst[i] = src[i] * scale, floating dtypes only (AVG of a world of one, or a final division);
/// rc::Unsupported for other dtypes. dst may alias src exactly. Same arithmetic as AVG's scaling.
void scale_cpu(void* dst, const void* src, size_t n, DType dt, double scale);

}  // namespace rc
