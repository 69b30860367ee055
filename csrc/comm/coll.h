// Collective codes (the header's `coll` word).
#pragma once
#include <cstdint>

#include "common/enum_table.h"

namespace rc {

/// The collectives of the API: X(enumerator without k, code, name, reduces: its header carries
/// a reduce op). Coll, coll_name, coll_reduces and the bindings' COLL_CODES are generated from it
/// (the Python layer's COLL_CODES mirrors them).
#define RC_COLLECTIVES(X)                      \
  X(AllReduce, 1, "all_reduce", true)          \
  X(ReduceScatter, 2, "reduce_scatter", true)  \
  X(AllGather, 3, "all_gather", false)         \
  X(Broadcast, 4, "broadcast", false)          \
  X(Reduce, 5, "reduce", true)                 \
  X(Barrier, 6, "barrier", false)              \
  X(AllToAll, 7, "all_to_all", false)          \
  X(Gather, 8, "gather", false)                \
  X(Scatter, 9, "scatter", false)

enum class Coll : uint32_t {
  RC_COLLECTIVES(RC_ENUM_ENUMERATOR)
  kRejected = 100,  // a rank refused its arguments; every rank raises
};
const char* coll_name(Coll c);
/// True for the collectives that combine values with a reduce op (the header's `op` word).
bool coll_reduces(Coll c);

}  // namespace rc
