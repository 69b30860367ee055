// The push channels (transport/shm_slots.h): a sender's free slot and its publication, a
// receiver's filled slot and its release.
#include "transport/shm_slots.h"

#include "common/errors.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmSlots::ShmSlots(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits,
                   ShmDoorbell& bell)
    : ShmPath(rank, world, cfg, segs, waits, bell), single_(!uniform(cfg)),
      ctl_offset_(ctl_offset(cfg)), ctl_stride_(ctl_stride(cfg)), data_offset_(data_offset(world, cfg)),
      send_geom_(kNumLanes * world), recv_geom_(kNumLanes * world), send_head_(kNumLanes * world, 0),
      recv_tail_(kNumLanes * world, 0), send_off_(kNumLanes * world, 0) {
  for (int l = 0; l < kNumLanes; ++l)
    for (int p = 0; p < world_; ++p) {
      send_geom_[l * world_ + p] = geom_of(p, static_cast<Lane>(l), rank_);
      recv_geom_[l * world_ + p] = geom_of(rank_, static_cast<Lane>(l), p);
    }
}

ShmSlots::ChanGeom ShmSlots::geom_of(int owner, Lane lane, int src) const {
  ChanGeom g;
  if (single_) {  // the one push channel: collectives from the ring predecessor
    if (!push_channel(cfg_, world_, owner, lane, src)) return g;
    g.data_off = data_offset_;
    g.stride = cfg_.slot_bytes + kPage;
    g.nslots = cfg_.nslots;
    return g;
  }
  g.data_off = data_offset_ + (static_cast<size_t>(lane) * world_ + src) * cfg_.nslots * (cfg_.slot_bytes + kPage);
  g.stride = cfg_.slot_bytes + kPage;
  g.nslots = cfg_.nslots;
  return g;
}

// The outbox layout has one push channel per segment (collective lane, from the predecessor).
ChannelCtl* ShmSlots::ctl(int owner, Lane lane, int src) const {
  if (single_) return reinterpret_cast<ChannelCtl*>(segs_.base(owner) + ctl_offset_);
  return reinterpret_cast<ChannelCtl*>(segs_.base(owner) + ctl_offset_ +
                                       ctl_stride_ * (static_cast<size_t>(lane) * world_ + src));
}

SlotMeta* ShmSlots::slot_meta(int owner, Lane lane, int src, uint32_t slot) const {
  return reinterpret_cast<SlotMeta*>(reinterpret_cast<char*>(ctl(owner, lane, src)) + sizeof(ChannelCtl)) + slot;
}

char* ShmSlots::pending(int peer, Lane lane) const {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  const ChanGeom& g = send_geom_[ch];
  return segs_.base(peer) + g.data_off + (send_head_[ch] % g.nslots) * g.stride + send_off_[ch];
}

char* ShmSlots::try_send(int peer, Lane lane, uint32_t offset, size_t bytes) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  uint32_t head = send_head_[ch];
  // acquire: the receiver's reads of the slot happen-before our writes into it.
  uint32_t tail = c->tail.v.load(std::memory_order_acquire);
  if (head - tail >= g.nslots) return nullptr;
  send_off_[ch] = offset + slot_walk(head / g.nslots, bytes, cfg_.slot_walk_bytes);
  return pending(peer, lane);
}

char* ShmSlots::send(int peer, Lane lane, const WaitCtx& w, uint32_t offset, size_t bytes) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel to itself");
  const uint32_t head = send_head_[ch];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "a free slot";
  waits_.until(&c->tail.v, &c->tail.waiters,
               [&] { return head - c->tail.v.load(std::memory_order_acquire) < g.nslots; }, ww);
  send_off_[ch] = offset + slot_walk(head / g.nslots, bytes, cfg_.slot_walk_bytes);
  return pending(peer, lane);
}

void ShmSlots::post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  uint32_t& head = send_head_[ch];
  SlotMeta* m = slot_meta(peer, lane, rank_, head % send_geom_[ch].nslots);
  m->bytes = bytes;
  m->total = total;
  m->tag = tag;
  m->offset = send_off_[ch];
  ++head;
  // seq_cst RMW: releases the slot's data and meta to the receiver, and orders against its
  // waiter registration (no lost wake-up).
  publish_add(&c->head.v, &c->head.waiters, 1);
  if (lane == Lane::kP2P) bell_.ring(peer);
}

// The slot at `tail` from `peer`, once head has passed it (acquired by the caller).
const char* ShmSlots::recv_at(int peer, Lane lane, uint32_t tail, const SlotMeta** meta) const {
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  uint32_t slot = tail % g.nslots;
  *meta = slot_meta(rank_, lane, peer, slot);
  // The sender's offset and size, from shared memory: never read past the slot.
  const uint64_t off = (*meta)->offset, bytes = (*meta)->bytes;
  if (off > g.stride || bytes > g.stride - off) {
    RC_THROW(Error, "ringcomm: rank " << rank_ << ": the slot rank " << peer << " filled holds " << bytes
                                      << " bytes at offset " << off << ", past its " << g.stride << " bytes");
  }
  return segs_.base(rank_) + g.data_off + slot * g.stride + off;
}

const char* ShmSlots::try_recv(int peer, Lane lane, const SlotMeta** meta) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  if (c->head.v.load(std::memory_order_acquire) == tail) return nullptr;
  return recv_at(peer, lane, tail, meta);
}

const char* ShmSlots::recv(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel from itself");
  const uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "data";
  waits_.until(&c->head.v, &c->head.waiters,
               [&] { return c->head.v.load(std::memory_order_acquire) != tail; }, ww);
  return recv_at(peer, lane, tail, meta);
}

void ShmSlots::done(int peer, Lane lane) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  ++recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  // seq_cst RMW: our reads of the slot happen-before the sender's next write into it.
  publish_add(&c->tail.v, &c->tail.waiters, 1);
  if (lane == Lane::kP2P) bell_.ring(peer);
}

}  // namespace rc
