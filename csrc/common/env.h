// Named knobs: every tunable is an environment variable RINGCOMM_<NAME> read through these
// helpers at the place it is used. A malformed value raises InvalidArgument naming the knob.
#pragma once
#include <cstdint>
#include <string>

namespace rc {

int64_t env_int(const char* name, int64_t default_value);
double env_double(const char* name, double default_value);
std::string env_str(const char* name, const std::string& default_value);

}  // namespace rc
