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
//
// Every function is __host__ __device__ under nvcc: the device ring (device/ring_proto.h) walks
// this very schedule, so its pieces and reduction order are the host ring's.
#pragma once
#include <algorithm>  // for the files that include this one for it
#include <cstdint>

#if defined(__CUDACC__)
#define RC_SCHED_HD __host__ __device__ inline
#else
#define RC_SCHED_HD inline
#endif

namespace rc {
namespace ring {

RC_SCHED_HD int64_t mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

RC_SCHED_HD int owner(int r, int n, int shift = 0) { return static_cast<int>(mod(r + shift, n)); }
RC_SCHED_HD int rs_send(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 1, n)); }
RC_SCHED_HD int rs_recv(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 2, n)); }
RC_SCHED_HD int ag_send(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s, n)); }
RC_SCHED_HD int ag_recv(int r, int s, int n, int shift = 0) { return static_cast<int>(mod(r + shift - s - 1, n)); }
RC_SCHED_HD int right(int r, int n) { return static_cast<int>(mod(r + 1, n)); }
RC_SCHED_HD int left(int r, int n) { return static_cast<int>(mod(r - 1, n)); }

/// Balanced split of `count` elements into n chunks: the first count % n chunks get one more.
RC_SCHED_HD int64_t chunk_count(int64_t count, int n, int k) {
  return count / n + (k < count % n ? 1 : 0);
}
RC_SCHED_HD int64_t chunk_offset(int64_t count, int n, int k) {
  return k * (count / n) + (k < count % n ? k : count % n);
}

/// All-reduce's chunks (chunk k is combined last on rank k). Not the balanced split: the ring
/// segmentation gloo uses (segments of at most 1 MiB, their number a multiple of n and at least
/// 2n, each rounded up to whole elements; chunk k = the k-th run of segments/n segments), so that
/// every element is combined in the same order as gloo's ring combines it: results equal gloo's
/// bit for bit at world sizes 2 and 3 (at 4 and more, gloo walks the ring the other way). All
/// chunks have ar_chunk_elems elements except the last non-empty one; trailing ones may be empty.
RC_SCHED_HD int64_t ar_chunk_elems(int64_t count, int n, int64_t esize) {
  if (count <= 0 || esize <= 0) return 1;
  const int64_t bytes = count * esize;
  const int64_t per_seg = (int64_t{1} << 20) / esize;
  const int64_t max_seg = esize * (per_seg > 1 ? per_seg : 1);
  const int64_t want = (bytes + max_seg - 1) / max_seg;
  int64_t nseg = want > 2 * static_cast<int64_t>(n) ? want : 2 * static_cast<int64_t>(n);
  nseg = (nseg + n - 1) / n * n;
  const int64_t seg_bytes = ((bytes + nseg - 1) / nseg + esize - 1) / esize * esize;
  return (nseg / n) * (seg_bytes / esize);
}
RC_SCHED_HD int64_t ar_chunk_offset(int64_t count, int n, int64_t esize, int k) {
  const int64_t o = k * ar_chunk_elems(count, n, esize);
  return o < count ? o : count;
}
RC_SCHED_HD int64_t ar_chunk_count(int64_t count, int n, int64_t esize, int k) {
  return ar_chunk_offset(count, n, esize, k + 1) - ar_chunk_offset(count, n, esize, k);
}

}  // namespace ring
}  // namespace rc
