// dtype and reduce-op enums shared by every layer. Values are part of the wire header
// (the Communicator compares them across ranks), so never renumber them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace rc {

enum class DType : uint32_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
  kCount = 9,
};

enum class ReduceOp : uint32_t {
  kSum = 0,
  kProduct = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
  kCount = 8,
};

/// Size in bytes of one element; throws InvalidArgument on an unknown dtype.
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
const char* op_name(ReduceOp op);
bool is_floating(DType dt);

}  // namespace rc
