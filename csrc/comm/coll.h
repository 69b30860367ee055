// Collective codes (the header's `coll` word).
#pragma once
#include <cstdint>

#include "common/enum_table.h"
#include "ringcomm/abi.h"

namespace rc {

// The collectives of the API: RC_COLLECTIVES in ringcomm/abi.h (csrc/include), whose
// entries are X(enumerator without k, code, name, reduces: its header carries a reduce op). Coll,
// coll_name, coll_reduces and the bindings' COLL_CODES are generated from it.
enum class Coll : uint32_t {
  RC_COLLECTIVES(RC_ENUM_ENUMERATOR)
  kRejected = 100,  // a rank refused its arguments; every rank raises
};
const char* coll_name(Coll c);
/// True for the collectives that combine values with a reduce op (the header's `op` word).
bool coll_reduces(Coll c);

}  // namespace rc
