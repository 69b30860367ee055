#include "comm/store_adapt.h"

namespace rc {
namespace {
Store other(Store s) { return s == Store::kStreaming ? Store::kCached : Store::kStreaming; }
int code(Store s) { return s == Store::kStreaming ? 1 : 0; }
}  // namespace

int StoreAdapt::size_class(int64_t bytes) {
  int c = 0;
  while (bytes >= 4 && c < kClasses - 1) {
    bytes >>= 2;
    ++c;
  }
  return c;
}

Store StoreAdapt::pick(int64_t bytes, Proto proto) {
  picked_eligible_ = eligible(bytes, proto);
  explored_ = picked_eligible_ && until_explore_ == 1;
  const Store cur = current_.load(std::memory_order_relaxed);
  if (!picked_eligible_) return Store::kCached;
  return explored_ ? other(cur) : cur;
}

uint8_t StoreAdapt::vote(int64_t bytes, Proto proto) const {
  if (!eligible(bytes, proto)) return 0;
  const auto& t = timing_[size_class(bytes)];
  if (t[0].samples == 0 || t[1].samples == 0) return 0;
  if (t[1].ns_per_byte < p_.margin * t[0].ns_per_byte) return kVoteStream;
  if (t[0].ns_per_byte < p_.margin * t[1].ns_per_byte) return kVoteCached;
  return 0;
}

void StoreAdapt::agree(const std::vector<CollHeader>& headers) {
  if (picked_eligible_) {
    eligible_.fetch_add(1, std::memory_order_relaxed);
    --until_explore_;
    if (explored_) {
      explorations_.fetch_add(1, std::memory_order_relaxed);
      interval_ = interval_ * 2 > p_.explore_max ? p_.explore_max : interval_ * 2;
      until_explore_ = interval_;
    }
  }
  int stream = 0, cached = 0;
  for (const CollHeader& h : headers) {
    stream += (h.flags & kVoteStream) != 0;
    cached += (h.flags & kVoteCached) != 0;
  }
  const Store cur = current_.load(std::memory_order_relaxed);
  const Store want = stream > cached ? Store::kStreaming : cached > stream ? Store::kCached : cur;
  if (want == cur) return;
  current_.store(want, std::memory_order_relaxed);
  switches_.fetch_add(1, std::memory_order_relaxed);
  interval_ = until_explore_ = p_.explore_min;
}

void StoreAdapt::observe(int64_t bytes, Proto proto, Store used, int64_t ns) {
  if (!eligible(bytes, proto) || ns <= 0) return;
  Timing& t = timing_[size_class(bytes)][code(used)];
  const double sample = static_cast<double>(ns) / static_cast<double>(bytes);
  // An exploration's one sample replaces the store's old figure, which may date from another
  // placement; the store in use moves by a running average, so one slow call does not flip a vote.
  t.ns_per_byte = explored_ || t.samples == 0 ? sample : 0.75 * t.ns_per_byte + 0.25 * sample;
  ++t.samples;
}

}  // namespace rc
