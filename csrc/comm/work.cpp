#include "comm/work.h"

#include "common/errors.h"

namespace rc {

void Work::wait_host(double timeout_s) {
  if (done_.load(std::memory_order_acquire)) {  // a synchronous call's own work: already done
    if (error_) std::rethrow_exception(error_);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  // A timeout beyond ~30 years (or infinite) waits without one: converting it to the clock's
  // nanosecond duration would overflow into the past.
  if (timeout_s < 0 || !(timeout_s < 1e9)) {
    cv_.wait(lk, [&] { return done_.load(std::memory_order_relaxed); });
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                           [&] { return done_.load(std::memory_order_relaxed); })) {
    RC_THROW(TimeoutError, "ringcomm: wait() on " << op_ << " (seq " << seq_ << "): Timed out after " << timeout_s
                                                  << " s; the operation is still running");
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::wait(double timeout_s) {
  wait_host(timeout_s);
  std::shared_ptr<DeviceFence> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f = fence_;
  }
  if (f) f->wait(op_, seq_, timeout_s);
}

bool Work::is_completed() {
  std::shared_ptr<DeviceFence> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!done_.load(std::memory_order_relaxed)) return false;
    if (error_ || !fence_) return true;
    f = fence_;
  }
  return f->query();
}

void Work::stream_wait(void* stream) {
  wait_host(-1.0);
  std::shared_ptr<DeviceFence> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f = fence_;
  }
  if (f) f->stream_wait(stream);
}

int Work::error_code() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_.load(std::memory_order_relaxed) || !error_) return -1;
  return static_cast<int>(error_code_of(error_, nullptr));
}

std::string Work::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_.load(std::memory_order_relaxed) || !error_) return {};
  std::string msg;
  error_code_of(error_, &msg);
  return msg;
}

// The first of complete() / fail() decides the outcome; a later call changes nothing.
void Work::complete(std::shared_ptr<DeviceFence> fence) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    fence_ = std::move(fence);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void Work::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    error_ = e;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

}  // namespace rc
