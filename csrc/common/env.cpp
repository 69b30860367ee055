#include "common/env.h"

#include <cstdlib>

#include "common/errors.h"

namespace rc {

int64_t env_int(const char* name, int64_t default_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_value;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  // Accept K/M/G suffixes (binary) for byte-sized knobs.
  if (end && *end) {
    switch (*end) {
      case 'k': case 'K': x <<= 10; ++end; break;
      case 'm': case 'M': x <<= 20; ++end; break;
      case 'g': case 'G': x <<= 30; ++end; break;
      default: break;
    }
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
  }
  RC_CHECK(end && *end == '\0', InvalidArgument, "environment knob " << name << "='" << v << "' is not an integer");
  return static_cast<int64_t>(x);
}

double env_double(const char* name, double default_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_value;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  RC_CHECK(end && *end == '\0', InvalidArgument, "environment knob " << name << "='" << v << "' is not a number");
  return x;
}

std::string env_str(const char* name, const std::string& default_value) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? default_value : std::string(v);
}

}  // namespace rc
