#include "transport/heartbeat.h"

#include <sys/stat.h>

#include <sstream>

#include "transport/futex.h"
#ifdef RINGCOMM_TEST_HOOKS
#include "common/test_knobs.h"
#endif

namespace rc {

std::string pid_namespace_id() {
  std::string id;
#ifdef RINGCOMM_TEST_HOOKS
  if (const std::string fake = TestKnobs::read().test_pidns; !fake.empty()) {
    id = "test:" + fake;
  } else
#endif
  {
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) {
      std::ostringstream o;
      o << "pid:[" << static_cast<unsigned long long>(st.st_ino) << "]@" << static_cast<unsigned long long>(st.st_dev);
      id = o.str();
    }
  }
  if (id.size() >= kPidNsBytes) id.resize(kPidNsBytes - 1);
  return id;
}

bool same_pid_namespace(const std::string& a, const std::string& b) { return !a.empty() && a == b; }

void Heartbeat::start(std::atomic<uint64_t>* word, int64_t period_ns) {
  if (thread_.joinable()) return;
  stop_.store(0, std::memory_order_relaxed);
  thread_ = std::thread([this, word, period_ns] { run(word, period_ns); });
}

void Heartbeat::run(std::atomic<uint64_t>* word, int64_t period_ns) {
  while (stop_.load(std::memory_order_acquire) == 0) {
    word->fetch_add(1, std::memory_order_relaxed);
    futex_wait(&stop_, 0, period_ns);
  }
}

void Heartbeat::stop() {
  if (!thread_.joinable()) return;
  stop_.store(1, std::memory_order_release);
  futex_wake_all(&stop_);
  thread_.join();
}

void Heartbeat::forget_after_fork() {
  if (!thread_.joinable()) return;
  // The child inherited the handle of a thread that exists only in the parent: joining it is
  // undefined and destroying a joinable std::thread terminates. Moving the handle into a
  // deliberately leaked object leaves thread_ empty; the handle itself is a few bytes.
  static_cast<void>(new std::thread(std::move(thread_)));
}

}  // namespace rc
