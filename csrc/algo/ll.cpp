// The low-latency (LL) collectives for small messages: every rank wrote its header and data
// into its own LL outbox before posting the header (transport/shm_board.h, "LL outboxes";
// the first phase, ll_send_first), so the header exchange already delivered everything but the
// data lines; the peers pull those from the owner's outbox. No slot is taken or released, no
// head or tail word is exchanged, and the data goes out once however many peers read it. The
// lines' format and ordering are the LL protocol's (proto/ll.h, reached through c.ll).
#include <vector>

#include "algo/chunks.h"
#include "algo/pieces.h"
#include "proto/ll.h"

namespace rc {

void ll_send_first(const AlgoCtx& c, const HeaderBlob& h, const void* data, int64_t count) {
  c.ll->write(c.seq, h, data, static_cast<size_t>(count) * c.esize);
}

void ll_reduce_scatter_send_first(const AlgoCtx& c, const HeaderBlob& h, const void* data, int64_t count) {
  // No peer reads this rank's own chunk (each reads only its own): its whole lines stay unwritten.
  const int n = c.world, r = c.rank;
  const size_t es = c.esize;
  c.ll->write(c.seq, h, data, static_cast<size_t>(count) * es, static_cast<size_t>(ring::chunk_offset(count, n, r)) * es,
              static_cast<size_t>(ring::chunk_count(count, n, r)) * es);
}

void ll_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  const int n = c.world, r = c.rank;
  const size_t bytes = static_cast<size_t>(count) * c.esize;
  // Every peer's data into a stage of its own (private, cache-hot), then the ring-order combine
  // over the whole message; this rank's own stage is the accumulator (3 or more ranks).
  const char* small[8];
  std::vector<const char*> big;
  const char** src = small;
  if (n > 8) {
    big.resize(n);
    src = big.data();
  }
  const WaitCtx w = wait_ctx(c, 0, 1);
  for (int p = 0; p < n; ++p) {
    if (p == r) {
      src[p] = in;
      continue;
    }
    char* stage = c.ll->stage(p);
    c.ll->read(p, c.seq, stage, bytes, w);
    if (c.trace) c.trace->slot_received();
    src[p] = stage;
  }
  combine_in_ring_order(c, src, out, 0, count, count, op, c.ll->stage(r));
}

void ll_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (count == 0 || r != root) return;
  if (n == 1) {
    copy_elems(c, out, in, count);
    return;
  }
  const size_t bytes = static_cast<size_t>(count) * c.esize;
  const char* small[8];
  std::vector<const char*> big;
  const char** src = small;
  if (n > 8) {
    big.resize(n);
    src = big.data();
  }
  const WaitCtx w = wait_ctx(c, 0, 1);
  for (int p = 0; p < n; ++p) {
    if (p == r) {
      src[p] = in;
      continue;
    }
    char* stage = c.ll->stage(p);
    c.ll->read(p, c.seq, stage, bytes, w);
    if (c.trace) c.trace->slot_received();
    src[p] = stage;
  }
  // The root's own stage is free: the accumulator (3 or more ranks).
  combine_chunk_in_ring_order(c, out, src, 0, root, static_cast<size_t>(count), op, c.ll->stage(r));
}

void ll_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return copy_elems(c, out, in, count);
  const size_t es = c.esize;
  const int64_t own_off = ring::chunk_offset(count, n, r), own_cnt = ring::chunk_count(count, n, r);
  if (own_cnt == 0) return;
  const size_t bytes = static_cast<size_t>(own_cnt) * es;
  // Only this rank's chunk of every peer's input, into a stage of its own.
  const char* small[8];
  std::vector<const char*> big;
  const char** src = small;
  if (n > 8) {
    big.resize(n);
    src = big.data();
  }
  const WaitCtx w = wait_ctx(c, 0, 1);
  for (int p = 0; p < n; ++p) {
    if (p == r) {
      src[p] = in + own_off * static_cast<int64_t>(es);
      continue;
    }
    char* stage = c.ll->stage(p);
    c.ll->read(p, c.seq, stage, bytes, w, static_cast<size_t>(own_off) * es);
    if (c.trace) c.trace->slot_received();
    src[p] = stage;
  }
  // This rank's own stage is the accumulator (3 or more ranks); out may be this rank's own chunk
  // of in (the last step reads each element before writing it).
  combine_chunk_in_ring_order(c, out, src, 0, r, static_cast<size_t>(own_cnt), op, c.ll->stage(r));
}

void ll_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root) {
  if (count == 0 || c.world == 1 || c.rank == root) return;
  c.ll->read(root, c.seq, buf, static_cast<size_t>(count) * c.esize, wait_ctx(c, 0, 1));
  if (c.trace) c.trace->slot_received();
}

}  // namespace rc
