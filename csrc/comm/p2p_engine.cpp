#include "comm/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <vector>

#include "comm/header_exchange.h"
#include "common/errors.h"
#include "transport/futex.h"

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

bool P2PEngine::progress_sends(int peer, std::list<Op>& q) {
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

// The receive side of one peer: tag matching (see the header). Returns true if anything moved.
bool P2PEngine::progress_recvs(int peer, std::list<Op>& q, std::list<Op>& anyq, Incoming& in, std::list<Early>& early,
                               size_t& pending) {
  Channel& ch = dev_->p2p_channel();
  bool moved = false;
  bool mid_message = false;  // a piece that continues a message of the peer moved (its CTSs wait behind it)
  auto erase_op = [&](Op* target) {
    for (std::list<Op>* l : {&q, &anyq})
      for (auto it = l->begin(); it != l->end(); ++it)
        if (&*it == target) {
          l->erase(it);
          --pending;
          return;
        }
  };
  // An any-source receive not yet matched to a peer's message (its peer is still kAnySource).
  auto unmatched_any = [&](uint64_t tag, bool any_tag) -> Op* {
    for (Op& op : anyq)
      if (op.peer == kAnySource && (any_tag || op.tag == tag)) return &op;
    return nullptr;
  };
  auto size_check = [&](const Op& op, uint64_t total) {
    if (total != op.bytes) {
      RC_THROW(Mismatch, "ringcomm: recv on rank " << rank_ << " from rank " << peer << " (tag " << op.tag
                                                   << "): the matching send has " << total
                                                   << " bytes but the receive buffer has " << op.bytes);
    }
  };
  // Posted receives whose message arrived before them (complete in `early`): copy and finish;
  // one that was announced (an RTS) is matched, its CTS queued, and its data awaited.
  if (!early.empty()) {
    for (auto it = q.begin(); it != q.end();) {
      Op& op = *it;
      auto e = std::find_if(early.begin(), early.end(), [&](const Early& x) { return x.tag == op.tag; });
      if (&op == in.op || op.rdv_matched || e == early.end() || !e->complete) {
        ++it;
        continue;
      }
      size_check(op, e->total);
      if (e->announced) {
        take_announced(op, peer, e->rdv_id);
        early.erase(e);
        ++it;
        moved = true;
        continue;
      }
      take_early(op, *e);
      early.erase(e);
      it = q.erase(it);
      --pending;
      moved = true;
    }
  }
  for (;;) {
    const SlotMeta* m = nullptr;
    const char* src = ch.try_recv_slot(peer, PiecePlace{}, &m);
    if (src == nullptr) break;
    const bool continuing = in.op != nullptr || in.early != nullptr;
    if (!continuing) {
      const uint64_t kind = m->total & kKinds, total = m->total & ~kKinds;
      if (kind == kCts) {  // the peer's receive took our RTS: that send's data may go
        on_cts(peer, m->tag);
        ch.recv_done(peer);
        moved = true;
        continue;
      }
      if (kind == kRdvData) {  // the data of an RTS a receive of ours took: only that receive
        Op* target = nullptr;
        for (std::list<Op>* l : {&q, &anyq})
          for (Op& op : *l)
            if (target == nullptr && op.rdv_matched && op.peer == peer && op.rdv_id == m->tag) target = &op;
        RC_CHECK(target != nullptr, Error,
                 "ringcomm: recv on rank " << rank_ << ": rank " << peer << " sent the data of message " << m->tag
                                           << ", which no receive of this rank cleared");
        size_check(*target, total);
        in.op = target;
      } else {
        // A new message (or its RTS) starts: the first posted receive with its tag takes it,
        // unless an earlier message with that tag is still buffered (order per (peer, tag)).
        const uint64_t tag = m->tag;
        const bool earlier = std::any_of(early.begin(), early.end(), [&](const Early& x) { return x.tag == tag; });
        Op* target = nullptr;
        if (!earlier)
          for (Op& op : q)
            if (op.tag == tag && !op.rdv_matched) {
              target = &op;
              break;
            }
        if (target == nullptr && !earlier) {
          target = unmatched_any(tag, false);
          if (target != nullptr) {
            target->peer = peer;
            target->work->set_source(peer);
          }
        }
        if (kind == kRts) {
          uint64_t id = 0;
          RC_CHECK(m->bytes == sizeof(id), Error, "ringcomm: recv on rank " << rank_ << ": a malformed RTS from rank " << peer);
          std::memcpy(&id, src, sizeof(id));
          if (target != nullptr) {
            size_check(*target, total);
            take_announced(*target, peer, id);
          } else {
            // Held without data, in arrival order with the buffered messages.
            Early e{tag, total, {}, 0, true, arrivals_++};
            e.announced = true;
            e.rdv_id = id;
            early.push_back(std::move(e));
          }
          ch.recv_done(peer);
          moved = true;
          continue;
        }
        if (target != nullptr) {
          size_check(*target, total);
          begin(*target);
          in.op = target;
        } else if ((drain_ || !q.empty() || unmatched_any(0, true) != nullptr || awaits_cts(peer)) &&
                   dev_->p2p_slots_in_host_memory()) {
          // A posted receive or an awaited CTS waits behind it, or the slot is in the sender's
          // outbox (which every receiver of that sender shares): buffer the message so that the
          // channel moves on.
          early.push_back(Early{tag, total, std::unique_ptr<char[]>(new char[total]), 0, false, arrivals_++});
          in.early = &early.back();
        } else {
          break;  // no receive posted for it yet: it waits in the channel (flow control)
        }
      }
    }
    mid_message |= continuing;
    if (in.op != nullptr) {
      Op& op = *in.op;
      RC_CHECK(op.done + m->bytes <= op.bytes, Error, "ringcomm: recv: message overruns the buffer");
      if (m->bytes > 0) ch.copy(op.buf + op.done, src, m->bytes);
      op.done += m->bytes;
      op.started = true;
      ch.recv_done(peer);
      moved = true;
      if (op.done == op.bytes) {
        in.op = nullptr;
        finish(op, nullptr);
        erase_op(&op);
      }
    } else {
      Early& e = *in.early;
      RC_CHECK(e.got + m->bytes <= e.total, Error, "ringcomm: recv: message overruns its announced size");
      if (m->bytes > 0) std::memcpy(e.data.get() + e.got, src, m->bytes);
      e.got += m->bytes;
      ch.recv_done(peer);
      moved = true;
      if (e.got == e.total) {
        e.complete = true;
        in.early = nullptr;
      }
    }
  }
  if (moved) {
    // Progress with this peer: every receive from it counts its deadline from now.
    const int64_t d = deadline_after(now_ns(), dev_->control().timeout_s());
    for (Op& op : q) op.deadline_ns = d;
    for (Op& op : anyq) op.deadline_ns = d;
    // Our sends to this peer that wait for its CTS: it cannot send one while its message streams.
    if (mid_message || in.op != nullptr || in.early != nullptr)
      for (Op& op : sendq_[peer])
        if (op.waits_for_cts()) op.deadline_ns = d;
  }
  return moved;
}

void P2PEngine::take_early(Op& op, const Early& e) {
  begin(op);
  if (e.total > 0) std::memcpy(op.buf, e.data.get(), e.total);
  op.done = op.bytes;
  op.started = true;
  finish(op, nullptr);
}

bool P2PEngine::match_any_early(std::list<Op>& anyq, std::vector<std::list<Early>>& early,
                                const std::vector<std::list<Op>>& recvq, size_t& pending) {
  bool moved = false;
  for (auto it = anyq.begin(); it != anyq.end();) {
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
      auto e = std::find_if(early[p].begin(), early[p].end(), [&](const Early& x) { return x.tag == op.tag; });
      if (e == early[p].end() || !e->complete) continue;
      // A posted receive from p with this tag takes it first (progress_recvs, rule 2).
      if (std::any_of(recvq[p].begin(), recvq[p].end(), [&](const Op& x) { return x.tag == op.tag && !x.rdv_matched; }))
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
      early[from].erase(best);
      ++it;
      continue;
    }
    take_early(op, *best);
    early[from].erase(best);
    it = anyq.erase(it);
    --pending;
  }
  return moved;
}

