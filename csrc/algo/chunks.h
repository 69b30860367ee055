// The chunks a collective cuts its buffer into: the ring's (algo/ring.cpp), and the ring's
// all_reduce chunks that the two-shot and halving_doubling combine in ring order. Pure arithmetic
// over ring_schedule.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "algo/ring_schedule.h"

namespace rc {

struct Chunks {
  std::vector<int64_t> cnt, off;  // chunk k: elements [off[k], off[k] + cnt[k])
  int64_t max_cnt = 0;
};

/// reduce_scatter's chunks (the API's split): the first count % n chunks hold one more element.
inline Chunks balanced_chunks(int64_t count, int n) {
  Chunks ch;
  ch.cnt.resize(n);
  ch.off.resize(n);
  for (int k = 0; k < n; ++k) {
    ch.cnt[k] = ring::chunk_count(count, n, k);
    ch.off[k] = ring::chunk_offset(count, n, k);
    ch.max_cnt = std::max(ch.max_cnt, ch.cnt[k]);
  }
  return ch;
}

/// all_reduce's chunks (ring::ar_chunk_*: gloo's segmentation, so that every element is combined
/// in gloo's order; see ring_schedule.h).
inline Chunks all_reduce_chunks(int64_t count, int n, size_t esize) {
  Chunks ch;
  ch.cnt.resize(n);
  ch.off.resize(n);
  for (int k = 0; k < n; ++k) {
    ch.off[k] = ring::ar_chunk_offset(count, n, static_cast<int64_t>(esize), k);
    ch.cnt[k] = ring::ar_chunk_count(count, n, static_cast<int64_t>(esize), k);
    ch.max_cnt = std::max(ch.max_cnt, ch.cnt[k]);
  }
  return ch;
}

}  // namespace rc
