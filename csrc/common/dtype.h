// dtype and reduce-op enums shared by every layer. Values are part of the wire header
// (the Communicator compares them across ranks), so never renumber them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/enum_table.h"

namespace rc {

/// The dtypes: X(enumerator without k, code, element bytes, name, floating). DType,
/// dtype_size, dtype_name and is_floating are generated from this list (common/enum_table.h).
#define RC_DTYPES(X)                  \
  X(Float32, 0, 4, "float32", true)   \
  X(Float64, 1, 8, "float64", true)   \
  X(Float16, 2, 2, "float16", true)   \
  X(BFloat16, 3, 2, "bfloat16", true) \
  X(Int8, 4, 1, "int8", false)        \
  X(UInt8, 5, 1, "uint8", false)      \
  X(Int32, 6, 4, "int32", false)      \
  X(Int64, 7, 8, "int64", false)      \
  X(Bool, 8, 1, "bool", false)

/// The reduce ops: X(enumerator without k, code, name). ReduceOp and op_name are generated from it.
#define RC_REDUCE_OPS(X) \
  X(Sum, 0, "SUM")       \
  X(Product, 1, "PRODUCT") \
  X(Min, 2, "MIN")       \
  X(Max, 3, "MAX")       \
  X(Avg, 4, "AVG")       \
  X(Band, 5, "BAND")     \
  X(Bor, 6, "BOR")       \
  X(Bxor, 7, "BXOR")

/// kCount: one past the last code (the codes are 0..kCount-1, checked in common/dtype.cpp).
enum class DType : uint32_t { RC_DTYPES(RC_ENUM_ENUMERATOR) kCount };
enum class ReduceOp : uint32_t { RC_REDUCE_OPS(RC_ENUM_ENUMERATOR) kCount };

/// Size in bytes of one element; throws InvalidArgument on an unknown dtype.
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
const char* op_name(ReduceOp op);
bool is_floating(DType dt);

}  // namespace rc
