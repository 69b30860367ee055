// The one monotonic clock of the library: CLOCK_MONOTONIC in nanoseconds. Every deadline, wait
// slice, heartbeat age and trace timestamp is read from it, so values taken anywhere in the
// process (and in other processes on the host: the clock is system-wide) compare directly.
#pragma once
#include <time.h>

#include <cstdint>

namespace rc {

/// CLOCK_MONOTONIC now, in nanoseconds (the clock std::chrono::steady_clock reads on Linux).
inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace rc
