// The all-reduce cost model: what each algorithm costs on a machine described by a profile, and
// the cheapest one. A pure function of (profile, bytes, world): never of timings taken while a
// communicator runs, so every rank of a communicator that loaded the same profile makes the same
// choice (the profile's hash is compared across ranks at init: ringcomm/core/host.py).
//
// The profile: the machine's per hand-off latency (alpha: a waiting rank sees a peer's flag;
// alpha_shared: the same when two ranks share one CPU, so a hand-off is a switch between them),
// the cost of one slot handed over (slot_s: its flags' cache lines, the wait and post), its
// one-core copy, reduce and LL-line bandwidths, and the CPUs the ranks share. Compiled-in
// defaults (default_profile) or a JSON file written by `python -m ringcomm.apps.tune` and named by
// RINGCOMM_PROFILE. The file's format (version 1):
//   {"format": "ringcomm-profile", "version": 1,
//    "params": {"alpha_s": .., "alpha_shared_s": .., "slot_s": .., "copy_Bps": .., "reduce_Bps": .., "ll_Bps": ..,
//               "cpus": ..},
//    "hash": "<16 hex digits>", ...anything else (what was measured, where) is not read}
// The hash is profile_hash(params): FNV-1a 64 over kProfileTag and the params' IEEE-754 doubles
// (little-endian) in the order above; a file whose hash disagrees with its params is refused.
//
// Cost of an all-reduce of M bytes over N ranks (docs/algorithms.md derives each line):
//   T = latency + f x (S x slot_s + C / copy_Bps + R / reduce_Bps + L / ll_Bps)
// H the steps of the critical path (the header exchange included unless the data carries it):
// latency = H x alpha with a CPU per rank; when N > cpus > 0 the ranks take turns on the CPUs and
// a step completes only after a round of switches among the N / cpus ranks of each CPU:
// latency = (H + E) x alpha_shared x N / cpus, and the work counts f = N / cpus times. E the
// rounds a step's later pieces add there: a ring piece is passed on by every rank in turn, so
// each piece after a step's first waits for a round (E = 2(N-1)(pieces per chunk - 1)); the
// two-shot's iterations run in lockstep (each takes every peer's pieces of both phases before
// the next sends), so each iteration after the first waits for a round; the one-shot's,
// two-shot's and halving_doubling's pieces wait in the sender's outbox, far_depth at a time,
// for readers to come (a round per outbox-full after the first). S the slots this rank hands
// over, C, R, L the bytes it copies, reduces and moves through LL lines.
#pragma once
#include <cstdint>
#include <string>

namespace rc {

enum class Algo : uint8_t;
enum class Proto : uint8_t;
struct HalvingDoublingWork;  // algo/context.h

constexpr const char* kProfileTag = "ringcomm-profile-v1";
constexpr int kProfileVersion = 1;

struct CostProfile {
  double alpha_s = 0;         ///< hand-off latency with a CPU per rank (seconds)
  double alpha_shared_s = 0;  ///< hand-off latency of two ranks on one CPU (seconds)
  double slot_s = 0;          ///< cost of one slot handed over and taken, beyond alpha (seconds)
  double copy_Bps = 0;        ///< one core's copy bandwidth (bytes copied per second)
  double reduce_Bps = 0;      ///< one core's reduce bandwidth (bytes of one input per second)
  double ll_Bps = 0;          ///< LL line bandwidth (data bytes written or read per second)
  double cpus = 0;            ///< CPUs the ranks share (0: at least one per rank)
  uint64_t hash = 0;          ///< profile_hash of the fields above
  std::string source;         ///< "defaults" or the file's path
};

uint64_t profile_hash(const CostProfile& p);
/// The compiled-in profile (hash set).
CostProfile default_profile();
/// The profile of the JSON file at `path`; throws InvalidArgument naming the path for a missing,
/// unreadable or malformed file, another version, or a hash that disagrees with the params.
CostProfile load_profile(const std::string& path);
/// The profile RINGCOMM_PROFILE names (Knobs::profile): load_profile(path), or default_profile()
/// when `path` is empty (the knob unset).
CostProfile profile_at(const std::string& path);

/// The slot payloads the algorithms cut messages into: the ring's (ring neighbours) and the far
/// channels' (direct exchanges, two-shot, halving_doubling). Equal on every rank (the transport
/// checks its geometry at attach).
struct PieceSizes {
  int64_t ring = 256 << 10;
  int64_t far = 32 << 10;
  int64_t far_depth = 16;  ///< slots of an outbox (RINGCOMM_OUTBOX_SLOTS)
};

/// The modelled seconds of one all-reduce of `bytes` over `world` ranks by (algo, proto), for
/// the pairs the model knows: (direct, ll), (direct, header_in_slot), (direct, simple),
/// (two_shot, simple), (ring, header_in_slot), (ring, simple), (halving_doubling, simple).
/// Others: a programming error.
double model_seconds(const CostProfile& p, Algo algo, Proto proto, int64_t bytes, int world, const PieceSizes& ps);

/// halving_doubling_work(0, world) (algo/context.h) in closed form, O(log world): the model's
/// input for the halving_doubling all-reduce (rank 0 carries the most: it folds an extra rank).
HalvingDoublingWork halving_doubling_work_of_rank0(int world);

struct ModelChoice {
  Algo algo;
  Proto proto;
};
/// The cheapest candidate: LL when bytes <= ll_bytes (and bytes > 0), the direct one-shot,
/// two-shot, ring, halving_doubling (the one-shot and the ring with the header in their first
/// slot when `header_in_slot`). Ties go to the earlier candidate in that order.
ModelChoice model_choose(const CostProfile& p, int64_t bytes, int world, const PieceSizes& ps, int64_t ll_bytes,
                         bool header_in_slot);

}  // namespace rc
