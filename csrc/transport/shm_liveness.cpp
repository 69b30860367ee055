// Liveness and interruption (transport/shm_liveness.h): this rank's state word, the local
// interrupt of every wait, and the checks a waiter makes of its peers, with the errors they raise.
#include "transport/shm_liveness.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/errors.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

namespace {

// "rank 3", or "ranks 0-7,9-31" for several (ascending).
std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream o;
  o << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    o << (i == 0 ? "" : ",") << ranks[i];
    if (j > i) o << "-" << ranks[j];
    i = j + 1;
  }
  return o.str();
}

}  // namespace

ShmLiveness::ShmLiveness(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs)
    : rank_(rank), world_(world), cfg_(cfg), segs_(segs), pids_(world, 0), by_heartbeat_(world, 0), pidns_(world),
      hb_bound_ns_(world, 0), hb_seen_(world, 0), hb_seen_at_(world, 0) {}

void ShmLiveness::on_created() {
  SegmentHeader* h = segs_.header(rank_);
  pidns_[rank_] = std::string(h->pidns, strnlen(h->pidns, kPidNsBytes - 1));
  pids_[rank_] = getpid();
  heartbeat_.start(&h->heartbeat, h->hb_period_ns);
}

void ShmLiveness::on_mapped(int p, const SegmentHeader* h) {
  pids_[p] = h->pid;
  pidns_[p] = std::string(h->pidns, strnlen(h->pidns, kPidNsBytes - 1));
  by_heartbeat_[p] = same_pid_namespace(pidns_[rank_], pidns_[p]) ? 0 : 1;
  hb_bound_ns_[p] = std::max<int64_t>(cfg_.heartbeat_timeout_ns, h->hb_timeout_ns);
  std::lock_guard<std::mutex> lk(hb_mu_);
  hb_seen_[p] = h->heartbeat.load(std::memory_order_relaxed);
  hb_seen_at_[p] = now_ns();
}

// The relation is symmetric (same_pid_namespace), so when every peer shares our namespace no peer
// reads our heartbeat: stop it, and collectives run with no thread besides the core's.
void ShmLiveness::stop_heartbeat_if_unused() {
  if (std::none_of(by_heartbeat_.begin(), by_heartbeat_.end(), [](char b) { return b != 0; })) heartbeat_.stop();
}

void ShmLiveness::close() {
  if (segs_.mapped(rank_)) {
    SegmentHeader* h = segs_.header(rank_);
    uint32_t expected = static_cast<uint32_t>(PeerState::kAlive);
    h->state.v.compare_exchange_strong(expected, static_cast<uint32_t>(PeerState::kClosed),
                                       std::memory_order_seq_cst);
    if (h->state.waiters.load()) futex_wake_all(&h->state.v);
  }
  // After the state word says closed (peers then never judge us by the heartbeat), and before
  // the unmap (the thread writes our segment).
  heartbeat_.stop();
}

// One entry per way of checking a peer, with the peers it applies to: a line of fixed length at
// any world size where every peer shares our PID namespace.
std::string ShmLiveness::describe_liveness() const {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first appearance
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    std::ostringstream d;
    if (!by_heartbeat_[p]) {
      d << "pid probe (same PID namespace)";
    } else {
      d << "heartbeat (PID namespace " << (pidns_[p].empty() ? "unknown" : pidns_[p]) << ", ours "
        << (pidns_[rank_].empty() ? "unknown" : pidns_[rank_]) << "; dead after " << hb_bound_ns_[p] / 1000000
        << " ms still)";
    }
    const std::string desc = d.str();
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == desc; });
    if (g == groups.end()) {
      groups.push_back({desc, {p}});
    } else {
      g->second.push_back(p);
    }
  }
  std::ostringstream o;
  o << "liveness";
  if (groups.empty()) o << " -";
  for (size_t i = 0; i < groups.size(); ++i)
    o << (i == 0 ? ": " : ", ") << rank_list(groups[i].second) << " " << groups[i].first;
  return o.str();
}

void ShmLiveness::abort(uint32_t kind, const std::string& msg) {
  if (!segs_.mapped(rank_)) return;
  SegmentHeader* h = segs_.header(rank_);
  if (h->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAlive)) return;
  if (abort_claimed_.exchange(true, std::memory_order_acq_rel)) return;
  // kind and message first, then the state with release: a peer that acquires kAborted sees them.
  h->abort_kind = kind;
  size_t n = std::min(msg.size(), kAbortMsgBytes - 1);
  std::memcpy(h->abort_msg, msg.data(), n);
  h->abort_msg[n] = '\0';
  h->state.v.store(static_cast<uint32_t>(PeerState::kAborted), std::memory_order_release);
  // Wake every sleeper in our inbox and board promptly; others notice within a liveness slice.
  futex_wake_all(&h->doorbell.v);
  for (auto& e : h->board) futex_wake_all(&e.seq.v);
}

