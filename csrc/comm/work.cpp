#include "comm/work.h"

#include "common/errors.h"

namespace rc {

void Work::wait_host(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_s < 0) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_; })) {
    RC_THROW(TimeoutError, "ringcomm: wait() on " << op_ << " (seq " << seq_ << ") timed out after " << timeout_s
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
    if (!done_) return false;
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

std::string Work::error_kind() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_ || !error_) return {};
  return error_kind_of(error_, nullptr);
}

std::string Work::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_ || !error_) return {};
  std::string msg;
  error_kind_of(error_, &msg);
  return msg;
}

void Work::complete(std::shared_ptr<DeviceFence> fence) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    fence_ = std::move(fence);
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

std::string error_kind_of(std::exception_ptr e, std::string* message) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    if (message) *message = x.what();
    return "TimeoutError";
  } catch (const PeerFailure& x) {
    if (message) *message = x.what();
    return "PeerFailure";
  } catch (const Mismatch& x) {
    if (message) *message = x.what();
    return "Mismatch";
  } catch (const InvalidArgument& x) {
    if (message) *message = x.what();
    return "InvalidArgument";
  } catch (const Unsupported& x) {
    if (message) *message = x.what();
    return "Unsupported";
  } catch (const Closed& x) {
    if (message) *message = x.what();
    return "Closed";
  } catch (const std::exception& x) {
    if (message) *message = x.what();
    return "Error";
  } catch (...) {
    if (message) *message = "unknown error";
    return "Error";
  }
}

}  // namespace rc
