// The flow-controlled slot channels (shm.h, "Channel protocol"): a sender's free slot and its
// publication, a receiver's filled slot and its release. In the outbox layout a pair without a
// push channel goes through the sender's outbox instead (transport/shm_outbox.cpp).
#include "transport/shm.h"

#include "common/errors.h"
#include "transport/shm_layout.h"
#include "transport/shm_wait.h"

namespace rc {

using namespace shm_detail;

// The outbox layout has one push channel per segment (collective lane, from the predecessor).
ChannelCtl* ShmTransport::ctl(int owner, Lane lane, int src) const {
  if (outbox_) return reinterpret_cast<ChannelCtl*>(base_[owner] + ctl_offset_);
  return reinterpret_cast<ChannelCtl*>(base_[owner] + ctl_offset_ +
                                       ctl_stride_ * (static_cast<size_t>(lane) * world_ + src));
}

SlotMeta* ShmTransport::slot_meta(int owner, Lane lane, int src, uint32_t slot) const {
  return reinterpret_cast<SlotMeta*>(reinterpret_cast<char*>(ctl(owner, lane, src)) + sizeof(ChannelCtl)) + slot;
}


char* ShmTransport::try_send_slot(int peer, Lane lane, const void* like) {
  return try_send_slot_at(peer, lane, page_offset(like));
}

char* ShmTransport::try_send_slot_at(int peer, Lane lane, uint32_t offset) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  if (outbox_ && !pushes(peer, lane)) return out_reserve(lane, peer, offset, nullptr);
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  uint32_t head = send_head_[ch];
  // acquire: the receiver's reads of the slot happen-before our writes into it.
  uint32_t tail = c->tail.v.load(std::memory_order_acquire);
  if (head - tail >= g.nslots) return nullptr;
  send_off_[ch] = offset;
  return base_[peer] + g.data_off + (head % g.nslots) * g.stride + send_off_[ch];
}

char* ShmTransport::send_slot(int peer, Lane lane, const WaitCtx& w, const void* like) {
  return send_slot_at(peer, lane, w, page_offset(like));
}

char* ShmTransport::send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  if (outbox_ && !pushes(peer, lane)) {
    RC_CHECK(peer != rank_, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel to itself");
    return out_reserve(lane, peer, offset, &w);
  }
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel to itself");
  const uint32_t head = send_head_[ch];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "a free slot";
  wait_until(&c->tail.v, &c->tail.waiters,
             [&] { return head - c->tail.v.load(std::memory_order_acquire) < g.nslots; }, ww);
  send_off_[ch] = offset;
  return base_[peer] + g.data_off + (head % g.nslots) * g.stride + send_off_[ch];
}

void ShmTransport::send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  if (outbox_ && !pushes(peer, lane)) return out_post(lane, bytes, total, tag);
  ChannelCtl* c = ctl(peer, lane, rank_);
  uint32_t& head = send_head_[static_cast<size_t>(lane) * world_ + peer];
  SlotMeta* m = slot_meta(peer, lane, rank_, head % send_geom_[static_cast<size_t>(lane) * world_ + peer].nslots);
  m->bytes = bytes;
  m->total = total;
  m->tag = tag;
  m->offset = send_off_[static_cast<size_t>(lane) * world_ + peer];
  ++head;
  // seq_cst RMW: releases the slot's data and meta to the receiver, and orders against its
  // waiter registration (no lost wake-up).
  publish_add(&c->head.v, &c->head.waiters, 1);
  if (lane == Lane::kP2P) ring_doorbell(peer);
}

const char* ShmTransport::try_recv_slot(int peer, Lane lane, const SlotMeta** meta) {
  if (outbox_ && pulls(peer, lane)) return out_find(peer, lane, meta);
  ChannelCtl* c = ctl(rank_, lane, peer);
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  if (c->head.v.load(std::memory_order_acquire) == tail) return nullptr;
  uint32_t slot = tail % g.nslots;
  *meta = slot_meta(rank_, lane, peer, slot);
  return base_[rank_] + g.data_off + slot * g.stride + (*meta)->offset;
}

const char* ShmTransport::recv_slot(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta) {
  if (outbox_ && pulls(peer, lane)) {
    RC_CHECK(peer != rank_, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel from itself");
    const char* p = out_find(peer, lane, meta);
    if (p != nullptr) return p;
    WaitCtx ww = w;
    ww.peer = peer;
    ww.what = "data";
    Word* b = &outbox(peer, lane)->pub;
    wait_until(&b->v, &b->waiters, [&] { return (p = out_find(peer, lane, meta)) != nullptr; }, ww);
    return p;
  }
  ChannelCtl* c = ctl(rank_, lane, peer);
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel from itself");
  const uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "data";
  wait_until(&c->head.v, &c->head.waiters,
             [&] { return c->head.v.load(std::memory_order_acquire) != tail; }, ww);
  uint32_t slot = tail % g.nslots;
  *meta = slot_meta(rank_, lane, peer, slot);
  return base_[rank_] + g.data_off + slot * g.stride + (*meta)->offset;
}

void ShmTransport::recv_done(int peer, Lane lane) {
  if (outbox_ && pulls(peer, lane)) return out_release(peer, lane);
  ChannelCtl* c = ctl(rank_, lane, peer);
  ++recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  // seq_cst RMW: our reads of the slot happen-before the sender's next write into it.
  publish_add(&c->tail.v, &c->tail.waiters, 1);
  if (lane == Lane::kP2P) ring_doorbell(peer);
}

}  // namespace rc
