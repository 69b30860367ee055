#include "comm/store_policy.h"

#include <string>

#include "common/knobs.h"
#include "common/errors.h"

namespace rc {

StorePolicy::StorePolicy() {
  const std::string m = knob_str("RINGCOMM_STREAM");
  RC_CHECK(m == "auto" || m == "on" || m == "off", InvalidArgument,
           "ringcomm: RINGCOMM_STREAM='" << m << "' is not one of auto, on, off");
  mode_ = m == "on" ? kOn : (m == "off" ? kOff : kAuto);
  const int64_t mb = knob_bytes("RINGCOMM_STREAM_MIN_BYTES");
  RC_CHECK(mb >= 0, InvalidArgument, "ringcomm: RINGCOMM_STREAM_MIN_BYTES must be >= 0, got " << mb);
  min_bytes_ = static_cast<uint64_t>(mb);
  const int64_t pe = knob_int("RINGCOMM_STREAM_PROBE_EVERY");
  RC_CHECK(pe >= 2, InvalidArgument, "ringcomm: RINGCOMM_STREAM_PROBE_EVERY must be >= 2, got " << pe);
  probe_every_ = static_cast<uint64_t>(pe);
}

std::string StorePolicy::describe() const {
  if (mode_ == kOn) return "on";
  if (mode_ == kOff) return "off";
  return "auto (measured from " + std::to_string(min_bytes_) + " B, probe every " + std::to_string(probe_every_) + ")";
}

StorePolicy::Choice StorePolicy::choose(uint64_t bytes, int kind) {
  Choice c;
  if (mode_ != kAuto) {
    c.stream = mode_ == kOn;
    return c;
  }
  if (bytes < min_bytes_ || bytes == 0 || kind < 0 || kind >= kKinds) return c;
  const int cls = kind * 64 + (63 - __builtin_clzll(bytes));
  Class& k = classes_[cls];
  const uint64_t n = k.calls++;
  if (n == 0) return c;  // the first of its size warms caches and pages up: cached, not measured
  c.cls = cls;
  if (n == 1 || k.ns_per_byte[0] == 0) {
    c.stream = false;
  } else if (n == 2 || k.ns_per_byte[1] == 0) {
    c.stream = true;
  } else {
    const bool best = k.ns_per_byte[1] < k.ns_per_byte[0];
    c.stream = (n % probe_every_ == 0) ? !best : best;
  }
  return c;
}

void StorePolicy::record(const Choice& c, uint64_t bytes, int64_t ns) {
  if (c.cls < 0 || bytes == 0 || ns <= 0) return;
  double& e = classes_[c.cls].ns_per_byte[c.stream ? 1 : 0];
  const double v = static_cast<double>(ns) / static_cast<double>(bytes);
  e = (e == 0) ? v : 0.5 * (e + v);
}

}  // namespace rc
