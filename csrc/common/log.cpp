#include "common/log.h"

#include <unistd.h>

#include "common/errors.h"

namespace rc {

namespace detail {
std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarn)};
}

LogLevel set_log_level(const std::string& debug) {
  RC_CHECK(debug == "WARN" || debug == "INFO" || debug == "TRACE", InvalidArgument,
           "ringcomm: log level '" << debug << "' is not one of WARN, INFO, TRACE");
  LogLevel l = LogLevel::kWarn;
  if (debug == "INFO") l = LogLevel::kInfo;
  else if (debug == "TRACE") l = LogLevel::kTrace;
  detail::g_log_level.store(static_cast<int>(l), std::memory_order_relaxed);
  return l;
}

void log_line(int rank, int world, const std::string& msg) {
  std::string line = "ringcomm[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] " + msg + "\n";
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(2, p, left);
    if (n <= 0) return;  // stderr closed or full: logging never fails the caller
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace rc
