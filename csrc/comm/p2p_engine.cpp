#include "comm/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <vector>

#include "common/errors.h"
#include "transport/channel.h"
#include "transport/futex.h"
#include "transport/shm_control.h"
#include "transport/shm_types.h"

namespace rc {

namespace {
// The kind of a message, in its first piece's `total` (see the header's Rendezvous).
constexpr uint64_t kRdvData = 1ull << 63;  // total = size | kRdvData, tag = the send's id
constexpr uint64_t kRts = 1ull << 62;      // total = size | kRts, tag = the tag, payload = the id
constexpr uint64_t kCts = 1ull << 61;      // total = kCts, tag = the id, no payload
constexpr uint64_t kKinds = kRdvData | kRts | kCts;
}  // namespace

P2PEngine::P2PEngine(int rank, int world, CommDevice* dev, int64_t eager_bytes,
                     std::function<void(const std::exception_ptr&)> on_failure)
    : rank_(rank),
      world_(world),
      dev_(dev),
      on_failure_(std::move(on_failure)),
      eager_bytes_(static_cast<uint64_t>(eager_bytes)) {}

P2PEngine::~P2PEngine() { stop(); }

void P2PEngine::start() {
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

void P2PEngine::forget_after_fork() {
  forked_ = true;
  stopping_ = true;
  // The std::thread object names a thread of the parent: joining it would hang and destroying
  // it joinable would terminate the child, so it is moved to the heap and never destroyed.
  if (thread_.joinable()) new std::thread(std::move(thread_));
}

void P2PEngine::stop() {
  if (forked_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (started_) dev_->control().ring_doorbell(rank_);  // wake the thread if it sleeps on the doorbell
  if (thread_.joinable()) thread_.join();
}

WorkPtr P2PEngine::submit(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag, void* stream) {
  Op op;
  op.is_send = is_send;
  op.peer = peer;
  op.buf = buf;
  op.bytes = static_cast<uint64_t>(bytes);
  op.tag = tag;
  op.deadline_ns = deadline_after(now_ns(), dev_->control().timeout_s());
  op.work = std::make_shared<Work>(is_send ? "send" : "recv", 0);
  if (!is_send && peer != kAnySource) op.work->set_source(peer);
  RC_CHECK(static_cast<uint64_t>(bytes) < kCts, InvalidArgument,
           "ringcomm: " << (is_send ? "send" : "recv") << " of " << bytes << " bytes: at most 2^61 - 1");
  op.token = dev_->p2p_prepare(stream);
  WorkPtr w = op.work;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // stop() sets stopping_ under mu_ before the thread fails what is queued and exits: an op is
    // queued before that (and failed) or refused here, never queued for a thread that is gone.
    if (stopping_) {
      dev_->p2p_end(op.token, false);
      RC_THROW(Closed, "ringcomm: " << (is_send ? "send to" : "recv from") << " rank " << peer << " on rank " << rank_
                                    << ": the communicator is closed");
    }
    new_.push_back(std::move(op));
  }
  cv_.notify_all();
  dev_->control().ring_doorbell(rank_);  // wake our p2p thread if it sleeps on the doorbell
  return w;
}

void P2PEngine::begin(Op& op) {
  if (op.begun) return;
  dev_->p2p_begin(op.token);
  op.begun = true;
}

// Moves as many pieces of a send as the channel allows right now; true if anything moved.
bool P2PEngine::advance(Op& op) {
  Channel& ch = dev_->p2p_channel();
  const size_t slot = ch.piece_bytes();
  // A rendezvous send's data is the message named by its id (only the receive that took its RTS
  // takes it).
  const uint64_t total = op.rdv ? (op.bytes | kRdvData) : op.bytes;
  const uint64_t tag = op.rdv ? op.rdv_id : op.tag;
  bool moved = false;
  begin(op);
  while (!op.started || op.done < op.bytes) {
    char* dst = ch.try_send_slot(op.peer, PiecePlace{op.buf + op.done, -1});
    if (dst == nullptr) return moved;
    const uint64_t n = std::min<uint64_t>(slot, op.bytes - op.done);
    if (n > 0) ch.copy_into_slot(dst, op.buf + op.done, n);
    ch.send_post(op.peer, n, total, tag);
    op.done += n;
    op.started = true;
    moved = true;
  }
  return moved;
}

bool P2PEngine::progress_sends(int peer) {
  std::list<Op>& q = sendq_[peer];
  Channel& ch = dev_->p2p_channel();
  bool moved = false;
  const int64_t timeout = deadline_after(now_ns(), dev_->control().timeout_s());
  // One message streams to a peer at a time: one whose pieces began goes on first.
  auto streaming = std::find_if(q.begin(), q.end(), [](const Op& op) { return op.started && op.done < op.bytes; });
  if (streaming != q.end()) {
    if (advance(*streaming)) {
      moved = true;
      streaming->deadline_ns = timeout;
    }
    if (streaming->done < streaming->bytes) return moved;
    finish(*streaming, nullptr);
    q.erase(streaming);
    --pending_;
    if (!q.empty()) q.front().deadline_ns = timeout;
  }
  // Between messages: the CTS answers this rank owes the peer, then the queue in posting order.
  while (!cts_out_[peer].empty()) {
    if (ch.try_send_slot(peer, PiecePlace{}) == nullptr) return moved;
    ch.send_post(peer, 0, kCts, cts_out_[peer].front());
    cts_out_[peer].pop_front();
    moved = true;
  }
  for (auto it = q.begin(); it != q.end();) {
    Op& op = *it;
    if (op.rdv && !op.cleared) {
      if (!op.rts_sent) {
        char* dst = ch.try_send_slot(peer, PiecePlace{});
        if (dst == nullptr) return moved;
        begin(op);
        ch.copy_into_slot(dst, &op.rdv_id, sizeof(op.rdv_id));
        ch.send_post(peer, sizeof(op.rdv_id), op.bytes | kRts, op.tag);
        op.rts_sent = true;
        op.deadline_ns = timeout;  // from here it waits for its receive
        moved = true;
      }
      ++it;  // waits for its CTS; later sends go on
      continue;
    }
    if (advance(op)) {
      moved = true;
      op.deadline_ns = timeout;
    }
    if (op.done < op.bytes || !op.started) return moved;  // the channel is full
    finish(op, nullptr);
    it = q.erase(it);
    --pending_;
    if (it != q.end()) it->deadline_ns = timeout;
  }
  return moved;
}

bool P2PEngine::awaits_cts(int peer) const {
  return std::any_of(sendq_[peer].begin(), sendq_[peer].end(), [](const Op& op) { return op.waits_for_cts(); });
}

void P2PEngine::on_cts(int peer, uint64_t id) {
  for (Op& op : sendq_[peer])
    if (op.waits_for_cts() && op.rdv_id == id) {
      op.cleared = true;
      op.deadline_ns = deadline_after(now_ns(), dev_->control().timeout_s());
      return;
    }
  RC_THROW(Error, "ringcomm: send on rank " << rank_ << ": rank " << peer << " cleared message " << id
                                            << ", which this rank has not announced to it");
}

void P2PEngine::take_announced(Op& op, int peer, uint64_t id) {
  begin(op);
  op.rdv_matched = true;
  op.rdv_id = id;
  cts_out_[peer].push_back(id);
}

void P2PEngine::finish(Op& op, const std::exception_ptr& e) {
  if (e) {
    try {
      dev_->p2p_end(op.token, false);
    } catch (...) {
    }
    op.work->fail(e);
    return;
  }
  try {
    op.work->complete(dev_->p2p_end(op.token, true));
  } catch (...) {
    op.work->fail(std::current_exception());
  }
}

bool P2PEngine::reads_channel(int peer) const {
  return drain_ || !recvq_[peer].empty() || incoming_[peer].early != nullptr || incoming_[peer].op != nullptr ||
         !anyq_.empty() || awaits_cts(peer);
}

P2PEngine::Op* P2PEngine::unmatched_any(uint64_t tag, bool any_tag) {
  for (Op& op : anyq_)
    if (op.peer == kAnySource && (any_tag || op.tag == tag)) return &op;
  return nullptr;
}

void P2PEngine::check_size(const Op& op, int peer, uint64_t total) const {
  if (total != op.bytes) {
    RC_THROW(Mismatch, "ringcomm: recv on rank " << rank_ << " from rank " << peer << " (tag " << op.tag
                                                 << "): the matching send has " << total
                                                 << " bytes but the receive buffer has " << op.bytes);
  }
}

void P2PEngine::erase_recv(int peer, Op* target) {
  for (std::list<Op>* l : {&recvq_[peer], &anyq_})
    for (auto it = l->begin(); it != l->end(); ++it)
      if (&*it == target) {
        l->erase(it);
        --pending_;
        return;
      }
}

// Reads `peer`'s channel piece by piece while something takes the pieces. A piece is released
// (recv_done) only after it was copied out: the sender reuses the slot from then on.
bool P2PEngine::progress_recvs(int peer) {
  Channel& ch = dev_->p2p_channel();
  const Incoming& in = incoming_[peer];
  bool moved = take_buffered(peer);
  bool mid_message = false;  // a piece that continues a message of the peer moved (its CTSs wait behind it)
  for (;;) {
    const SlotMeta* m = nullptr;
    const char* src = ch.try_recv_slot(peer, PiecePlace{}, &m);
    if (src == nullptr) break;
    const bool continuing = in.op != nullptr || in.early != nullptr;
    if (!continuing) {
      const Start s = start_message(peer, *m, src);
      if (s == Start::kWaits) break;
      if (s == Start::kControl) {
        ch.recv_done(peer);
        moved = true;
        continue;
      }
    }
    mid_message |= continuing;
    take_piece(peer, *m, src);
    moved = true;
  }
  if (moved) refresh_recv_deadlines(peer, mid_message);
  return moved;
}

bool P2PEngine::take_buffered(int peer) {
  std::list<Op>& q = recvq_[peer];
  std::list<Early>& early = early_[peer];
  if (early.empty()) return false;
  bool moved = false;
  for (auto it = q.begin(); it != q.end();) {
    Op& op = *it;
    auto e = std::find_if(early.begin(), early.end(), [&](const Early& x) { return x.tag == op.tag; });
    // The receive streaming in already has its message; a matched one waits for its data.
    if (&op == incoming_[peer].op || op.rdv_matched || e == early.end() || !e->complete) {
      ++it;
      continue;
    }
    check_size(op, peer, e->total);
    moved = true;
    if (e->announced) {
      take_announced(op, peer, e->rdv_id);
      early.erase(e);
      ++it;
      continue;
    }
    take_early(op, *e);
    early.erase(e);
    it = q.erase(it);
    --pending_;
  }
  return moved;
}

P2PEngine::Start P2PEngine::start_message(int peer, const SlotMeta& m, const char* src) {
  const uint64_t kind = m.total & kKinds, total = m.total & ~kKinds;
  if (kind == kCts) {  // the peer's receive took our RTS: that send's data may go
    on_cts(peer, m.tag);
    return Start::kControl;
  }
  if (kind == kRdvData) {  // the data of an RTS a receive of ours took: only that receive
    Op* target = nullptr;
    for (std::list<Op>* l : {&recvq_[peer], &anyq_})
      for (Op& op : *l)
        if (target == nullptr && op.rdv_matched && op.peer == peer && op.rdv_id == m.tag) target = &op;
    RC_CHECK(target != nullptr, Error,
             "ringcomm: recv on rank " << rank_ << ": rank " << peer << " sent the data of message " << m.tag
                                       << ", which no receive of this rank cleared");
    check_size(*target, peer, total);
    incoming_[peer].op = target;
    return Start::kData;
  }
  Op* target = match_new(peer, m.tag);
  if (kind == kRts) {
    uint64_t id = 0;
    RC_CHECK(m.bytes == sizeof(id), Error, "ringcomm: recv on rank " << rank_ << ": a malformed RTS from rank " << peer);
    std::memcpy(&id, src, sizeof(id));
    if (target != nullptr) {
      check_size(*target, peer, total);
      take_announced(*target, peer, id);
    } else {
      // Held without data, in arrival order with the buffered messages.
      Early e{m.tag, total, {}, 0, true, arrivals_++};
      e.announced = true;
      e.rdv_id = id;
      early_[peer].push_back(std::move(e));
    }
    return Start::kControl;
  }
  if (target == nullptr) return buffer_or_wait(peer, m.tag, total);
  check_size(*target, peer, total);
  begin(*target);
  incoming_[peer].op = target;
  return Start::kData;
}

P2PEngine::Op* P2PEngine::match_new(int peer, uint64_t tag) {
  // (1) An earlier message of (peer, tag) still buffered goes first: no receive takes this one.
  const std::list<Early>& early = early_[peer];
  if (std::any_of(early.begin(), early.end(), [&](const Early& x) { return x.tag == tag; })) return nullptr;
  // (2) The first posted receive from the peer with the tag.
  for (Op& op : recvq_[peer])
    if (op.tag == tag && !op.rdv_matched) return &op;
  // (3) The first unmatched any-source receive with the tag, bound to the peer from now on.
  Op* any = unmatched_any(tag, false);
  if (any != nullptr) {
    any->peer = peer;
    any->work->set_source(peer);
  }
  return any;
}

P2PEngine::Start P2PEngine::buffer_or_wait(int peer, uint64_t tag, uint64_t total) {
  // A posted receive or an awaited CTS waits behind it, or the slot is in the sender's outbox
  // (which every receiver of that sender shares): buffer the message so that the channel moves
  // on. Otherwise no receive is posted for it yet: it waits in the channel (flow control).
  const bool behind = drain_ || !recvq_[peer].empty() || unmatched_any(0, true) != nullptr || awaits_cts(peer);
  if (!behind || !dev_->p2p_slots_in_host_memory()) return Start::kWaits;
  std::list<Early>& early = early_[peer];
  early.push_back(Early{tag, total, std::unique_ptr<char[]>(new char[total]), 0, false, arrivals_++});
  incoming_[peer].early = &early.back();
  return Start::kData;
}

void P2PEngine::take_piece(int peer, const SlotMeta& m, const char* src) {
  Channel& ch = dev_->p2p_channel();
  Incoming& in = incoming_[peer];
  if (in.op != nullptr) {
    Op& op = *in.op;
    RC_CHECK(op.done + m.bytes <= op.bytes, Error, "ringcomm: recv: message overruns the buffer");
    if (m.bytes > 0) ch.copy(op.buf + op.done, src, m.bytes);
    op.done += m.bytes;
    op.started = true;
    ch.recv_done(peer);
    if (op.done == op.bytes) {
      in.op = nullptr;
      finish(op, nullptr);
      erase_recv(peer, &op);
    }
    return;
  }
  Early& e = *in.early;
  RC_CHECK(e.got + m.bytes <= e.total, Error, "ringcomm: recv: message overruns its announced size");
  if (m.bytes > 0) std::memcpy(e.data.get() + e.got, src, m.bytes);
  e.got += m.bytes;
  ch.recv_done(peer);
  if (e.got == e.total) {
    e.complete = true;
    in.early = nullptr;
  }
}

void P2PEngine::refresh_recv_deadlines(int peer, bool mid_message) {
  // Progress with this peer: every receive from it counts its deadline from now.
  const int64_t d = deadline_after(now_ns(), dev_->control().timeout_s());
  for (Op& op : recvq_[peer]) op.deadline_ns = d;
  for (Op& op : anyq_) op.deadline_ns = d;
  // Our sends to this peer that wait for its CTS: it cannot send one while its message streams.
  const Incoming& in = incoming_[peer];
  if (mid_message || in.op != nullptr || in.early != nullptr)
    for (Op& op : sendq_[peer])
      if (op.waits_for_cts()) op.deadline_ns = d;
}

void P2PEngine::take_early(Op& op, const Early& e) {
  begin(op);
  if (e.total > 0) std::memcpy(op.buf, e.data.get(), e.total);
  op.done = op.bytes;
  op.started = true;
  finish(op, nullptr);
}

bool P2PEngine::match_any_early() {
  bool moved = false;
  for (auto it = anyq_.begin(); it != anyq_.end();) {
    Op& op = *it;
    if (op.peer != kAnySource) {  // matched: its message streams in through progress_recvs
      ++it;
      continue;
    }
    // The buffered message with this tag that began to arrive first, over every peer. Within one
    // peer, the first with the tag is also the oldest (order per (peer, tag)).
    int from = -1;
    std::list<Early>::iterator best;
    for (int p = 0; p < world_; ++p) {
      auto e = std::find_if(early_[p].begin(), early_[p].end(), [&](const Early& x) { return x.tag == op.tag; });
      if (e == early_[p].end() || !e->complete) continue;
      // A posted receive from p with this tag takes it first (the order rule's (2)).
      if (std::any_of(recvq_[p].begin(), recvq_[p].end(), [&](const Op& x) { return x.tag == op.tag && !x.rdv_matched; }))
        continue;
      if (from < 0 || e->stamp < best->stamp) {
        from = p;
        best = e;
      }
    }
    if (from < 0) {
      ++it;
      continue;
    }
    if (best->total != op.bytes) {
      RC_THROW(Mismatch, "ringcomm: recv (any source) on rank " << rank_ << " matched a message from rank " << from
                                                                << " (tag " << op.tag << ") of " << best->total
                                                                << " bytes but the receive buffer has " << op.bytes);
    }
    op.peer = from;
    op.work->set_source(from);
    moved = true;
    if (best->announced) {  // its data streams in through progress_recvs, after our CTS
      take_announced(op, from, best->rdv_id);
      early_[from].erase(best);
      ++it;
      continue;
    }
    take_early(op, *best);
    early_[from].erase(best);
    it = anyq_.erase(it);
    --pending_;
  }
  return moved;
}

// ---------------- the engine thread ----------------

void P2PEngine::loop() {
  dev_->p2p_thread_start();
  drain_ = dev_->control().has_outbox() && dev_->p2p_slots_in_host_memory();
  cts_out_.assign(world_, {});
  sendq_.assign(world_, {});
  recvq_.assign(world_, {});
  incoming_.assign(world_, {});
  early_ = std::vector<std::list<Early>>(world_);
  int64_t idle_since = 0;  // when the passes began to move nothing (0: the last one moved something)
  while (take_new()) {
    if (failed_) {  // broken: what reached the engine since fails with the first error
      fail_all(failed_);
      continue;
    }
    // Read before the pass: a peer that posts (or a submit() that rings) during the pass changes
    // the doorbell, so the wait below returns at once instead of missing it.
    const uint32_t bell = dev_->control().doorbell_value();
    bool sleep = false;
    try {
      if (progress_all()) {
        idle_since = 0;
        continue;
      }
      sleep = settle(idle_since);
    } catch (...) {
      // The one failure path: a data-phase error breaks the communicator (the core records it
      // and tells the peers), and every pending operation fails with it.
      const std::exception_ptr e = std::current_exception();
      on_failure_(e);
      fail_all(e);
      continue;
    }
    if (sleep) dev_->control().doorbell_wait(bell, std::min<int64_t>(dev_->control().config().liveness_ns, 20'000'000));
  }
}

bool P2PEngine::take_new() {
  std::unique_lock<std::mutex> lk(mu_);
  // Draining, the thread never waits here (until a failure, after which it reads no channel):
  // it sleeps on the doorbell (loop), which submit() and stop() ring as well as every peer that
  // posts a message to this rank.
  if (pending_ == 0 && (!drain_ || failed_)) cv_.wait(lk, [&] { return stopping_ || !new_.empty(); });
  while (!new_.empty()) {
    Op op = std::move(new_.front());
    new_.pop_front();
    if (op.is_send) {
      op.rdv = dev_->p2p_slots_in_host_memory() && op.bytes > eager_bytes_;
      if (op.rdv) op.rdv_id = next_rdv_id_++;
      sendq_[op.peer].push_back(std::move(op));
    } else if (op.peer == kAnySource) {
      anyq_.push_back(std::move(op));
    } else {
      recvq_[op.peer].push_back(std::move(op));
    }
    ++pending_;
  }
  if (!stopping_) return true;
  lk.unlock();
  fail_closed();
  return false;
}

bool P2PEngine::progress_all() {
  // Sends first: they also carry the CTS answers this rank owes, which the peers' data waits for.
  bool progressed = false;
  for (int p = 0; p < world_; ++p) progressed |= progress_sends_to(p);
  // Buffered messages first (arrival order), then the channels (see the header's order rule).
  if (!anyq_.empty()) progressed |= match_any_early();
  for (int p = 0; p < world_; ++p)
    if (reads_channel(p)) progressed |= progress_recvs(p);
  return progressed;
}

bool P2PEngine::progress_sends_to(int peer) {
  if (sendq_[peer].empty() && cts_out_[peer].empty()) return false;
  // The deadline counts from the operation's last progress: a long message that keeps moving,
  // or one queued behind others, never times out while the pair is busy.
  const bool moved = progress_sends(peer);
  if (moved && !cts_out_[peer].empty()) {
    // Our message to the peer still streams and our CTS to it waits behind it: the receives
    // awaiting that data are not idle.
    const int64_t d = deadline_after(now_ns(), dev_->control().timeout_s());
    for (Op& op : recvq_[peer])
      if (op.rdv_matched) op.deadline_ns = d;
    for (Op& op : anyq_)
      if (op.rdv_matched && op.peer == peer) op.deadline_ns = d;
  }
  return moved;
}

bool P2PEngine::settle(int64_t& idle_since) {
  if (pending_ == 0) {
    // Nothing posted: no deadline runs and no peer is waited on. Draining, sleep until a peer
    // posts (or a slice passes); else take_new() waits for a submit.
    idle_since = 0;
    return drain_;
  }
  ShmControl& t = dev_->control();
  const int64_t now = now_ns();
  if (idle_since == 0) idle_since = now;
  if (now - idle_since < t.config().spin_ns()) {
    for (int i = 0; i < 64; ++i) cpu_relax();
    return false;
  }
  // Idle: check deadlines and peers, then sleep until the doorbell rings (or a slice passes).
  WaitCtx w;
  w.op = "send/recv";
  if (t.aborting()) {
    // comm.abort(): the core told the peers; pending operations fail with the abort's error.
    fail_all(t.interrupt_error(w));
    return false;
  }
  check_deadlines(now);
  const bool live = now >= next_liveness_;
  if (live) next_liveness_ = now + t.config().liveness_ns;
  t.check_peers(w, live);
  return true;
}

void P2PEngine::check_deadlines(int64_t now) const {
  auto check = [&](const Op& op) {
    if (now > op.deadline_ns) {
      RC_THROW(TimeoutError, "ringcomm: " << (op.is_send ? "send to" : "recv from") << " rank " << op.peer
                                          << " on rank " << rank_ << " (tag " << op.tag << "): Timed out after "
                                          << dev_->control().timeout_s() << " s ("
                                          << (op.waits_for_cts() ? "announced; its receive was not posted, " : "")
                                          << op.done << " of " << op.bytes << " bytes moved)");
    }
  };
  for (const auto& q : sendq_)
    for (const Op& op : q)  // the first, and every send waiting for its CTS
      if (&op == &q.front() || op.waits_for_cts()) check(op);
  for (const auto& q : recvq_)
    if (!q.empty()) check(q.front());
  if (!anyq_.empty()) check(anyq_.front());
}

void P2PEngine::for_each_op(const std::function<void(Op&)>& fn) {
  for (auto& q : sendq_)
    for (auto& op : q) fn(op);
  for (auto& q : recvq_)
    for (auto& op : q) fn(op);
  for (auto& op : anyq_) fn(op);
}

void P2PEngine::fail_all(const std::exception_ptr& e) {
  if (!failed_) failed_ = e;
  for_each_op([&](Op& op) { finish(op, e); });
  for (auto& q : sendq_) q.clear();
  for (auto& q : recvq_) q.clear();
  anyq_.clear();
  for (auto& in : incoming_) in = Incoming{};
  for (auto& c : cts_out_) c.clear();
  pending_ = 0;
}

void P2PEngine::fail_closed() {
  for_each_op([&](Op& op) {
    finish(op, std::make_exception_ptr(Closed(
        std::string("ringcomm: ") + (op.is_send ? "send to" : "recv from") + " rank " +
        (op.peer == kAnySource ? std::string("(any)") : std::to_string(op.peer)) + " on rank " +
        std::to_string(rank_) + " (" + std::to_string(op.done) + " of " + std::to_string(op.bytes) +
        " bytes moved): the communicator was closed while it was pending")));
  });
}

}  // namespace rc
