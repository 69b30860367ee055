#include "comm/store_adapt.h"

#include <algorithm>

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

double StoreAdapt::Timing::least() const {
  const uint32_t n = std::min<uint32_t>(samples, kKeep);
  return *std::min_element(ns_per_byte.begin(), ns_per_byte.begin() + n);
}

Store StoreAdapt::pick(int64_t bytes) {
  picked_class_ = size_class(bytes);
  explored_ = until_explore_ <= 1;
  const Store cur = current_.load(std::memory_order_relaxed);
  return explored_ ? other(cur) : cur;
}

uint8_t StoreAdapt::vote() const {
  // Only the call after an exploration votes, on the explored size class: then both stores'
  // figures are fresh. Between explorations the other store's figure may date from another
  // placement, and votes on it would flip the store back and forth. An exploring call (pick()'s
  // rule, from agreed state) does not vote.
  if (until_explore_ <= 1 || !vote_due_) return 0;
  const auto& t = timing_[vote_class_];
  if (t[0].samples == 0 || t[1].samples == 0) return 0;
  const double cached = t[0].least(), stream = t[1].least();
  if (stream < p_.to_stream * cached) return kVoteStream;
  if (cached < p_.to_cached * stream) return kVoteCached;
  return 0;
}

void StoreAdapt::agree(const std::vector<CollHeader>& headers) {
  const Store cur = current_.load(std::memory_order_relaxed);
  eligible_.fetch_add(1, std::memory_order_relaxed);
  vote_due_ = explored_;
  if (explored_) {
    vote_class_ = picked_class_;
    explorations_.fetch_add(1, std::memory_order_relaxed);
    interval_ = cur == Store::kStreaming ? p_.explore_streaming : std::min(interval_ * 2, p_.explore_max);
    until_explore_ = interval_;
  } else {
    --until_explore_;
  }
  int stream = 0, cached = 0;
  for (const CollHeader& h : headers) {
    stream += (h.flags & kVoteStream) != 0;
    cached += (h.flags & kVoteCached) != 0;
  }
  const Store want = stream > cached ? Store::kStreaming : cached > stream ? Store::kCached : cur;
  if (want == cur) return;
  current_.store(want, std::memory_order_relaxed);
  switches_.fetch_add(1, std::memory_order_relaxed);
  interval_ = until_explore_ = want == Store::kStreaming ? p_.explore_streaming : p_.explore_first;
}

void StoreAdapt::observe(int64_t bytes, Store used, int64_t ns) {
  if (ns <= 0) return;
  Timing& t = timing_[size_class(bytes)][code(used)];
  // An exploration's sample replaces its store's figure: the old ones may date from another
  // placement.
  if (explored_) t.samples = 0;
  t.ns_per_byte[t.samples % kKeep] = static_cast<double>(ns) / static_cast<double>(bytes);
  ++t.samples;
}

}  // namespace rc
