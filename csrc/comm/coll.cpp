// The collective codes' names and properties (comm/coll.h), generated from RC_COLLECTIVES.
#include "comm/coll.h"

namespace rc {

const char* coll_name(Coll c) {
  switch (c) {
#define RC_COLL_NAME_CASE_(name, code, str, reduces) \
  case Coll::k##name:                               \
    return str;
    RC_COLLECTIVES(RC_COLL_NAME_CASE_)
#undef RC_COLL_NAME_CASE_
    case Coll::kRejected: return "rejected call";
  }
  return "unknown collective";
}

bool coll_reduces(Coll c) {
  // false || (reduces_1 && c == k1) || ... over the list.
#define RC_COLL_REDUCES_(name, code, str, reduces) || (reduces && c == Coll::k##name)
  return false RC_COLLECTIVES(RC_COLL_REDUCES_);
#undef RC_COLL_REDUCES_
}

}  // namespace rc
