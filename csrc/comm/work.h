// A handle on one queued operation. Completed exactly once, by the thread that ran it.
#pragma once
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace rc {

class Work {
 public:
  explicit Work(std::string op, uint64_t seq) : op_(std::move(op)), seq_(seq) {}

  /// Block until done. timeout_s < 0 waits as long as the operation itself may take (its own
  /// waits are bounded by the communicator's timeout). Rethrows the operation's error.
  /// Throws rc::TimeoutError if timeout_s >= 0 elapses first (the operation keeps running).
  void wait(double timeout_s);
  bool is_completed();
  /// -1 when not completed or succeeded; else the error's ErrorCode (error_message(): its text).
  int error_code();
  std::string error_message();
  const std::string& op() const { return op_; }
  uint64_t seq() const { return seq_; }

  void complete();
  void fail(std::exception_ptr e);

 private:
  std::string op_;
  uint64_t seq_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};


}  // namespace rc
