#include "comm/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <vector>

#include "comm/header_exchange.h"
#include "common/errors.h"
#include "transport/futex.h"

namespace rc {

P2PEngine::P2PEngine(int rank, int world, CommDevice* dev, std::function<void(const std::exception_ptr&)> on_failure)
    : rank_(rank), world_(world), dev_(dev), on_failure_(std::move(on_failure)) {}

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

// Moves as many pieces as the channel allows right now; true if anything moved.
bool P2PEngine::advance(Op& op) {
  Channel& ch = dev_->p2p_channel();
  const size_t slot = ch.piece_bytes();
  bool moved = false;
  if (!op.begun) {
    dev_->p2p_begin(op.token);
    op.begun = true;
  }
  while (!op.started || op.done < op.bytes) {
    if (op.is_send) {
      char* dst = ch.try_send_slot(op.peer, PiecePlace{op.buf + op.done, -1});
      if (dst == nullptr) return moved;
      const uint64_t n = std::min<uint64_t>(slot, op.bytes - op.done);
      if (n > 0) ch.copy_into_slot(dst, op.buf + op.done, n);
      ch.send_post(op.peer, n, op.bytes, op.tag);
      op.done += n;
    } else {
      const SlotMeta* m = nullptr;
      const char* src = ch.try_recv_slot(op.peer, PiecePlace{}, &m);
      if (src == nullptr) return moved;
      if (!op.started && m->total != op.bytes) {
        RC_THROW(Mismatch, "ringcomm: recv on rank " << rank_ << " from rank " << op.peer << ": the matching send has "
                                                     << m->total << " bytes but the receive buffer has " << op.bytes);
      }
      RC_CHECK(op.done + m->bytes <= op.bytes, Error, "ringcomm: recv: message overruns the buffer");
      if (m->bytes > 0) ch.copy(op.buf + op.done, src, m->bytes);
      op.done += m->bytes;
      ch.recv_done(op.peer);
    }
    op.started = true;
    moved = true;
  }
  return moved;
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
  // Posted receives whose message arrived before them (complete in `early`): copy and finish.
  if (!early.empty()) {
    for (auto it = q.begin(); it != q.end();) {
      Op& op = *it;
      auto e = std::find_if(early.begin(), early.end(), [&](const Early& x) { return x.tag == op.tag; });
      if (&op == in.op || e == early.end() || !e->complete) {
        ++it;
        continue;
      }
      size_check(op, e->total);
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
    if (in.op == nullptr && in.early == nullptr) {
      // A new message starts: the first posted receive with its tag takes it, unless an earlier
      // message with that tag is still buffered (order per (peer, tag)).
      const uint64_t tag = m->tag;
      const bool earlier = std::any_of(early.begin(), early.end(), [&](const Early& x) { return x.tag == tag; });
      Op* target = nullptr;
      if (!earlier)
        for (Op& op : q)
          if (op.tag == tag) {
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
      if (target != nullptr) {
        size_check(*target, m->total);
        if (!target->begun) {
          dev_->p2p_begin(target->token);
          target->begun = true;
        }
        in.op = target;
      } else if ((drain_ || !q.empty() || unmatched_any(0, true) != nullptr) && dev_->p2p_slots_in_host_memory()) {
        // A posted receive waits behind it, or the slot is in the sender's outbox (which every
        // receiver of that sender shares): buffer the message so that the channel moves on.
        early.push_back(Early{tag, m->total, std::vector<char>(m->total), 0, false, arrivals_++});
        in.early = &early.back();
      } else {
        break;  // no receive posted for it yet: it waits in the channel (flow control)
      }
    }
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
      if (m->bytes > 0) std::memcpy(e.data.data() + e.got, src, m->bytes);
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
  }
  return moved;
}

void P2PEngine::take_early(Op& op, const Early& e) {
  if (!op.begun) {
    dev_->p2p_begin(op.token);
    op.begun = true;
  }
  if (e.total > 0) std::memcpy(op.buf, e.data.data(), e.total);
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
      if (std::any_of(recvq[p].begin(), recvq[p].end(), [&](const Op& x) { return x.tag == op.tag; })) continue;
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
    take_early(op, *best);
    early[from].erase(best);
    it = anyq.erase(it);
    --pending;
    moved = true;
  }
  return moved;
}

void P2PEngine::loop() {
  dev_->p2p_thread_start();
  ShmTransport& t = dev_->control();
  const ShmConfig& cfg = t.config();
  drain_ = t.has_outbox() && dev_->p2p_slots_in_host_memory();
  std::vector<std::deque<Op>> sendq(world_);
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
    each_op([&](Op& op) { finish(op, e); });
    for (auto& q : sendq) q.clear();
    for (auto& q : recvq) q.clear();
    anyq.clear();
    for (auto& in : incoming) in = Incoming{};
    pending = 0;
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Draining, the thread never waits here: it sleeps on the doorbell (below), which submit()
      // and stop() ring as well as every peer that posts a message to this rank.
      if (pending == 0 && !drain_) cv_.wait(lk, [&] { return stopping_ || !new_.empty(); });
      while (!new_.empty()) {
        Op op = std::move(new_.front());
        new_.pop_front();
        if (op.is_send) {
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
    const uint32_t bell = t.doorbell_value();
    bool progressed = false;
    bool failed = false;
    for (auto& q : sendq) {
      while (!q.empty() && !failed) {
        Op& op = q.front();
        try {
          // The deadline counts from the operation's last progress: a long message that keeps
          // moving, or one queued behind others, never times out while the pair is busy.
          if (advance(op)) {
            progressed = true;
            op.deadline_ns = deadline_after(now_ns(), t.timeout_s());
          }
        } catch (...) {
          const std::exception_ptr e = std::current_exception();
          on_failure_(e);
          fail_all(e);
          failed = true;
          break;
        }
        if (op.started && op.done == op.bytes) {
          finish(op, nullptr);
          q.pop_front();
          --pending;
          progressed = true;
          if (!q.empty()) q.front().deadline_ns = deadline_after(now_ns(), t.timeout_s());
        } else {
          break;
        }
      }
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
      if (!drain_ && recvq[p].empty() && incoming[p].early == nullptr && incoming[p].op == nullptr && anyq.empty()) continue;
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
                                              << t.timeout_s() << " s (" << op.done << " of " << op.bytes
                                              << " bytes moved)");
        }
      };
      for (auto& q : sendq)
        if (!q.empty()) check_deadline(q.front());
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
