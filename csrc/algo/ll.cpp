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

namespace {

// Every peer's `bytes` bytes from byte `from` of its LL message, each read into that peer's stage
// (private, cache-hot); src()[p] is peer p's stage and src()[rank] is `own`. The caller combines
// from src() while this object lives; the stage of this rank is left free (an accumulator).
class PeerLines {
 public:
  PeerLines(const AlgoCtx& c, const char* own, size_t bytes, size_t from) : n_(c.world) {
    if (n_ > 8) big_.resize(n_);
    const char** src = n_ > 8 ? big_.data() : small_;
    const WaitCtx w = wait_ctx(c, 0, 1);
    for (int p = 0; p < n_; ++p) {
      if (p == c.rank) {
        src[p] = own;
        continue;
      }
      char* stage = c.ll->stage(p);
      c.ll->read(p, c.seq, stage, bytes, w, from);
      if (c.trace) c.trace->slot_received();
      src[p] = stage;
    }
  }
  PeerLines(const PeerLines&) = delete;
  PeerLines& operator=(const PeerLines&) = delete;
  const char* const* src() const { return n_ > 8 ? big_.data() : small_; }

 private:
  int n_;
  const char* small_[8] = {};
  std::vector<const char*> big_;
};

}  // namespace

void ll_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  if (all_reduce_trivial(c, in, out, count, op)) return;
  // Every peer's whole message, then the ring-order combine over it; this rank's own stage is the
  // accumulator (3 or more ranks).
  const PeerLines lines(c, in, static_cast<size_t>(count) * c.esize, 0);
  combine_in_ring_order(c, lines.src(), out, 0, count, count, op, c.ll->stage(c.rank));
}

void ll_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (count == 0 || r != root) return;
  if (n == 1) {
    copy_elems(c, out, in, count);
    return;
  }
  const PeerLines lines(c, in, static_cast<size_t>(count) * c.esize, 0);
  // The root's own stage is free: the accumulator (3 or more ranks).
  combine_chunk_in_ring_order(c, out, lines.src(), 0, root, static_cast<size_t>(count), op, c.ll->stage(r));
}

void ll_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op) {
  check_reduce_supported(c.dtype, op);
  const int n = c.world, r = c.rank;
  if (n == 1 || count == 0) return copy_elems(c, out, in, count);
  const size_t es = c.esize;
  const int64_t own_off = ring::chunk_offset(count, n, r), own_cnt = ring::chunk_count(count, n, r);
  if (own_cnt == 0) return;
  // Only this rank's chunk of every peer's input.
  const size_t from = static_cast<size_t>(own_off) * es;
  const PeerLines lines(c, in + from, static_cast<size_t>(own_cnt) * es, from);
  // This rank's own stage is the accumulator (3 or more ranks); out may be this rank's own chunk
  // of in (the last step reads each element before writing it).
  combine_chunk_in_ring_order(c, out, lines.src(), 0, r, static_cast<size_t>(own_cnt), op, c.ll->stage(r));
}

void ll_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root) {
  if (count == 0 || c.world == 1 || c.rank == root) return;
  c.ll->read(root, c.seq, buf, static_cast<size_t>(count) * c.esize, wait_ctx(c, 0, 1));
  if (c.trace) c.trace->slot_received();
}

}  // namespace rc
