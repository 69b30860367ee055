// The ring schedule: which chunk each rank sends and receives at each step. Pure arithmetic,
// shared by every transport (host shared memory, CUDA IPC) and unit-tested on its own.
//
// N ranks form a ring; rank r sends only to its right neighbour r+1 and receives only from its
// left neighbour r-1 (mod N). The data is cut into N chunks.
//  - Reduce-scatter: N-1 steps. At step s (0-based) rank r sends chunk rs_send(r, s) and receives
//    chunk rs_recv(r, s) = rs_send(r-1, s), which it combines with its own copy. At step s >= 1
//    the chunk a rank sends is the one it combined at step s-1: rs_send(r, s) == rs_recv(r, s-1).
//    After the last step rank r holds the fully reduced chunk owner(r).
//  - All-gather: N-1 steps. At step 0 rank r sends owner(r); at step s >= 1 it forwards the chunk
//    it received at step s-1: ag_send(r, s) == ag_recv(r, s-1).
//
// `shift` fixes which chunk a rank owns: owner(r) = (r + shift) mod N. The seed's worked example
// (seed 001: "worker 0 sends its first chunk to worker 1"; after reduce-scatter worker 0 holds
// chunk 1) is shift = 1. The collectives use shift = 0 so that rank r owns chunk r, which is what
// reduce_scatter's output means.
#pragma once
#include <cstdint>

namespace rc {
namespace ring {

inline int64_t mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

inline int owner(int r, int n, int shift = 0) { return static_cast<int>(mod(r + shift, n)); }
inline int rs_send(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 1, n)); }
inline int rs_recv(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 2, n)); }
inline int ag_send(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s, n)); }
inline int ag_recv(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 1, n)); }
inline int right(int r, int n) { return static_cast<int>(mod(r + 1, n)); }
inline int left(int r, int n) { return static_cast<int>(mod(r - 1, n)); }

/// Balanced split of `count` elements into n chunks: the first count % n chunks get one more.
inline int64_t chunk_count(int64_t count, int n, int k) {
  return count / n + (k < count % n ? 1 : 0);
}
inline int64_t chunk_offset(int64_t count, int n, int k) {
  return k * (count / n) + (k < count % n ? k : count % n);
}

}  // namespace ring
}  // namespace rc
