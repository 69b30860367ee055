#include "common/dtype.h"

#include "common/errors.h"

namespace rc {

namespace {

static_assert(enum_codes_dense({RC_DTYPES(RC_ENUM_CODE)}) &&
                  static_cast<int>(DType::kCount) == 0 RC_DTYPES(RC_ENUM_COUNT) &&
                  static_cast<int>(DType::kCount) == RC_DTYPE_COUNT,
              "RC_DTYPES: the codes are 0..kCount-1 in list order");
static_assert(enum_codes_dense({RC_REDUCE_OPS(RC_ENUM_CODE)}) &&
                  static_cast<int>(ReduceOp::kCount) == 0 RC_REDUCE_OPS(RC_ENUM_COUNT) &&
                  static_cast<int>(ReduceOp::kCount) == RC_REDUCE_OP_COUNT,
              "RC_REDUCE_OPS: the codes are 0..kCount-1 in list order");

// Indexed by the DType code (dense, checked above).
constexpr const char* kDTypeNames[] = {
#define RC_DTYPE_NAME_(name, code, bytes, str, ...) str,
    RC_DTYPES(RC_DTYPE_NAME_)
#undef RC_DTYPE_NAME_
};

// Indexed by the ReduceOp code (dense, checked above).
constexpr const char* kOpNames[] = {
#define RC_OP_NAME_(name, code, str, ...) str,
    RC_REDUCE_OPS(RC_OP_NAME_)
#undef RC_OP_NAME_
};

bool known(DType dt) { return static_cast<uint32_t>(dt) < static_cast<uint32_t>(DType::kCount); }

}  // namespace

size_t dtype_size(DType dt) {
  if (known(dt)) return static_cast<size_t>(rc_dtype_size(static_cast<int32_t>(dt)));
  RC_THROW(InvalidArgument, "unknown dtype code " << static_cast<uint32_t>(dt));
}

const char* dtype_name(DType dt) { return known(dt) ? kDTypeNames[static_cast<uint32_t>(dt)] : "unknown"; }

const char* op_name(ReduceOp op) {
  return static_cast<uint32_t>(op) < static_cast<uint32_t>(ReduceOp::kCount) ? kOpNames[static_cast<uint32_t>(op)]
                                                                             : "unknown";
}

bool is_floating(DType dt) { return known(dt) && rc_dtype_kind(static_cast<int32_t>(dt)) == RC_KIND_FLOAT; }

}  // namespace rc
