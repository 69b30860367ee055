#include "comm/work.h"

#include "common/errors.h"

namespace rc {

void Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_s < 0) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_; })) {
    RC_THROW(TimeoutError, "ringcomm: wait() on " << op_ << " (seq " << seq_ << ") timed out after " << timeout_s
                                                  << " s; the operation is still running");
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

int Work::error_code() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_ || !error_) return -1;
  return static_cast<int>(error_code_of(error_, nullptr));
}

std::string Work::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_ || !error_) return {};
  std::string msg;
  error_code_of(error_, &msg);
  return msg;
}

void Work::complete() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

void Work::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    error_ = e;
  }
  cv_.notify_all();
}

}  // namespace rc
