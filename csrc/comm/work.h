// A handle on one queued operation, the one Work type of every communicator. An operation has a
// host part (the header exchange and the slot hand-offs; on a CUDA communicator also the enqueue
// of the GPU work) and, on devices that run asynchronously, a device part after it (a
// DeviceFence: a CUDA event recorded after the enqueued work).
//  - The host part is completed exactly once, by the thread that ran it: complete(fence) or
//    fail(error).
//  - wait() waits for the host part, rethrows its error, then waits for the fence (which may
//    raise TimeoutError / PeerFailure / a device error of its own).
#pragma once
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace rc {

/// Completion of the device part of a Work.
class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
  /// true once the device work completed or failed (wait() then raises the failure).
  virtual bool query() = 0;
  /// Block the host until the device work completes. timeout_s < 0: bounded by the
  /// communicator's timeout (a TimeoutError then breaks the communicator); >= 0: TimeoutError
  /// after timeout_s, the work keeps running.
  virtual void wait(const std::string& op, uint64_t seq, double timeout_s) = 0;
  /// Make `stream` wait for the device work without blocking the host.
  virtual void stream_wait(void* stream) = 0;
};

class Work {
 public:
  explicit Work(std::string op, uint64_t seq) : op_(std::move(op)), seq_(seq) {}

  /// Block until done. timeout_s < 0 waits as long as the operation itself may take (its own
  /// waits are bounded by the communicator's timeout). Rethrows the operation's error.
  /// Throws rc::TimeoutError if timeout_s >= 0 elapses first (the operation keeps running).
  void wait(double timeout_s);
  /// The host part only (what a synchronous call returns after): as wait(), without the fence.
  void wait_host(double timeout_s);
  bool is_completed();
  /// Make a device stream wait for the operation: after its host part, without blocking the
  /// host on the device part. Nothing to do for work without a device part.
  void stream_wait(void* stream);
  /// -1 when not completed or succeeded; else the error's ErrorCode (error_message(): its text).
  int error_code();
  std::string error_message();
  const std::string& op() const { return op_; }
  uint64_t seq() const { return seq_; }
  /// A receive's source rank: set when its message is matched (before complete()), -1 before
  /// that and for every other operation.
  int source() const { return source_.load(std::memory_order_acquire); }
  void set_source(int r) { source_.store(r, std::memory_order_release); }

  void complete(std::shared_ptr<DeviceFence> fence = nullptr);
  void fail(std::exception_ptr e);

 private:
  std::string op_;
  uint64_t seq_;
  std::mutex mu_;
  std::condition_variable cv_;
  // done_ is written once, under mu_, after error_ and fence_ (release), and neither changes
  // afterwards: a reader that sees done_ set (acquire) may read them without the lock.
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::shared_ptr<DeviceFence> fence_;
  std::atomic<int> source_{-1};
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace rc
