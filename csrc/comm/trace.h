// The ring of per-phase records (algo/trace_record.h) of the last N collectives of one
// communicator (RINGCOMM_TRACE=N; 0, the default, records nothing): Tracer keeps them,
// TraceCommit stores the current one when a call ends, trace_begin and trace_headers_seen fill in
// what the core knows around the header exchange.
//
// Threading invariants: collectives execute one at a time (CommCore's busy_), so exactly one
// thread writes `cur_` between begin() and commit(); the algorithms reach it through
// AlgoCtx::trace, which is null when tracing is off (one predictable branch per mark, no
// allocation: the ring of records is allocated once when the communicator is created).
// commit() and snapshot() take mu_, so Python may read the ring while a collective runs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "algo/trace_record.h"
#include "comm/coll.h"
#include "comm/coll_header.h"
#include "comm/selection.h"
#include "common/dtype.h"

namespace rc {

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
