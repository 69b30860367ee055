// The outboxes of the outbox layout (transport/shm_outbox.h): a rank writes its messages into its
// OWN segment, its readers find them there and release them.
#include "transport/shm_outbox.h"

#include <algorithm>

#include "common/errors.h"
#include "transport/shm_layout.h"

namespace rc {

using namespace shm_detail;

ShmOutbox::ShmOutbox(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits,
                     ShmDoorbell& bell)
    : ShmPath(rank, world, cfg, segs, waits, bell), last_(kNumLanes * world, 0),
      scanned_(kNumLanes * world, 0), cur_(kNumLanes * world, 0) {
  for (OutSend& s : send_) {
    s.dest.assign(cfg_.far_nslots, kAllDest);
    s.readers.assign(cfg_.far_nslots, 0);
  }
}

OutSlot* ShmOutbox::slot(int owner, Lane lane, uint64_t g) const {
  return reinterpret_cast<OutSlot*>(box(owner, lane) + 1) + g % cfg_.far_nslots;
}

char* ShmOutbox::data(int owner, Lane lane, uint64_t g) const {
  return segs_.base(owner) + outbox_data_offset(world_, cfg_, lane) + (g % cfg_.far_nslots) * outbox_stride(cfg_);
}

OutboxCtl* ShmOutbox::box(int owner, Lane lane) const {
  return reinterpret_cast<OutboxCtl*>(segs_.base(owner) + outbox_ctl_offset(cfg_, lane));
}

// Slot g % far_nslots is free once every reader of the message it held released it: `done`
// reaches that message's reader count (acquire: their reads happen-before our writes).
char* ShmOutbox::reserve(Lane lane, int dest, uint32_t offset, const WaitCtx* w) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  OutSend& s = send_[static_cast<int>(lane)];
  const uint64_t g = s.next;
  const size_t i = g % cfg_.far_nslots;
  OutSlot* sl = slot(rank_, lane, g);
  const uint32_t want = s.readers[i];
  auto free = [&] { return sl->done.load(std::memory_order_acquire) >= want; };
  if (!free()) {
    if (w == nullptr) return nullptr;
    WaitCtx ww = *w;
    ww.peer = s.dest[i] >= 0 ? s.dest[i] : -1;  // kAllDest: every peer may be the one we wait on
    ww.what = "a free outbox slot";
    Word* b = &box(rank_, lane)->freed;
    waits_.until(&b->v, &b->waiters, free, ww);
  }
  s.reserved = dest;
  s.offset = offset;
  return data(rank_, lane, g) + offset;
}

const char* ShmOutbox::reserved(Lane lane) const {
  const OutSend& s = send_[static_cast<int>(lane)];
  return data(rank_, lane, s.next) + s.offset;
}

void ShmOutbox::post(Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  OutSend& s = send_[static_cast<int>(lane)];
  RC_CHECK(s.reserved != kNoReserve, Error, "ringcomm: rank " << rank_ << " posts an outbox slot it did not take");
  const uint64_t g = s.next++;
  const size_t i = g % cfg_.far_nslots;
  OutSlot* sl = slot(rank_, lane, g);
  const int dest = s.reserved;
  s.reserved = kNoReserve;
  s.dest[i] = dest;
  s.readers[i] = dest == kAllDest ? static_cast<uint32_t>(world_ - 2) : 1u;
  sl->meta.bytes = bytes;
  sl->meta.total = total;
  sl->meta.tag = tag;
  sl->meta.offset = s.offset;
  // Every reader of the slot's previous message has released it (reserve): nobody writes `done`
  // until a reader acquires the key stored below.
  sl->done.store(0, std::memory_order_relaxed);
  sl->key.store(out_key(g, dest), std::memory_order_release);
  OutboxCtl* b = box(rank_, lane);
  b->posted.store(g, std::memory_order_release);
  publish_add(&b->pub.v, &b->pub.waiters, 1);
  if (lane != Lane::kP2P) return;
  // The point-to-point engines sleep on their doorbells (comm/p2p_engine.h).
  if (dest != kAllDest) return bell_.ring(dest);
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && p != (rank_ + 1) % world_) bell_.ring(p);
}

const char* ShmOutbox::find(int peer, Lane lane, const SlotMeta** meta) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  uint64_t g = cur_[ch];
  if (g == 0) {
    const uint64_t posted = box(peer, lane)->posted.load(std::memory_order_acquire);
    uint64_t from = std::max(last_[ch], scanned_[ch]);
    if (posted <= from) return nullptr;
    if (posted - from > cfg_.far_nslots) from = posted - cfg_.far_nslots;
    const bool succ = rank_ == (peer + 1) % world_;
    for (uint64_t k = from + 1; k <= posted; ++k) {
      const uint64_t key = slot(peer, lane, k)->key.load(std::memory_order_acquire);
      if (out_key_seq(key) != k) continue;  // reused already: not ours
      const int32_t dest = out_key_dest(key);
      if (dest == rank_ || (dest == kAllDest && !succ)) {
        g = k;
        break;
      }
    }
    if (g == 0) {
      scanned_[ch] = posted;
      return nullptr;
    }
    cur_[ch] = g;
  }
  OutSlot* sl = slot(peer, lane, g);
  *meta = &sl->meta;
  return data(peer, lane, g) + sl->meta.offset;
}

const char* ShmOutbox::wait(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta) {
  const char* p = find(peer, lane, meta);
  if (p != nullptr) return p;
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "data";
  Word* b = &box(peer, lane)->pub;
  waits_.until(&b->v, &b->waiters, [&] { return (p = find(peer, lane, meta)) != nullptr; }, ww);
  return p;
}

void ShmOutbox::release(int peer, Lane lane) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  const uint64_t g = cur_[ch];
  RC_CHECK(g != 0, Error, "ringcomm: rank " << rank_ << " releases a slot of rank " << peer << " it did not take");
  slot(peer, lane, g)->done.fetch_add(1, std::memory_order_seq_cst);
  cur_[ch] = 0;
  last_[ch] = g;
  Word* b = &box(peer, lane)->freed;
  publish_add(&b->v, &b->waiters, 1);
  if (lane == Lane::kP2P) bell_.ring(peer);
}

}  // namespace rc
