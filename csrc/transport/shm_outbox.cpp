// The outboxes of the outbox layout (shm.h, "Outboxes"): a rank writes its messages into its OWN
// segment, its readers find them there and release them; and the routing that sends every other
// message through a push channel (shm.h, "Channel protocol").
#include <cstring>

#include "common/errors.h"
#include "transport/shm.h"
#include "transport/shm_layout.h"
#include "transport/shm_wait.h"

namespace rc {

using namespace shm_detail;

bool ShmTransport::pushes(int peer, Lane lane) const { return push_channel(cfg_, world_, peer, lane, rank_); }

bool ShmTransport::pulls(int peer, Lane lane) const { return !push_channel(cfg_, world_, rank_, lane, peer); }

OutSlot* ShmTransport::out_slot(int owner, Lane lane, uint64_t g) const {
  auto* box = reinterpret_cast<OutboxCtl*>(base_[owner] + outbox_ctl_offset(cfg_, lane));
  return reinterpret_cast<OutSlot*>(box + 1) + g % cfg_.far_nslots;
}

char* ShmTransport::out_data(int owner, Lane lane, uint64_t g) const {
  return base_[owner] + outbox_data_offset(world_, cfg_, lane) + (g % cfg_.far_nslots) * outbox_stride(cfg_);
}

OutboxCtl* ShmTransport::outbox(int owner, Lane lane) const {
  return reinterpret_cast<OutboxCtl*>(base_[owner] + outbox_ctl_offset(cfg_, lane));
}

// Slot g % far_nslots is free once every reader of the message it held released it: `done`
// reaches that message's reader count (acquire: their reads happen-before our writes).
char* ShmTransport::out_reserve(Lane lane, int dest, uint32_t offset, const WaitCtx* w) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  OutSend& s = out_send_[static_cast<int>(lane)];
  const uint64_t g = s.next;
  const size_t i = g % cfg_.far_nslots;
  OutSlot* slot = out_slot(rank_, lane, g);
  const uint32_t want = s.readers[i];
  auto free = [&] { return slot->done.load(std::memory_order_acquire) >= want; };
  if (!free()) {
    if (w == nullptr) return nullptr;
    WaitCtx ww = *w;
    ww.peer = s.dest[i] >= 0 ? s.dest[i] : -1;  // kAllDest: every peer may be the one we wait on
    ww.what = "a free outbox slot";
    Word* b = &outbox(rank_, lane)->freed;
    wait_until(&b->v, &b->waiters, free, ww);
  }
  s.reserved = dest;
  s.offset = offset;
  return out_data(rank_, lane, g) + offset;
}

void ShmTransport::out_post(Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  OutSend& s = out_send_[static_cast<int>(lane)];
  RC_CHECK(s.reserved != kNoReserve, Error, "ringcomm: rank " << rank_ << " posts an outbox slot it did not take");
  const uint64_t g = s.next++;
  const size_t i = g % cfg_.far_nslots;
  OutSlot* slot = out_slot(rank_, lane, g);
  const int dest = s.reserved;
  s.reserved = kNoReserve;
  s.dest[i] = dest;
  s.readers[i] = dest == kAllDest ? static_cast<uint32_t>(world_ - 2) : 1u;
  slot->meta.bytes = bytes;
  slot->meta.total = total;
  slot->meta.tag = tag;
  slot->meta.offset = s.offset;
  // Every reader of the slot's previous message has released it (out_reserve): nobody writes
  // `done` until a reader acquires the key stored below.
  slot->done.store(0, std::memory_order_relaxed);
  slot->key.store(out_key(g, dest), std::memory_order_release);
  OutboxCtl* box = outbox(rank_, lane);
  box->posted.store(g, std::memory_order_release);
  publish_add(&box->pub.v, &box->pub.waiters, 1);
  if (lane != Lane::kP2P) return;
  // The point-to-point engines sleep on their doorbells (comm/p2p_engine.h).
  if (dest != kAllDest) return ring_doorbell(dest);
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && p != (rank_ + 1) % world_) ring_doorbell(p);
}

// The next message for this rank in `peer`'s outbox (see shm.h, "Outboxes"), or nullptr. A
// message found and not yet released is returned again.
const char* ShmTransport::out_find(int peer, Lane lane, const SlotMeta** meta) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  uint64_t g = out_cur_[ch];
  if (g == 0) {
    const uint64_t posted = outbox(peer, lane)->posted.load(std::memory_order_acquire);
    uint64_t from = std::max(out_last_[ch], out_scanned_[ch]);
    if (posted <= from) return nullptr;
    if (posted - from > cfg_.far_nslots) from = posted - cfg_.far_nslots;
    const bool succ = rank_ == (peer + 1) % world_;
    for (uint64_t k = from + 1; k <= posted; ++k) {
      OutSlot* slot = out_slot(peer, lane, k);
      const uint64_t key = slot->key.load(std::memory_order_acquire);
      if (out_key_seq(key) != k) continue;  // reused already: not ours
      const int32_t dest = out_key_dest(key);
      if (dest == rank_ || (dest == kAllDest && !succ)) {
        g = k;
        break;
      }
    }
    if (g == 0) {
      out_scanned_[ch] = posted;
      return nullptr;
    }
    out_cur_[ch] = g;
  }
  OutSlot* slot = out_slot(peer, lane, g);
  *meta = &slot->meta;
  return out_data(peer, lane, g) + slot->meta.offset;
}

void ShmTransport::out_release(int peer, Lane lane) {
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  const uint64_t g = out_cur_[ch];
  RC_CHECK(g != 0, Error, "ringcomm: rank " << rank_ << " releases a slot of rank " << peer << " it did not take");
  out_slot(peer, lane, g)->done.fetch_add(1, std::memory_order_seq_cst);
  out_cur_[ch] = 0;
  out_last_[ch] = g;
  Word* b = &outbox(peer, lane)->freed;
  publish_add(&b->v, &b->waiters, 1);
  if (lane == Lane::kP2P) ring_doorbell(peer);
}

char* ShmTransport::send_slot_all(const WaitCtx& w, uint32_t offset) {
  RC_CHECK(outbox_, Unsupported, "ringcomm: send_slot_all needs the outbox layout");
  char* p = out_reserve(Lane::kColl, kAllDest, offset, &w);
  send_slot_at((rank_ + 1) % world_, Lane::kColl, w, offset);
  return p;
}

// The outbox slot is published first (its readers start at once); then the successor's copy goes
// through the push channel, copied from the outbox slot just written (cache hot): the owner alone
// writes the slot, and only after its next reservation of it, which waits for every reader.
void ShmTransport::send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) {
  const int succ = (rank_ + 1) % world_;
  const size_t ch = static_cast<size_t>(Lane::kColl) * world_ + succ;
  const ChanGeom& g = send_geom_[ch];
  char* push = base_[succ] + g.data_off + (send_head_[ch] % g.nslots) * g.stride + send_off_[ch];
  const OutSend& s = out_send_[static_cast<int>(Lane::kColl)];
  const char* src = out_data(rank_, Lane::kColl, s.next) + s.offset;
  out_post(Lane::kColl, bytes, total, tag);
  if (bytes > 0) std::memcpy(push, src, bytes);
  send_post(succ, Lane::kColl, bytes, total, tag);
}

}  // namespace rc
