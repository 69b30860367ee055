// dtype and reduce-op enums shared by every layer. Values are part of the wire header
// (the Communicator compares them across ranks), so never renumber them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/enum_table.h"
#include "ringcomm/abi.h"

namespace rc {

// The lists (RC_DTYPES, RC_REDUCE_OPS) and the op-support rule are ringcomm/abi.h's
// (csrc/include): DType, ReduceOp, dtype_size, dtype_name, op_name and is_floating are
// generated from them.
/// kCount: one past the last code (the codes are 0..kCount-1, checked in common/dtype.cpp).
enum class DType : uint32_t { RC_DTYPES(RC_ENUM_ENUMERATOR) kCount };
enum class ReduceOp : uint32_t { RC_REDUCE_OPS(RC_ENUM_ENUMERATOR) kCount };

/// Size in bytes of one element; throws InvalidArgument on an unknown dtype.
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
const char* op_name(ReduceOp op);
bool is_floating(DType dt);
/// The op-support rule (ringcomm/abi.h's rc_op_supported): whether `op` reduces `dt`; false for
/// codes outside the tables.
inline bool op_supported(DType dt, ReduceOp op) {
  return rc_op_supported(static_cast<int32_t>(dt), static_cast<int32_t>(op)) != 0;
}

}  // namespace rc
