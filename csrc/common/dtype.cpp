#include "common/dtype.h"

#include "common/errors.h"

namespace rc {

namespace {

static_assert(enum_codes_dense({RC_DTYPES(RC_ENUM_CODE)}) &&
                  static_cast<int>(DType::kCount) == 0 RC_DTYPES(RC_ENUM_COUNT),
              "RC_DTYPES: the codes are 0..kCount-1 in list order");
static_assert(enum_codes_dense({RC_REDUCE_OPS(RC_ENUM_CODE)}) &&
                  static_cast<int>(ReduceOp::kCount) == 0 RC_REDUCE_OPS(RC_ENUM_COUNT),
              "RC_REDUCE_OPS: the codes are 0..kCount-1 in list order");

struct DTypeInfo {
  size_t bytes;
  const char* name;
  bool floating;
};

// Indexed by the DType code (dense, checked above).
constexpr DTypeInfo kDTypes[] = {
#define RC_DTYPE_INFO_(name, code, bytes, str, floating) {bytes, str, floating},
    RC_DTYPES(RC_DTYPE_INFO_)
#undef RC_DTYPE_INFO_
};

// Indexed by the ReduceOp code (dense, checked above).
constexpr const char* kOpNames[] = {
#define RC_OP_NAME_(name, code, str) str,
    RC_REDUCE_OPS(RC_OP_NAME_)
#undef RC_OP_NAME_
};

bool known(DType dt) { return static_cast<uint32_t>(dt) < static_cast<uint32_t>(DType::kCount); }

}  // namespace

size_t dtype_size(DType dt) {
  if (known(dt)) return kDTypes[static_cast<uint32_t>(dt)].bytes;
  RC_THROW(InvalidArgument, "unknown dtype code " << static_cast<uint32_t>(dt));
}

const char* dtype_name(DType dt) { return known(dt) ? kDTypes[static_cast<uint32_t>(dt)].name : "unknown"; }

const char* op_name(ReduceOp op) {
  return static_cast<uint32_t>(op) < static_cast<uint32_t>(ReduceOp::kCount) ? kOpNames[static_cast<uint32_t>(op)]
                                                                             : "unknown";
}

bool is_floating(DType dt) { return known(dt) && kDTypes[static_cast<uint32_t>(dt)].floating; }

}  // namespace rc