void P2PEngine::loop() {
  dev_->p2p_thread_start();
  ShmTransport& t = dev_->control();
  const ShmConfig& cfg = t.config();
  drain_ = t.has_outbox() && dev_->p2p_slots_in_host_memory();
  cts_out_.assign(world_, {});
  sendq_.assign(world_, {});
  std::vector<std::list<Op>>& sendq = sendq_;
  std::vector<std::list<Op>> recvq(world_);
  std::list<Op> anyq;  // any-source receives, in posting order
  std::vector<Incoming> incoming(world_);
  std::vector<std::list<Early>> early(world_);
  size_t pending = 0;
  int64_t idle_since = 0, next_liveness = 0;
  auto each_op = [&](const std::function<void(Op&)>& fn) {
    for (auto& q : sendq)
      for (auto& op : q) fn(op);
    for (auto& q : recvq)
      for (auto& op : q) fn(op);
    for (auto& op : anyq) fn(op);
  };
  auto fail_all = [&](const std::exception_ptr& e) {
    if (!failed_) failed_ = e;
    each_op([&](Op& op) { finish(op, e); });
    for (auto& q : sendq) q.clear();
    for (auto& q : recvq) q.clear();
    anyq.clear();
    for (auto& in : incoming) in = Incoming{};
    for (auto& c : cts_out_) c.clear();
    pending = 0;
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Draining, the thread never waits here (until a failure, after which it reads no channel):
      // it sleeps on the doorbell (below), which submit() and stop() ring as well as every peer
      // that posts a message to this rank.
      if (pending == 0 && (!drain_ || failed_)) cv_.wait(lk, [&] { return stopping_ || !new_.empty(); });
      while (!new_.empty()) {
        Op op = std::move(new_.front());
        new_.pop_front();
        if (op.is_send) {
          op.rdv = dev_->p2p_slots_in_host_memory() && op.bytes > eager_bytes_;
          if (op.rdv) op.rdv_id = next_rdv_id_++;
          sendq[op.peer].push_back(std::move(op));
        } else if (op.peer == kAnySource) {
          anyq.push_back(std::move(op));
        } else {
          recvq[op.peer].push_back(std::move(op));
        }
        ++pending;
      }
      if (stopping_) {
        lk.unlock();
        each_op([&](Op& op) {
          finish(op, std::make_exception_ptr(Closed(
              std::string("ringcomm: ") + (op.is_send ? "send to" : "recv from") + " rank " +
              (op.peer == kAnySource ? std::string("(any)") : std::to_string(op.peer)) + " on rank " + std::to_string(rank_) + " (" + std::to_string(op.done) +
              " of " + std::to_string(op.bytes) + " bytes moved): the communicator was closed while it was pending")));
        });
        return;
      }
    }
    if (failed_) {  // broken: what reached the engine since fails with the first error
      fail_all(failed_);
      continue;
    }
    const uint32_t bell = t.doorbell_value();
    bool progressed = false;
    bool failed = false;
    for (int p = 0; p < world_ && !failed; ++p) {
      if (sendq[p].empty() && cts_out_[p].empty()) continue;
      const size_t before = sendq[p].size();
      try {
        // The deadline counts from the operation's last progress: a long message that keeps
        // moving, or one queued behind others, never times out while the pair is busy.
        const bool moved = progress_sends(p, sendq[p]);
        progressed |= moved;
        if (moved && !cts_out_[p].empty()) {
          // Our message to p still streams and our CTS to p waits behind it: the receives
          // awaiting that data are not idle.
          const int64_t d = deadline_after(now_ns(), t.timeout_s());
          for (Op& op : recvq[p])
            if (op.rdv_matched) op.deadline_ns = d;
          for (Op& op : anyq)
            if (op.rdv_matched && op.peer == p) op.deadline_ns = d;
        }
      } catch (...) {
        const std::exception_ptr e = std::current_exception();
        on_failure_(e);
        fail_all(e);
        failed = true;
        break;
      }
      pending -= before - sendq[p].size();
    }
    // Buffered messages first (arrival order), then the channels (see the header's order rule).
    if (!anyq.empty() && !failed) {
      try {
        progressed |= match_any_early(anyq, early, recvq, pending);
      } catch (...) {
        const std::exception_ptr e = std::current_exception();
        on_failure_(e);
        fail_all(e);
        failed = true;
      }
    }
    for (int p = 0; p < world_ && !failed; ++p) {
      if (!drain_ && recvq[p].empty() && incoming[p].early == nullptr && incoming[p].op == nullptr && anyq.empty() &&
          !awaits_cts(p))
        continue;
      try {
        progressed |= progress_recvs(p, recvq[p], anyq, incoming[p], early[p], pending);
      } catch (...) {
        const std::exception_ptr e = std::current_exception();
        on_failure_(e);
        fail_all(e);
        failed = true;
      }
    }

    if (progressed || (pending == 0 && !drain_)) {
      idle_since = 0;
      continue;
    }
    if (pending == 0) {
      // Draining with nothing posted: no deadline runs and no peer is waited on; sleep until a
      // peer posts (or a slice passes).
      idle_since = 0;
      t.doorbell_wait(bell, std::min<int64_t>(cfg.liveness_ns, 20'000'000));
      continue;
    }
    const int64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < cfg.spin_ns) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      continue;
    }
    // Idle: check deadlines and peers, then sleep until the doorbell rings (or a slice passes).
    if (t.aborting()) {
      // comm.abort(): the core told the peers; pending operations fail with the abort's error.
      WaitCtx w;
      w.op = "send/recv";
      fail_all(t.interrupt_error(w));
      continue;
    }
    try {
      auto check_deadline = [&](const Op& op) {
        if (now > op.deadline_ns) {
          RC_THROW(TimeoutError, "ringcomm: " << (op.is_send ? "send to" : "recv from") << " rank " << op.peer
                                              << " on rank " << rank_ << " (tag " << op.tag << "): Timed out after "
                                              << t.timeout_s() << " s ("
                                              << (op.waits_for_cts() ? "announced; its receive was not posted, "
                                                                             : "")
                                              << op.done << " of " << op.bytes << " bytes moved)");
        }
      };
      for (auto& q : sendq)
        for (const Op& op : q)  // the first, and every send waiting for its CTS
          if (&op == &q.front() || op.waits_for_cts()) check_deadline(op);
      for (auto& q : recvq)
        if (!q.empty()) check_deadline(q.front());
      if (!anyq.empty()) check_deadline(anyq.front());
      WaitCtx w;
      w.op = "send/recv";
      const bool live = now >= next_liveness;
      if (live) next_liveness = now + cfg.liveness_ns;
      t.check_peers(w, live);
    } catch (...) {
      const std::exception_ptr e = std::current_exception();
      on_failure_(e);
      fail_all(e);
      continue;
    }
    t.doorbell_wait(bell, std::min<int64_t>(cfg.liveness_ns, 20'000'000));
  }
}

}  // namespace rc
