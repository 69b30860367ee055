// Ownership of pinned / mapped ranges (see pin_registry.h).
#include "transport/pin_registry.h"

#include <iterator>
#include <sstream>
#include <string>

#include "common/errors.h"

namespace rc {

namespace {

std::string describe(const PinRange& r) {
  std::ostringstream o;
  o << pin_kind_name(r.kind) << " range [0x" << std::hex << r.begin << ", 0x" << (r.begin + r.bytes) << std::dec
    << ") of owner " << r.owner << (r.state == PinState::kRetired ? " (retired: its close did not drain)" : "");
  return o.str();
}

}  // namespace

const char* pin_kind_name(PinKind k) {
  return k == PinKind::kHostRegistered ? "host-registered" : "ipc-mapped";
}

uint64_t PinRegistry::new_owner() {
  std::lock_guard<std::mutex> lk(mu_);
  return next_owner_++;
}

PinRegistry::Claim PinRegistry::claim(uint64_t owner, const void* addr, size_t bytes, PinKind kind) {
  RC_CHECK(owner != 0 && bytes > 0, InvalidArgument, "ringcomm: pin claim needs an owner and a non-empty range");
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
  RC_CHECK(b + bytes > b, InvalidArgument, "ringcomm: pin claim range wraps around the address space");
  std::lock_guard<std::mutex> lk(mu_);
  // Ranges are disjoint: only the last one starting at or before b, and those starting inside
  // [b, b + bytes), can overlap.
  auto it = by_begin_.upper_bound(b);
  if (it != by_begin_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.begin + prev->second.bytes > b) it = prev;
  }
  if (it != by_begin_.end() && it->second.begin < b + bytes) {
    const PinRange& r = it->second;
    if (r.owner == owner && r.state == PinState::kLive && r.begin == b && r.bytes == bytes && r.kind == kind)
      return Claim::kHeld;
    RC_THROW(Error, "ringcomm: " << pin_kind_name(kind) << " range [0x" << std::hex << b << ", 0x" << (b + bytes)
                                 << std::dec << ") for owner " << owner << " overlaps the " << describe(r)
                                 << "; it is not free and is never reused");
  }
  PinRange r;
  r.begin = b;
  r.bytes = bytes;
  r.kind = kind;
  r.owner = owner;
  by_begin_.emplace(b, r);
  return Claim::kFresh;
}

void PinRegistry::drop(uint64_t owner, const void* addr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_begin_.find(reinterpret_cast<uintptr_t>(addr));
  if (it != by_begin_.end() && it->second.owner == owner && it->second.state == PinState::kLive) by_begin_.erase(it);
}

void PinRegistry::reject_foreign(uint64_t owner, const void* addr, size_t bytes) {
  drop(owner, addr);
  RC_THROW(Error, "ringcomm: host range [" << addr << ", +" << bytes
                                           << ") is already registered with CUDA, but not by ringcomm's live "
                                              "transports; a registration ringcomm does not own may pin other "
                                              "pages and is not reused");
}

std::vector<PinRange> PinRegistry::release(uint64_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<PinRange> out;
  for (auto it = by_begin_.begin(); it != by_begin_.end();) {
    if (it->second.owner == owner && it->second.state == PinState::kLive) {
      out.push_back(it->second);
      it = by_begin_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

size_t PinRegistry::retire(uint64_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (auto& kv : by_begin_) {
    if (kv.second.owner == owner && kv.second.state == PinState::kLive) {
      kv.second.state = PinState::kRetired;
      ++n;
    }
  }
  return n;
}

std::vector<PinRange> PinRegistry::settle(uint64_t owner, bool drained) {
  if (drained) return release(owner);
  retire(owner);
  return {};
}

std::vector<PinRange> PinRegistry::ranges() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<PinRange> out;
  for (const auto& kv : by_begin_) out.push_back(kv.second);
  return out;
}

size_t PinRegistry::retired_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& kv : by_begin_)
    if (kv.second.state == PinState::kRetired) n += kv.second.bytes;
  return n;
}

PinRegistry& PinRegistry::process() {
  static PinRegistry r;  // function-local: created on first use, never at import
  return r;
}

}  // namespace rc
