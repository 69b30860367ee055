// The node-wide ledger of the device ring's resident blocks on each GPU (RINGCOMM_CUDA_P2P=device*):
// every live communicator rank that runs ring grids on a GPU holds an entry {pid, the process's
// start time, owner (its transport), MPS client or not, blocks, rank, world, PID namespace} in that
// GPU's file
// `<RINGCOMM_CUDA_LEDGER_DIR>/ringcomm-gpu-<uuid in hex>`, read and written only under flock.
//
// Invariants.
//  - Concurrency domain: the grids of MPS clients of one GPU run at once, so their entries share
//    the GPU's resident blocks; a process that is not an MPS client has a context of its own, which
//    takes turns with the others, so only its own entries share the blocks. In every domain the
//    entries' blocks never exceed the GPU's resident blocks: an entry is added only under the lock,
//    with at most the blocks left in its domain at that moment (reserve()).
//  - Dead holders: an entry whose process is gone (no /proc/<pid>, a zombie, or another process with
//    that pid: its start time differs) is dropped by every access under the lock. An entry of
//    another PID namespace cannot be checked and is kept (its blocks stay held until its own
//    namespace drops it or the file is removed).
//  - No lasting file: a ledger that becomes empty is unlinked under the lock; an access that locked
//    a file since unlinked (or replaced) reopens the path, so no entry is ever added to an unlinked
//    file. Reading a ledger that does not exist creates nothing.
#pragma once
#include <cstdint>
#include <string>

namespace rc {

struct GpuLedgerLook {
  int64_t held = 0;     // blocks the other live entries of the caller's domain hold
  std::string holders;  // those entries, for messages: "pid P (rank r of w): B blocks; ..."
};

class GpuLedger {
 public:
  /// The ledger of the GPU `uuid` (raw 16 bytes) in `dir`.
  GpuLedger(const std::string& dir, const std::string& uuid);
  const std::string& path() const { return path_; }
  /// What the live entries of the domain of (this process, `mps`) hold, other than `owner`'s.
  GpuLedgerLook look(bool mps, uint64_t owner) const;
  /// Adds (or replaces) this process's entry for `owner` with `blocks` when the domain's other
  /// entries leave that many of `capacity`; otherwise adds nothing and returns false with `*look`
  /// describing the holders.
  bool reserve(uint64_t owner, bool mps, int blocks, int rank, int world, int64_t capacity, GpuLedgerLook* look);
  /// Removes this process's entry for `owner` (none: nothing); unlinks the file when it is empty.
  void release(uint64_t owner);

 private:
  std::string path_;
};

}  // namespace rc
