// The ONE place where dtype x op is dispatched on the CPU.
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

/// dst[i] = a[i] (op) b[i] for i < n. dst may alias a or b (exactly, not partially).
/// AVG combines like SUM; when `scale` != 1 the combined value is multiplied by `scale`
/// (the algorithm passes 1/N at the last reduction of a chunk). fp16/bf16 are widened to
/// fp32, combined (and scaled), and rounded back once (round to nearest even).
/// Integer SUM/PRODUCT wrap (two's complement), like numpy and torch.
void reduce_cpu(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op,
                double scale = 1.0);

/// dst[i] = src[i] * scale, floating dtypes only (AVG of a world of one, or a final division).
void scale_cpu(void* dst, const void* src, size_t n, DType dt, double scale);

}  // namespace rc
