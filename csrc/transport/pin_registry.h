// Who owns which pinned / mapped memory range in this process: host pages registered with
// cudaHostRegister and peer device memory opened with cudaIpcOpenMemHandle.
//
// Why it exists. CUDA keeps host registrations per process and by virtual address. A CUDA
// transport whose close() could not drain its GPU work (copies may still read or write its host
// staging slots) must neither unregister those pages nor let their addresses be mapped again:
// a later mmap at the same address would make cudaHostRegister answer "already registered" for
// a registration that pins the OLD pages, and a device pointer taken from it would make the GPU
// write memory the new communicator never sees. So every range is claimed here before it is
// registered or opened, and on close it is either released (the owner's GPU work is drained: the
// caller unregisters / closes it) or retired (kept registered, mapped and recorded until exit;
// never handed to anyone again). A claim overlapping a range of another owner, or a retired one,
// raises instead of reusing it; an "already registered" answer for a range the registry does not
// hold is a registration ringcomm does not own, and is refused too (reject_foreign).
//
// Pure bookkeeping (no CUDA): compiled into every build and unit-tested on the host through
// ringcomm._C_test.PinRegistry. Thread-safe: one mutex guards the table (both lanes' threads of one
// transport, and several transports of one process, claim concurrently).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace rc {

enum class PinKind : uint8_t { kHostRegistered = 0, kIpcMapped = 1 };
enum class PinState : uint8_t { kLive = 0, kRetired = 1 };
const char* pin_kind_name(PinKind k);

struct PinRange {
  uintptr_t begin = 0;
  size_t bytes = 0;
  PinKind kind = PinKind::kHostRegistered;
  uint64_t owner = 0;
  PinState state = PinState::kLive;
};

class PinRegistry {
 public:
  enum class Claim : uint8_t {
    kFresh = 0,  // nobody holds any byte of the range: the caller registers / opens it now
    kHeld = 1,   // this owner already holds exactly this live range (same kind): reuse it
  };

  /// A new owner id (never 0, never reused).
  uint64_t new_owner();
  /// Record `owner`'s claim on [addr, addr + bytes). Throws rc::Error naming both parties when
  /// any byte is held by another owner, is retired, or is held by `owner` as another range or kind.
  Claim claim(uint64_t owner, const void* addr, size_t bytes, PinKind kind);
  /// Forget a claim whose registration failed (only a live range of `owner` starting at addr).
  void drop(uint64_t owner, const void* addr);
  /// CUDA answered "already registered" for a range claim() reported fresh: drop the claim and
  /// throw rc::Error (a registration ringcomm does not own is never trusted).
  [[noreturn]] void reject_foreign(uint64_t owner, const void* addr, size_t bytes);
  /// The owner's work is drained: its live ranges are removed and returned, for the caller to
  /// unregister / close. Retired ranges stay.
  std::vector<PinRange> release(uint64_t owner);
  /// The owner's work may still run: its live ranges become retired (stay recorded, are never
  /// released, and block every later claim that overlaps them). Returns how many.
  size_t retire(uint64_t owner);
  /// What a closing owner does with its ranges: drained -> release() (returned: unregister /
  /// close them), else retire() (nothing returned: they stay registered and mapped).
  std::vector<PinRange> settle(uint64_t owner, bool drained);
  /// Snapshot of every recorded range, in address order (tests, logs).
  std::vector<PinRange> ranges() const;
  /// Bytes in retired ranges (what non-drained closes leaked until exit).
  size_t retired_bytes() const;

  /// The registry of this process (CUDA registrations are per process, so is their bookkeeping).
  static PinRegistry& process();

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, PinRange> by_begin_;  // disjoint ranges keyed by their first byte
  uint64_t next_owner_ = 1;
};

}  // namespace rc
