// Liveness and interruption of the shm transport: this rank's state word (alive / closed /
// aborted with a kind and a message), the local interrupt of every wait (close() or abort() on
// another thread), and the checks a waiter makes of its peers, with the errors they raise.
//
// State word (one writer: the owner). abort() writes the kind and message, then stores kAborted
// with release; close() moves kAlive to kClosed with a seq_cst CAS. The first abort() wins
// (abort_claimed_), a later or concurrent one changes nothing, and nothing leaves kClosed or
// kAborted. A peer that acquires kAborted reads the kind and message; a closed peer is never
// dead (it may have exited).
//
// Peer liveness: a peer in this rank's PID namespace is probed by its pid (kill(pid, 0) and
// /proc/<pid>/stat zombie state); a peer in another namespace (or an unknown one) by its
// heartbeat word, which that peer's background thread bumps (transport/heartbeat.h): a heartbeat
// that has not moved for the larger of both ranks' RINGCOMM_HEARTBEAT_TIMEOUT_MS means dead. The
// mode per peer is fixed when the peer is mapped (on_mapped) and read-only afterwards; what this
// rank last saw of each heartbeat and when is written by any checking thread under hb_mu_.
//
// Local interrupt (this process only): 0 none, 1 closing, 2 aborting. interrupt_msg_ is written by
// the one thread that claims it (interrupt_claimed_) before the release store of 2, and never
// again; every waiting thread reads the word with acquire.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "transport/heartbeat.h"
#include "transport/shm_config.h"
#include "transport/shm_segments.h"
#include "transport/shm_types.h"

namespace rc {

class ShmLiveness {
 public:
  /// `cfg` and `segs` are the transport's: they outlive this part.
  ShmLiveness(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs);

  /// After this rank's segment was created: record its identity and start the heartbeat (peers
  /// learn whether they share our PID namespace only when they map the segment, and may check the
  /// heartbeat from then on; it beats until attach() has seen every peer).
  void on_created();
  /// When peer `p`'s segment `h` is mapped: its pid, namespace, liveness mode and bound.
  void on_mapped(int p, const shm_detail::SegmentHeader* h);
  /// After every peer is mapped: stop the heartbeat when no peer reads it.
  void stop_heartbeat_if_unused();
  /// Mark this rank closed (if alive, and mapped) and stop the heartbeat, before the unmap.
  void close();
  /// In a forked child: forget the heartbeat thread (it does not exist there).
  void forget_after_fork() { heartbeat_.forget_after_fork(); }

  /// Mark this rank aborted with a reason (see ShmControl::abort).
  void abort(uint32_t kind, const std::string& msg);

  void set_closing();
  void set_aborting(const std::string& msg);
  bool closing() const { return interrupt_.load(std::memory_order_acquire) != 0; }
  bool aborting() const { return interrupt_.load(std::memory_order_acquire) == 2; }
  /// The local interrupt as the error a wait raises, or null.
  std::exception_ptr interrupt_error(const WaitCtx& w) const;
  [[noreturn]] void fail_closing(const WaitCtx& w) const;

  /// Whether `peer`'s state word has left kAlive (closed or aborted; acquire).
  bool peer_left(int peer) const;
  /// Raise the error for `peer`'s state: its abort (kind and message), or its close.
  [[noreturn]] void fail_peer_state(int peer, const WaitCtx& w) const;
  /// Throw if a peer aborted or (with check_liveness) died.
  void check_peers(const WaitCtx& w, bool check_liveness) const;
  bool peer_dead(int peer) const;
  /// Whether `peer` shares this rank's PID namespace (after on_mapped): its header's pid names it here.
  bool same_pid_namespace_as(int peer) const { return by_heartbeat_[peer] == 0; }
  /// "op (seq s) on rank r, waiting for what from rank p at step i/n": the start of every error.
  std::string describe(const WaitCtx& w) const;
  /// How each peer's liveness is checked (ShmControl::describe_liveness).
  std::string describe_liveness() const;

 private:
  // The heartbeat half of peer_dead: whether `peer`'s heartbeat word has stayed at one value for
  // longer than its bound since this rank first saw that value.
  bool heartbeat_stale(int peer) const;
  [[noreturn]] void fail_dead(int peer, const WaitCtx& w) const;

  int rank_;
  int world_;
  const ShmConfig& cfg_;
  const ShmSegments& segs_;
  std::vector<pid_t> pids_;
  // Liveness mode per peer: true = heartbeat (another or an unknown PID namespace), false = pid
  // probe.
  std::vector<char> by_heartbeat_;
  std::vector<std::string> pidns_;        // every rank's PID-namespace identity (own included)
  std::vector<int64_t> hb_bound_ns_;      // max(own, peer's) heartbeat timeout
  mutable std::mutex hb_mu_;
  mutable std::vector<uint64_t> hb_seen_;
  mutable std::vector<int64_t> hb_seen_at_;
  Heartbeat heartbeat_;  // bumps this rank's own heartbeat word
  std::atomic<int> interrupt_{0};
  std::string interrupt_msg_;
  std::atomic<bool> interrupt_claimed_{false};
  std::atomic<bool> abort_claimed_{false};
};

}  // namespace rc
