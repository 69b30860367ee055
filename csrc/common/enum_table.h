// Helpers for the enum tables written as X-macro lists (RC_DTYPES, RC_REDUCE_OPS and
// RC_COLLECTIVES in ringcomm/abi.h, RC_ERROR_KINDS in common/errors.h). Every list
// entry is X(enumerator without its k, code, ...); each list is the one place its enum's
// enumerators, codes and per-value data are written, and every switch or table over that enum
// is generated from it.
#pragma once
#include <cstddef>

/// An enumerator per entry: k<name> = code,
#define RC_ENUM_ENUMERATOR(name, code, ...) k##name = code,
/// The entry's code, as an int initialiser: code,
#define RC_ENUM_CODE(name, code, ...) static_cast<int>(code),
/// +1 per entry: `0 RC_LIST(RC_ENUM_COUNT)` is the number of entries.
#define RC_ENUM_COUNT(...) +1

namespace rc {

/// True when codes[i] == i for every i: the list's codes are 0..N-1 in list order, so a table
/// generated from the list in list order is indexed by the code.
template <size_t N>
constexpr bool enum_codes_dense(const int (&codes)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (codes[i] != static_cast<int>(i)) return false;
  }
  return true;
}

}  // namespace rc
