// The per-phase record of one collective (RINGCOMM_TRACE; the communicator keeps the last N:
// comm/trace.h). It holds CLOCK_MONOTONIC nanoseconds for the phases of one call, the collective,
// its bytes, its sequence number and the selection that ran it (algorithm, protocol, store):
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
// The algorithms write a record's slot phases through AlgoCtx::trace (algo/context.h), the
// communicator core the others; one thread writes a record at a time (comm/trace.h).
#pragma once
#include <cstdint>

#include "common/clock.h"

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

}  // namespace rc
