#include "common/knobs.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/errors.h"

namespace rc {

namespace {

using T = KnobType;

// The table, from the registry. Defaults are strings in the knob's own syntax so that the docs,
// config() and the parsers all show and parse the same text.
const std::vector<KnobInfo>& table() {
  static const std::vector<KnobInfo> t = {
#define RC_KNOB(NAME, field, kind, def, choices, doc) {#NAME, #field, T::kind, def, choices, doc, false},
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc) {#NAME, #field, T::kind, def, choices, doc, true},
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB
  };
  return t;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string accepted(const KnobInfo& k) {
  switch (k.type) {
    case T::kInt: return "an integer";
    case T::kFloat: return "a number";
    case T::kBytes: return "a byte count with an optional K/M/G suffix";
    case T::kStr: return "any text";
    case T::kChoice: {
      std::string out = "one of ";
      for (const char* p = k.choices; *p; ++p) out += (*p == '|') ? std::string(", ") : std::string(1, *p);
      return out;
    }
  }
  return "";
}

[[noreturn]] void bad_value(const KnobInfo& k, const std::string& v) {
  std::ostringstream o;
  o << "ringcomm: environment knob " << k.name << "='" << v << "' is not valid: expected " << accepted(k);
  throw InvalidArgument(o.str());
}

// The value's text: the environment's if set and non-empty, else the table's default.
std::string raw(const KnobInfo& k, bool* from_env) {
  const char* v = std::getenv(k.name);
  const bool set = v != nullptr && *v != '\0';
  if (from_env) *from_env = set;
  return set ? std::string(v) : std::string(k.default_value);
}

int64_t parse_int(const KnobInfo& k, const std::string& v, bool allow_suffix) {
  const char* s = v.c_str();
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s, &end, 0);
  if (end == s || errno == ERANGE) bad_value(k, v);
  if (allow_suffix && *end) {
    int shift = 0;
    switch (*end) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: bad_value(k, v);
    }
    ++end;
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
    x = static_cast<long long>(static_cast<unsigned long long>(x) << shift);
  }
  if (*end != '\0') bad_value(k, v);
  return static_cast<int64_t>(x);
}

std::string parse_choice(const KnobInfo& k, const std::string& v) {
  const std::string want = lower(v);
  std::string c = k.choices;
  size_t start = 0;
  for (;;) {
    size_t bar = c.find('|', start);
    std::string opt = c.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (lower(opt) == want) return opt;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  bad_value(k, v);
}

[[noreturn]] void wrong_type(const KnobInfo& k, const char* want) {
  std::ostringstream o;
  o << "ringcomm: knob " << k.name << " is a " << knob_type_name(k.type) << " knob, read as " << want;
  throw Error(o.str());
}

}  // namespace

const std::vector<KnobInfo>& knob_table() { return table(); }

const KnobInfo& knob_info(const std::string& name) {
  for (const auto& k : table())
    if (name == k.name) return k;
  throw Error("ringcomm: '" + name + "' is not a registered knob (csrc/common/knobs.def)");
}

const char* knob_type_name(KnobType t) {
  switch (t) {
    case T::kInt: return "int";
    case T::kFloat: return "float";
    case T::kBytes: return "bytes";
    case T::kStr: return "str";
    case T::kChoice: return "choice";
  }
  return "?";
}

bool knob_is_set(const KnobInfo& k) {
  bool set = false;
  raw(k, &set);
  return set;
}

bool parse_knob(const KnobInfo& k, int64_t* out) {
  if (k.type != T::kInt && k.type != T::kBytes) wrong_type(k, "an integer");
  bool set = false;
  const std::string v = raw(k, &set);
  if (!v.empty()) *out = parse_int(k, v, k.type == T::kBytes);
  return set;
}

bool parse_knob(const KnobInfo& k, double* out) {
  if (k.type != T::kFloat) wrong_type(k, "a number");
  bool set = false;
  const std::string v = raw(k, &set);
  if (v.empty()) return set;
  const char* s = v.c_str();
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE) bad_value(k, v);
  *out = x;
  return set;
}

bool parse_knob(const KnobInfo& k, std::string* out) {
  bool set = false;
  const std::string v = raw(k, &set);
  *out = k.type == T::kChoice ? parse_choice(k, v) : v;
  return set;
}

Knobs Knobs::read() {
  Knobs k;
#define RC_KNOB(NAME, field, kind, def, choices, doc) \
  k.set_[static_cast<size_t>(KnobId::field)] = parse_knob(knob_info(KnobId::field), &k.field);
#define RC_BUILD_KNOB(NAME, field, kind, def, choices, doc)
#include "common/knobs.def"
#undef RC_KNOB
#undef RC_BUILD_KNOB
  return k;
}

}  // namespace rc
