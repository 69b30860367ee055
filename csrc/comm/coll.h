// Collective codes (the header's `coll` word; the Python layer's COLL_CODES mirror them).
#pragma once
#include <cstdint>

namespace rc {

enum class Coll : uint32_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kReduce = 5,
  kBarrier = 6,
  kAllToAll = 7,
  kGather = 8,
  kScatter = 9,
  kRejected = 100,  // a rank refused its arguments; every rank raises
};
const char* coll_name(Coll c);

}  // namespace rc
