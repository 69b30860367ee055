// Whether the calling thread runs a synchronous call for a caller that is blocked on it: the
// fact the wait policy's `auto` reads (transport/shm_wait.h). A thread that executes a call
// inline (CommCore's synchronous calls) holds a CallerWaitScope for the call; the progress
// thread, the p2p engine and every other thread never do, so their waits assume the process may
// have work of its own for the CPU they would spin on.
#pragma once

namespace rc {

namespace caller_wait_detail {
inline thread_local bool t_caller_blocked = false;
}  // namespace caller_wait_detail

/// True while this thread runs a synchronous call inline (a CallerWaitScope is alive on it).
inline bool caller_blocked() { return caller_wait_detail::t_caller_blocked; }

/// Marks this thread's waits as a blocked caller's (or, `blocked` false, as not) for its
/// lifetime (nests; restores on exit).
class CallerWaitScope {
 public:
  explicit CallerWaitScope(bool blocked = true) : prev_(caller_wait_detail::t_caller_blocked) {
    caller_wait_detail::t_caller_blocked = blocked;
  }
  ~CallerWaitScope() { caller_wait_detail::t_caller_blocked = prev_; }
  CallerWaitScope(const CallerWaitScope&) = delete;
  CallerWaitScope& operator=(const CallerWaitScope&) = delete;

 private:
  bool prev_;
};

}  // namespace rc