void ShmLiveness::set_closing() {
  int none = 0;
  interrupt_.compare_exchange_strong(none, 1, std::memory_order_acq_rel);
}

void ShmLiveness::set_aborting(const std::string& msg) {
  if (interrupt_claimed_.exchange(true)) return;
  interrupt_msg_ = msg;
  int none = 0;
  interrupt_.compare_exchange_strong(none, 2, std::memory_order_acq_rel);
}

std::exception_ptr ShmLiveness::interrupt_error(const WaitCtx& w) const {
  const int i = interrupt_.load(std::memory_order_acquire);
  if (i == 0) return nullptr;
  std::ostringstream o;
  o << "ringcomm: " << describe(w);
  if (i == 1) {
    o << ": the communicator on rank " << rank_ << " was closed while this call waited (close() from another thread)";
    return std::make_exception_ptr(Closed(o.str()));
  }
  o << ": " << interrupt_msg_;
  return std::make_exception_ptr(Error(o.str()));
}

std::string ShmLiveness::describe(const WaitCtx& w) const {
  std::ostringstream o;
  o << w.op << " (seq " << w.seq << ") on rank " << rank_;
  if (w.peer >= 0) {
    o << ", waiting for " << (w.what && *w.what ? w.what : "peer") << " from rank " << w.peer;
  } else if (w.what && *w.what) {
    o << ", waiting for " << w.what;
  }
  if (w.step >= 0) o << " at step " << w.step << (w.nsteps > 0 ? "/" + std::to_string(w.nsteps) : "");
  return o.str();
}

bool ShmLiveness::heartbeat_stale(int peer) const {
  const SegmentHeader* h = segs_.header(peer);
  const uint64_t v = h->heartbeat.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(hb_mu_);
  const int64_t now = now_ns();
  if (v != hb_seen_[peer]) {
    hb_seen_[peer] = v;
    hb_seen_at_[peer] = now;
    return false;
  }
  return now - hb_seen_at_[peer] > hb_bound_ns_[peer];
}

bool ShmLiveness::peer_dead(int peer) const {
  if (by_heartbeat_[peer]) return heartbeat_stale(peer);
  pid_t pid = pids_[peer];
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A killed child of someone else stays a zombie until reaped: dead for our purposes.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;  // no /proc: rely on kill()
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* rp = std::strrchr(buf, ')');
  if (rp == nullptr || rp[1] == '\0' || rp[2] == '\0') return false;
  char st = rp[2];
  return st == 'Z' || st == 'X';
}

bool ShmLiveness::peer_left(int peer) const {
  return segs_.header(peer)->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAlive);
}

void ShmLiveness::fail_peer_state(int peer, const WaitCtx& w) const {
  const SegmentHeader* h = segs_.header(peer);
  uint32_t st = h->state.v.load(std::memory_order_acquire);
  if (st == static_cast<uint32_t>(PeerState::kAborted)) {
    std::string msg(h->abort_msg, strnlen(h->abort_msg, kAbortMsgBytes));
    std::string text = "ringcomm: " + describe(w) + ": rank " + std::to_string(peer) + " failed: " + msg;
    const int code = static_cast<int>(h->abort_kind);
    throw_error(valid_error_code(code) ? static_cast<ErrorCode>(code) : ErrorCode::kPeerFailure, text);
  }
  RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer
                                     << " closed its communicator before completing this operation (rank " << peer
                                     << " closed)");
}

void ShmLiveness::fail_dead(int peer, const WaitCtx& w) const {
  if (!by_heartbeat_[peer]) {
    RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer << " (pid " << pids_[peer] << ") died");
  }
  int64_t still = 0;
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    still = now_ns() - hb_seen_at_[peer];
  }
  RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer << " (pid " << pids_[peer]
                                     << " in PID namespace " << (pidns_[peer].empty() ? "unknown" : pidns_[peer])
                                     << ") died: its heartbeat has not moved for " << still / 1000000
                                     << " ms (RINGCOMM_HEARTBEAT_TIMEOUT_MS: " << hb_bound_ns_[peer] / 1000000
                                     << " ms)");
}

void ShmLiveness::fail_closing(const WaitCtx& w) const { std::rethrow_exception(interrupt_error(w)); }

void ShmLiveness::check_peers(const WaitCtx& w, bool check_liveness) const {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const SegmentHeader* h = segs_.header(p);
    uint32_t st = h->state.v.load(std::memory_order_acquire);
    if (st == static_cast<uint32_t>(PeerState::kAborted)) fail_peer_state(p, w);
    // A peer that closed cleanly may have exited: it is closed, never dead. A wait on it raises
    // "closed" (the wait's state check, transport/shm_wait.h); other waits go on.
    if (st == static_cast<uint32_t>(PeerState::kClosed)) continue;
    if (check_liveness && peer_dead(p)) fail_dead(p, w);
  }
}

}  // namespace rc
