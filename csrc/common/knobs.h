// The knob registry (common/knobs.def: one line per RINGCOMM_* environment variable) in its
// generated forms:
//   - knob_table(): name, field, type, default, accepted values, doc and build flag of every knob,
//     in the .def's order (the Python registry and docs/knobs.md are made from it);
//   - rc::Knobs: one typed field per runtime knob. Knobs::read() parses the environment once with
//     the table's rules; each communicator reads it when it is created and hands its layers the
//     fields (or the configurations built from them) they need. Code reads fields, never names.
//   - read_knob<KnobId::field>(): one knob now, for the process-wide values cached once
//     (RINGCOMM_CPU_ISA).
// A malformed value throws rc::InvalidArgument naming the knob and what it accepts. Nothing here
// reads the environment at import or static-initialisation time.
#pragma once
#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

namespace rc {

/// How a knob's value is parsed.
///   kInt    decimal (or 0x) integer
///   kFloat  a number
///   kBytes  an integer with an optional binary K/M/G suffix (KiB, MB, ... accepted)
///   kStr    any text
///   kChoice one of `choices` (compared case-insensitively; the value is the table's spelling)
enum class KnobType { kInt, kFloat, kBytes, kStr, kChoice };

/// A field's C++ type by knob type: integers and byte counts int64_t, numbers double, text and
/// choices std::string.
template <KnobType T> struct KnobValue { using type = std::string; };
template <> struct KnobValue<KnobType::kInt> { using type = int64_t; };
template <> struct KnobValue<KnobType::kBytes> { using type = int64_t; };
template <> struct KnobValue<KnobType::kFloat> { using type = double; };

struct KnobInfo {
  const char* name;           ///< the environment variable, RINGCOMM_<NAME>
  const char* field;          ///< its field in rc::Knobs (and ringcomm.core.config.read())
  KnobType type;
  const char* default_value;  ///< in the knob's own syntax; "" = unset (the user of the knob decides)
  const char* choices;        ///< kChoice: accepted values separated by '|'; else ""
  const char* doc;            ///< one line
  bool build;                 ///< read by setup.py / CMake at build time, not at run time
};

/// Every knob's index in knob_table(), named by its field.
enum class KnobId : int {
#define RC_KNOB(NAME, field, kind, def, choices, doc) field,
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc) field,
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB
  kCount
};

/// Every registered knob, in the .def's order (index = KnobId).
const std::vector<KnobInfo>& knob_table();
inline const KnobInfo& knob_info(KnobId id) { return knob_table()[static_cast<size_t>(id)]; }
/// The entry named `name`, for by-name lookups from Python (ringcomm.core.config.knob); an
/// unregistered name throws rc::Error (a programming error).
const KnobInfo& knob_info(const std::string& name);
const char* knob_type_name(KnobType t);

/// True when the environment sets knob `k` to a non-empty value (its value is not parsed).
bool knob_is_set(const KnobInfo& k);
/// Knob `k` read from the environment now and parsed with its rule into `out` (its default when
/// unset or empty; left as it is when unset without a default). Returns whether the variable is
/// set to a non-empty value. int64_t takes kInt and kBytes knobs, double kFloat ones, std::string
/// any (its text; a kChoice as the table spells it). A wrong type throws rc::Error.
bool parse_knob(const KnobInfo& k, int64_t* out);
bool parse_knob(const KnobInfo& k, double* out);
bool parse_knob(const KnobInfo& k, std::string* out);

/// Every runtime knob, typed: one field per RC_KNOB line of common/knobs.def, named by its
/// `field` column and documented by its `doc` column there.
struct Knobs {
#define RC_KNOB(NAME, field, kind, def, choices, doc) KnobValue<KnobType::kind>::type field{};
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc)
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB

  /// The environment parsed now, every runtime knob in the table's order; the first malformed
  /// value throws rc::InvalidArgument naming it.
  static Knobs read();
  /// True when the environment set knob `id` (to a non-empty value) at read().
  bool is_set(KnobId id) const { return set_[static_cast<size_t>(id)]; }

 private:
  std::bitset<static_cast<size_t>(KnobId::kCount)> set_;
};

/// The field type of knob `id`.
template <KnobId id> struct KnobField;
#define RC_KNOB(NAME, field, kind, def, choices, doc) \
  template <> struct KnobField<KnobId::field> { using type = KnobValue<KnobType::kind>::type; };
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc)
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB

/// One runtime knob read now, typed (the process-wide values cached once; a communicator reads
/// Knobs::read() instead).
template <KnobId id>
typename KnobField<id>::type read_knob() {
  typename KnobField<id>::type v{};
  parse_knob(knob_info(id), &v);
  return v;
}

}  // namespace rc
