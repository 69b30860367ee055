#include "transport/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace rc {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000LL);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000LL);
  // EAGAIN (value changed), ETIMEDOUT and EINTR are all "go and look again" for the caller.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace rc
