// Ring reduce-scatter / all-gather / all-reduce, chain broadcast / reduce and direct
// all-to-all / gather / scatter for the CUDA communicator, written against `SlotExec`: the few
// primitives a collective needs (a slot to a peer, a slot from a peer, reduce, copy). The
// schedule is algo/ring_schedule.h's, exactly as for the shm ring (algo/ring.cpp), piece for
// piece and slot for slot; only the primitives differ.
//
// Two executors implement SlotExec:
//  - CudaSlotExec (comm/communicator_cuda.cpp): slots of the CUDA IPC transport, copies with
//    cudaMemcpyAsync, reductions with the CUDA reduce kernels, all enqueued on the caller's stream;
//  - HostSlotExec (below): slots of the shm transport, memcpy and the CPU kernels. It runs these
//    very algorithms between processes without a GPU, which is how the CUDA path's schedule,
//    piece bounds, slot offsets and message pairing are tested on machines without one.
//
// Pieces sit in their slot at `slot_offset(o)` = (o * esize) mod 16, where o is the piece's
// element offset in the full buffer (sender and receiver compute it alike): the slot then shares
// the user buffer's 16-byte residue and the reduce kernel's vector path applies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "transport/shm.h"

namespace rc {

class SlotExec {
 public:
  virtual ~SlotExec() = default;
  virtual size_t slot_bytes() const = 0;
  /// Wait (bounded) for a free slot to `peer`; its data pointer.
  virtual char* send_slot(int peer, const WaitCtx& w) = 0;
  /// Publish the slot after the writes issued since send_slot.
  virtual void send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) = 0;
  /// Wait (bounded) for the next slot from `peer`; its data pointer and meta.
  virtual const char* recv_slot(int peer, const WaitCtx& w, const SlotMeta** meta) = 0;
  /// Release the slot after the reads issued since recv_slot.
  virtual void recv_done(int peer) = 0;
  /// dst = a (op) b over n elements (scale for AVG; see reduce_cpu.h).
  virtual void reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) = 0;
  /// dst = src (bytes; the ranges never overlap partially).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
};

struct SlotAlgoCtx {
  SlotExec* x = nullptr;
  int rank = 0;
  int world = 1;
  uint64_t seq = 0;
  const char* op = "";
  DType dtype = DType::kFloat32;
  size_t esize = 4;
  /// Bytes kept free at the start of each slot for the residue offset.
  static constexpr size_t kResidue = 16;
  int64_t piece_elems() const {
    const size_t usable = x->slot_bytes() > kResidue ? x->slot_bytes() - kResidue : 0;
    const int64_t p = static_cast<int64_t>(usable / esize);
    return p > 0 ? p : 1;
  }
  size_t slot_offset(int64_t o) const { return static_cast<size_t>(o) * esize % kResidue; }
};

void slot_ring_all_reduce(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
void slot_ring_reduce_scatter(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
/// counts[k]: rank k's contribution; out holds all in rank order.
void slot_ring_all_gather(const SlotAlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts);
void slot_chain_broadcast(const SlotAlgoCtx& c, char* buf, int64_t count, int root);
void slot_chain_reduce(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root);
void slot_direct_all_to_all(const SlotAlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_offs, const std::vector<int64_t>& recv_counts,
                            const std::vector<int64_t>& recv_offs);
void slot_direct_gather(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, int root);
void slot_direct_scatter(const SlotAlgoCtx& c, const char* in, char* out, int64_t count, int root);

/// The shm transport's collective lane with memcpy and the CPU kernels (tests; no GPU needed).
class HostSlotExec : public SlotExec {
 public:
  explicit HostSlotExec(ShmTransport* t) : t_(t) {}
  size_t slot_bytes() const override { return t_->config().slot_bytes; }
  char* send_slot(int peer, const WaitCtx& w) override { return t_->send_slot(peer, Lane::kColl, w); }
  void send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) override {
    t_->send_post(peer, Lane::kColl, bytes, total, tag);
  }
  const char* recv_slot(int peer, const WaitCtx& w, const SlotMeta** meta) override {
    return t_->recv_slot(peer, Lane::kColl, w, meta);
  }
  void recv_done(int peer) override { t_->recv_done(peer, Lane::kColl); }
  void reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) override;
  void copy(void* dst, const void* src, size_t bytes) override;

 private:
  ShmTransport* t_;
};

}  // namespace rc
