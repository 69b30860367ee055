// A host collective lane whose large copies and reductions are split over the rank's CpuPool
// (kernels/cpu_pool.h). Every slot primitive, and every reduce or copy under min_bytes, is the
// wrapped ShmChannel's; reduce, copy and the fused into-slot forms of at least min_bytes run on
// the pool's threads, each thread one element range, with the kernels and the store policy the
// ShmChannel uses for them (memcpy for local copies, copy_to_peer into slots, a streamed fused
// reduction formed in the scratch first): a change to those in shm_channel.cpp belongs here too.
// Used, like the ShmChannel, by the thread executing the collective only.
#pragma once
#include <cstddef>

#include "common/dtype.h"
#include "kernels/cpu_pool.h"
#include "transport/channel.h"
#include "transport/shm_channel.h"
#include "transport/shm_types.h"

namespace rc {

class SplitChannel final : public Channel {
 public:
  /// scratch: the wrapped channel's scratch (one slot of private memory) or nullptr.
  SplitChannel(ShmChannel* inner, CpuPool* pool, size_t min_bytes, char* scratch)
      : in_(inner), pool_(pool), min_bytes_(min_bytes), scratch_(scratch) {}

  bool forward_from_slot() const override { return in_->forward_from_slot(); }
  size_t far_piece_bytes() const override { return in_->far_piece_bytes(); }
  size_t piece_bytes() const override { return in_->piece_bytes(); }
  bool has_send_all() const override { return in_->has_send_all(); }
  char* send_slot_all(const WaitCtx& w, const PiecePlace& at) override { return in_->send_slot_all(w, at); }
  void send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) override {
    in_->send_post_all(bytes, total, tag);
  }
  char* send_slot(int peer, const WaitCtx& w, const PiecePlace& at) override { return in_->send_slot(peer, w, at); }
  char* try_send_slot(int peer, const PiecePlace& at) override { return in_->try_send_slot(peer, at); }
  void send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) override {
    in_->send_post(peer, bytes, total, tag);
  }
  const char* recv_slot(int peer, const WaitCtx& w, const PiecePlace& at, const SlotMeta** meta) override {
    return in_->recv_slot(peer, w, at, meta);
  }
  const char* try_recv_slot(int peer, const PiecePlace& at, const SlotMeta** meta) override {
    return in_->try_recv_slot(peer, at, meta);
  }
  void recv_done(int peer) override { in_->recv_done(peer); }

  // Below min_bytes every call is the wrapped channel's own; at or above it, the same kernels
  // split by element ranges.
  void reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) override {
    if (n * dtype_size(dt) < min_bytes_) return in_->reduce(dst, a, b, n, dt, op, scale);
    reduce_split(pool_, min_bytes_, dst, a, b, n, dt, op, scale);
  }
  void reduce_into_slot(char* slot, const void* a, const void* b, size_t n, DType dt, ReduceOp op) override {
    if (n * dtype_size(dt) < min_bytes_) return in_->reduce_into_slot(slot, a, b, n, dt, op);
    if (in_->streaming() && scratch_ != nullptr)
      reduce_stream_split(pool_, min_bytes_, slot, scratch_, a, b, n, dt, op);
    else
      reduce_split(pool_, min_bytes_, slot, a, b, n, dt, op, 1.0);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes < min_bytes_) return in_->copy(dst, src, bytes);
    if (dst != src) copy_split(pool_, min_bytes_, dst, src, bytes, false);
  }
  void copy_into_slot(char* slot, const void* src, size_t bytes) override {
    if (bytes < min_bytes_) return in_->copy_into_slot(slot, src, bytes);
    copy_split(pool_, min_bytes_, slot, src, bytes, in_->streaming());
  }

 private:
  ShmChannel* in_;
  CpuPool* pool_;
  size_t min_bytes_;
  char* scratch_;
};

}  // namespace rc
