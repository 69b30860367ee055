// Logging to stderr, set by the knob RINGCOMM_DEBUG = WARN (default) | INFO | TRACE.
//   INFO  one line per communicator when it is created (transport, slot geometry, algorithm and
//         store-policy choices, reduce ISA, timeout);
//   TRACE also one line per collective (op, seq, dtype, count, algorithm, time).
// Every line starts "ringcomm[rank r/n]". The level is cached in an atomic that
// set_log_level() sets from the knob's field (Knobs::debug, when a communicator is created, and
// from ringcomm.core.config.logger); a disabled log statement costs one relaxed load and one branch.
#pragma once
#include <atomic>
#include <sstream>
#include <string>

namespace rc {

enum class LogLevel : int { kWarn = 0, kInfo = 1, kTrace = 2 };

namespace detail {
extern std::atomic<int> g_log_level;
}

/// Cache the level named by RINGCOMM_DEBUG's parsed value (Knobs::debug: WARN, INFO or TRACE);
/// returns it. Another text throws InvalidArgument.
LogLevel set_log_level(const std::string& debug);
inline bool log_enabled(LogLevel l) {
  return detail::g_log_level.load(std::memory_order_relaxed) >= static_cast<int>(l);
}
/// Write one line "ringcomm[rank r/n] <msg>\n" to stderr (one write call, so lines from
/// different threads and processes do not interleave).
void log_line(int rank, int world, const std::string& msg);

}  // namespace rc

// RC_LOG(level, rank, world, stream-expression): format and write only when the level is enabled.
#define RC_LOG(level, rank, world, msg_expr)                                   \
  do {                                                                         \
    if (::rc::log_enabled(::rc::LogLevel::level)) {                            \
      std::ostringstream rc_log_oss_;                                          \
      rc_log_oss_ << msg_expr;                                                 \
      ::rc::log_line((rank), (world), rc_log_oss_.str());                      \
    }                                                                          \
  } while (0)
