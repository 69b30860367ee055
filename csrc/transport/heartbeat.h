// Liveness of peers in another PID namespace: this process's PID-namespace identity, and the
// background thread that bumps a heartbeat word in this rank's segment header.
//
// Why: a rank probes a peer in its own PID namespace by pid (kill(pid, 0), /proc/<pid>/stat). A
// peer in another namespace (a container sharing /dev/shm but not PIDs) has a pid that means
// nothing here: the probe would report a live peer dead, or a dead one alive through an unrelated
// process. Such a peer is alive while its heartbeat word moves.
//
// Heartbeat word protocol (one writer): only the owner's Heartbeat thread writes it, with a
// relaxed increment every period; peers only load it (relaxed) and compare with the value they saw
// last. No data is published through the word, so no ordering beyond atomicity is needed. The
// thread runs from the segment's creation until the owner's attach() has seen every peer (then it
// stops if every peer shares the owner's namespace: nobody reads the word) or until close().
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace rc {

/// Bytes of the PID-namespace identity text stored in a segment header (with its NUL).
constexpr size_t kPidNsBytes = 64;

/// This process's PID-namespace identity as text: "pid:[<inode>]@<dev>" from
/// stat("/proc/self/ns/pid"), else "" (unknown: no /proc). In the test build
/// (RINGCOMM_TEST_HOOKS) a set test knob RINGCOMM_TEST_PIDNS replaces it with "test:<value>".
/// Two ranks share a namespace iff both identities are non-empty and equal; an unknown identity
/// shares none (the heartbeat works in every case, the pid probe only within one namespace).
std::string pid_namespace_id();

/// Whether identities `a` and `b` name one PID namespace (both known and equal).
bool same_pid_namespace(const std::string& a, const std::string& b);

/// A thread that increments *word every period_ns until stop().
class Heartbeat {
 public:
  Heartbeat() = default;
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  /// Start bumping `word` (which must outlive stop()). At most once per Heartbeat.
  void start(std::atomic<uint64_t>* word, int64_t period_ns);
  /// Stop the thread and join it (idempotent). After it returns nothing writes the word.
  void stop();
  /// In a forked child, where the thread does not exist: forget it without joining.
  void forget_after_fork();
  bool running() const { return thread_.joinable(); }

 private:
  void run(std::atomic<uint64_t>* word, int64_t period_ns);
  // 0 while running; stop() stores 1 and wakes the thread's futex sleep on it.
  std::atomic<uint32_t> stop_{0};
  std::thread thread_;
};

}  // namespace rc
