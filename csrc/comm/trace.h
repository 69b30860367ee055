// Per-phase timestamps of the last N collectives of one communicator (RINGCOMM_TRACE=N; 0, the
// default, records nothing). Each record holds CLOCK_MONOTONIC nanoseconds for the phases of one
// call, the collective, its bytes, its sequence number and the selection that ran it (algorithm, protocol, store):
//   entry         the communicator core took the call (before the local argument checks)
//   header_posted this rank is about to post its header (exchange_headers' first store, or
//                 the first store of the LL outbox, whose line 0 carries the header)
//   header_seen   every peer's header has been read (the exchange returned)
//   first_slot    the first slot this rank handed off to a peer (send_post)
//   last_slot     the last slot event of the call: a slot handed off or a slot received
//   exit          the host part finished (stamped just before the Work is marked complete, so
//                 a caller that waited on the Work finds the record)
// A phase that did not happen is 0: no slot moves in a barrier, a world of one or an empty buffer,
// and a rank that only receives (the end of a broadcast chain) hands off no first slot.
// The header-in-slot all_reduce (comm/header_exchange.h) hands its first slot off before it posts
// its header: there header_posted is stamped when that slot is in every peer's inbox (just before
// the header store), and first_slot equals header_seen (the first piece travelled with the
// header; the phases collapse, and the stamps stay in order).
//
// Threading invariants: collectives execute one at a time (CommCore's busy_), so exactly one
// thread writes `cur_` between begin() and commit(); the algorithms reach it through
// AlgoCtx::trace, which is null when tracing is off (one predictable branch per mark, no
// allocation: the ring of records is allocated once when the communicator is created).
// commit() and snapshot() take mu_, so Python may read the ring while a collective runs.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "comm/coll.h"
#include "comm/header_exchange.h"
#include "comm/selection.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "transport/shm.h"

namespace rc {

enum TracePhase : int {
  kTraceEntry = 0,
  kTraceHeaderPosted,
  kTraceHeaderSeen,
  kTraceFirstSlot,
  kTraceLastSlot,
  kTraceExit,
  kTracePhases
};

inline const char* trace_phase_name(int p) {
  static const char* const names[kTracePhases] = {"entry", "header_posted", "header_seen",
                                                  "first_slot", "last_slot", "exit"};
  return (p >= 0 && p < kTracePhases) ? names[p] : "?";
}

struct TraceRecord {
  int64_t t[kTracePhases] = {0, 0, 0, 0, 0, 0};
  uint64_t seq = 0;
  uint32_t coll = 0;     ///< the Coll code
  const char* algo = "";  ///< the algorithm's name (comm/selection.h): "ring", "direct", "two_shot", "chain", "halving_doubling", "none"
  const char* proto = ""; ///< the protocol's name: "simple", "header_in_slot", "ll", "none"
  const char* store = ""; ///< the store policy's name: "cached", "streaming"
  int64_t bytes = 0;     ///< the header's element count x element size
  bool ok = false;       ///< false when the call raised

  void mark(int phase) { t[phase] = now_ns(); }
  /// A slot handed off to a peer: the first one sets first_slot; every slot event moves last_slot.
  void slot_sent() {
    const int64_t now = now_ns();
    if (t[kTraceFirstSlot] == 0) t[kTraceFirstSlot] = now;
    t[kTraceLastSlot] = now;
  }
  void slot_received() { t[kTraceLastSlot] = now_ns(); }
};

class Tracer {
 public:
  /// Called once, when the communicator is created (before any collective).
  void configure(int64_t capacity) {
    cap_ = capacity > 0 ? static_cast<size_t>(capacity) : 0;
    ring_.assign(cap_, TraceRecord{});
    on_ = cap_ > 0;
  }
  bool on() const { return on_; }
  /// Start the record of the collective about to execute (only the executing thread calls this).
  TraceRecord* begin(int64_t entry_ns) {
    cur_ = TraceRecord{};
    cur_.t[kTraceEntry] = entry_ns;
    return &cur_;
  }
  /// Stamp exit and store the current record in the ring (the oldest is overwritten).
  void commit(bool ok) {
    cur_.mark(kTraceExit);
    cur_.ok = ok;
    std::lock_guard<std::mutex> lk(mu_);
    ring_[next_ % cap_] = cur_;
    ++next_;
  }
  /// The kept records, oldest first.
  std::vector<TraceRecord> snapshot() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<TraceRecord> out;
    if (cap_ == 0) return out;
    const uint64_t n = next_ < cap_ ? next_ : cap_;
    out.reserve(n);
    for (uint64_t i = next_ - n; i < next_; ++i) out.push_back(ring_[i % cap_]);
    return out;
  }

 private:
  bool on_ = false;
  size_t cap_ = 0;
  TraceRecord cur_;
  mutable std::mutex mu_;
  std::vector<TraceRecord> ring_;
  uint64_t next_ = 0;  // records committed so far; ring_[next_ % cap_] is written next
};

/// Commits the current record when the call ends: done() after the host part succeeded, the
/// destructor (ok = false) when it raised. A null record (tracing off) does nothing.
class TraceCommit {
 public:
  TraceCommit(Tracer& t, TraceRecord* r) : t_(t), r_(r) {}
  ~TraceCommit() {
    if (r_) t_.commit(false);
  }
  void done() {
    if (r_) t_.commit(true);
    r_ = nullptr;
  }
  TraceCommit(const TraceCommit&) = delete;
  TraceCommit& operator=(const TraceCommit&) = delete;

 private:
  Tracer& t_;
  TraceRecord* r_;
};

/// What a record knows before the header exchange; stamps header_posted.
inline void trace_begin(TraceRecord& r, uint64_t seq, Coll coll, const CollHeader& h) {
  r.seq = seq;
  r.coll = static_cast<uint32_t>(coll);
  r.bytes = h.count > 0 ? h.count * static_cast<int64_t>(dtype_size(static_cast<DType>(h.dtype))) : 0;
  r.mark(kTraceHeaderPosted);
}

/// Stamps header_seen and names the selection the core will run: the algorithm, protocol and
/// store policy in this rank's header (comm/selection.h; the exchange checked that all ranks
/// agree).
inline void trace_headers_seen(TraceRecord& r, Coll, const CollHeader& mine) {
  r.mark(kTraceHeaderSeen);
  r.algo = algo_name_of(mine.algo);
  r.proto = proto_name_of(mine.proto);
  r.store = store_name_of(mine.store);
}

}  // namespace rc
