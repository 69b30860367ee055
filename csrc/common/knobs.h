// The knob registry: ONE static table of every RINGCOMM_* environment variable the project reads,
// C++ and Python alike (name, type, default, accepted values, one-line doc). Accessors read the
// environment at call time and parse it with the table's rule; call sites read their knobs when a
// communicator is created, never at import or static-initialisation time. Python reads knobs only
// through ringcomm._C.knob() (ringcomm.config.knob), so each knob has one parse rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rc {

/// How a knob's value is parsed.
///   kInt    decimal (or 0x) integer
///   kFloat  a number
///   kBytes  an integer with an optional binary K/M/G suffix (KiB, MB, ... accepted)
///   kStr    any text
///   kChoice one of `choices` (compared case-insensitively; returned as spelled in the table)
enum class KnobType { kInt, kFloat, kBytes, kStr, kChoice };

struct KnobInfo {
  const char* name;
  KnobType type;
  const char* default_value;  ///< in the knob's own syntax; "" = unset (the user of the knob decides)
  const char* choices;        ///< kChoice: accepted values separated by '|'; else ""
  const char* doc;            ///< one line
  bool build;                 ///< read by setup.py / CMake at build time, not at run time
};

/// Every registered knob, in the table's order.
const std::vector<KnobInfo>& knob_table();
/// The entry for `name`; an unregistered name throws rc::Error (a programming error).
const KnobInfo& knob_info(const std::string& name);
const char* knob_type_name(KnobType t);

/// True when the variable is set to a non-empty value.
bool knob_is_set(const std::string& name);
/// The current value, parsed with the knob's rule (the default when unset). A malformed value
/// throws rc::InvalidArgument naming the knob and what it accepts. knob_int accepts kInt and
/// kBytes knobs; knob_bytes requires kBytes; knob_str accepts any knob (its raw text, or the
/// normalised choice).
int64_t knob_int(const std::string& name);
double knob_double(const std::string& name);
int64_t knob_bytes(const std::string& name);
std::string knob_str(const std::string& name);

}  // namespace rc
