// The adaptive store policy (RINGCOMM_STREAM=adapt): whether a collective's stores into peers'
// slots are cached or streaming, re-decided as the calls go.
//
// Which is faster depends on where the reader runs, and on a virtual machine the host moves the
// vCPUs: a reader near the writer (one L3) finds cached lines sooner, one far from it reads memory
// faster than lines dirty in the writer's cache. So each rank times its calls (the copy of a first
// piece sent before the header, and everything after the headers are in; not the wait for them,
// which a late peer lengthens) per byte, per size class and per store; a store's figure is the
// least of its last kKeep samples (what noise remains only lengthens a call). Now and then
// one eligible call runs under the other store, whose figure that one sample then replaces (the
// old ones may date from another placement). In the header of the next eligible call each rank
// votes for the store whose figure (in the explored size class) is lower by a margin, wider to
// leave cached stores than to return to them (Params).
//
// Invariant: the state that picks a call's store (the store in use, the count of eligible calls,
// the next exploration) is the same on every rank before every call. It changes only in agree(),
// after a header exchange that succeeded, from what every rank read alike: whether the call was
// eligible (header fields the exchange checked equal: the size select() is given, the protocol)
// and the votes in all the ranks' headers. A call whose exchange failed (a mismatch raises on
// every rank) changes nothing. A rank's own timings decide only its vote. So the ranks pick the
// same store for every call, as the header comparison (comm/header_exchange.h) requires; the
// store changes no result's bits.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "comm/coll_header.h"
#include "comm/selection.h"

namespace rc {

class StoreAdapt {
 public:
  struct Params {
    int64_t min_bytes = 16 << 10;  ///< RINGCOMM_STREAM_ADAPT_MIN_BYTES: smaller calls stay cached
    // Eligible calls from one exploration to the next: under cached stores the first is the
    // 128th call and the interval doubles up to 1024 (an exploration costs its call up to 2x where
    // cached stores are the faster); under streaming stores, every 64th call.
    uint32_t explore_first = 128;
    uint32_t explore_max = 1024;
    uint32_t explore_streaming = 64;
    // A rank votes to leave cached stores for streaming ones only when streaming's figure is under
    // to_stream x cached's, and to come back when cached's is under to_cached x streaming's. Far
    // placements make streaming 2-5x faster; near ones make it 1.1-2x slower; a stretch of slow
    // calls is noise of either sign, so leaving the default needs the wider margin.
    double to_stream = 0.55;
    double to_cached = 0.87;
  };
  /// CollHeader::flags bits of a rank's vote (none set: no opinion).
  static constexpr uint8_t kVoteStream = 2;
  static constexpr uint8_t kVoteCached = 4;

  explicit StoreAdapt(const Params& p) : p_(p), interval_(p.explore_first), until_explore_(p.explore_first) {}

  /// Whether a call of `bytes` under `proto` is the policy's to decide: `bytes` is select()'s
  /// size, or for an all_to_all (whose sizes differ per rank) the largest input in the ranks'
  /// headers, known after its exchange. pick(), agree() and observe() are made for eligible
  /// calls only, in this order, once per call; the others leave the policy out (their votes are
  /// not counted, and they change no state). vote() depends on agreed state alone, so a call
  /// whose eligibility is known only after its exchange carries it in its header all the same.
  bool eligible(int64_t bytes, Proto proto) const {
    return bytes >= p_.min_bytes && (proto == Proto::kSimple || proto == Proto::kHeaderInSlot);
  }
  /// The store of the call (before its exchange); changes no agreed state.
  Store pick(int64_t bytes);
  /// This rank's vote, for its header (CollHeader::flags bits), before or after pick().
  uint8_t vote() const;
  /// After the call's exchange: every rank's header, alike on every rank.
  void agree(const std::vector<CollHeader>& headers);
  /// After the call: this rank's time for it (ns), under the store pick() gave.
  void observe(int64_t bytes, Store used, int64_t ns);

  Store current() const { return current_.load(std::memory_order_relaxed); }
  struct Stats {
    uint64_t eligible, explorations, switches;
  };
  Stats stats() const {
    return {eligible_.load(std::memory_order_relaxed), explorations_.load(std::memory_order_relaxed),
            switches_.load(std::memory_order_relaxed)};
  }

 private:
  static constexpr int kClasses = 32;  // size classes: bytes in [4^c, 4^(c+1))
  static constexpr int kKeep = 4;      // samples kept per class and store
  static int size_class(int64_t bytes);
  struct Timing {
    std::array<double, kKeep> ns_per_byte{};  // the last kKeep samples, round robin
    uint32_t samples = 0;
    double least() const;
  };
  const Params p_;
  // Agreed state (the invariant above). Written by the executing thread only; atomics so that
  // stats() may read them from another thread.
  std::atomic<Store> current_{Store::kCached};
  std::atomic<uint64_t> eligible_{0};
  std::atomic<uint64_t> explorations_{0};
  std::atomic<uint64_t> switches_{0};
  uint32_t interval_;       // eligible calls from one exploration to the next
  uint32_t until_explore_;  // eligible calls until the next exploration (1: the next call)
  bool explored_ = false;         // the last pick()'s call runs under the store not in use
  int picked_class_ = 0;          // ... and its size class
  bool vote_due_ = false;         // the last eligible call explored: the next one votes
  int vote_class_ = 0;            // on this class
  // This rank's timings: [size class][store code].
  std::array<std::array<Timing, 2>, kClasses> timing_{};
};

}  // namespace rc
