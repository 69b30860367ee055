// Point-to-point messages between two ranks, on a thread of their own over the device's point-to-point lane, so that matching
// sends and receives posted in any order never deadlock behind each other (or behind
// collectives, which use the other lane).
//
// Threading invariants: submit() may be called from any thread (it only appends to p2p_new_
// under p2p_mu_ and rings this rank's doorbell); every slot of the point-to-point lane is touched
// by the engine's thread only. A message is cut into slot-sized pieces; the first piece carries
// the message's total size and tag, which the receiver checks against its buffer.
//
// Tag matching: a receive with tag t from peer p takes only a message with tag t from p, and
// messages of one (peer, tag) are taken in the order they were sent. Sends leave in posting
// order per peer. When the next message in p's channel has a tag no posted receive from p wants
// while some receive from p is posted, the engine copies that message into a private buffer (on
// devices whose slots are host memory) so the channel moves on; a later receive with its tag
// takes it from there. With no receive from p posted, messages wait in the channel (flow
// control), so programs that use tag 0 only never buffer; except where the slots are the
// sender's outbox (the shm transport's outbox layout, transport/shm_outbox.h): every receiver of that
// sender shares them, so the engine drains every message that reaches this rank into a private
// buffer at once when no posted receive takes it (MPI's unexpected-message queue; memory grows
// with what is sent and not yet received, at most the eager size per message: see Rendezvous),
// and an outbox never stays full behind a receive that is not posted. Then the thread sleeps on
// the doorbell even with nothing posted.
//
// Rendezvous (slots in host memory): a send of more than RINGCOMM_P2P_EAGER_BYTES is never
// buffered in the receiver's private memory. Its sender posts a request to send (RTS: a
// one-piece message with the tag, the size and the send's id, this sender's counter) and keeps
// it pending while later sends to that peer go on; the receive that takes the RTS (by the order
// rule below, as it would take the message) answers with a clear to send (CTS: a one-piece
// message naming the id) and waits; on the CTS the sender streams the data as a message named by
// the id, which only that receive takes. An RTS that no posted receive takes is held as a
// buffered message without data, so order per (peer, tag) holds across both protocols, and what
// a rank holds for receives not yet posted is at most the eager size per message. A send that
// waits for its CTS times out after the timeout, as a send in gloo waits for its receive.
// While a send to p waits for its CTS, p's channel is read as if a receive from p were posted
// (messages no receive takes are buffered), so a CTS behind them always arrives.
// Wire form: the kind sits in the top bits of the first piece's `total` (sizes stay below
// 2^61); a data message's `tag` is the id. One message streams to a peer at a time: a CTS, an
// RTS or another message's first piece goes only between two messages to that peer.
//
// Any source: a receive submitted with peer kAnySource takes the first message with its tag that
// arrives from any peer, and records that peer as its Work's source() before it completes.
// Order rule, per message from peer p with tag t, in this order of precedence: (1) an earlier
// message of (p, t) still buffered goes first (order per (peer, tag) holds for any-source
// receives too); (2) the first posted receive from p with tag t takes it; (3) else the first
// posted, still unmatched any-source receive with tag t takes it. "First to arrive" is as the
// engine's thread sees messages: on each pass, messages it already buffered are offered first,
// in the order their first pieces came (across peers); then the channels' next messages, in
// peer order (lowest rank first). While an unmatched any-source receive is posted, every peer's
// channel is drained into buffers (host-memory slots) as if a receive from that peer were
// posted; on devices whose slots are not host memory, an any-source receive takes only a
// channel's next message.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/device.h"
#include "comm/work.h"
#include "transport/shm_types.h"

namespace rc {

/// submit()'s peer for a receive from any source.
constexpr int kAnySource = -1;

class P2PEngine {
 public:
  /// on_failure(e): a data-phase failure (the core marks itself broken and tells the peers).
  /// eager_bytes: RINGCOMM_P2P_EAGER_BYTES.
  P2PEngine(int rank, int world, CommDevice* dev, int64_t eager_bytes,
            std::function<void(const std::exception_ptr&)> on_failure);
  ~P2PEngine();

  void start();
  /// Queue a send (is_send) or receive of `bytes` at `buf` to/from `peer`; `stream` orders it
  /// after the caller's device work (see CommDevice::p2p_prepare).
  WorkPtr submit(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag, void* stream);
  /// Fail what is pending with Closed and stop the thread.
  void stop();
  /// In a forked child: the thread does not exist there; forget it (stop() then does nothing).
  void forget_after_fork();
  /// Fork handlers (comm/core.cpp): hold mu_ across fork() so the child's copy is unlocked.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 private:
  struct Op {
    bool is_send = false;
    int peer = 0;
    char* buf = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
    uint64_t done = 0;
    bool started = false;
    bool begun = false;     // p2p_begin called
    void* token = nullptr;  // the device's ordering token (p2p_prepare)
    // Rendezvous. Send: rdv (its data waits for a CTS), rts_sent, cleared (the CTS came), rdv_id
    // (its id). Receive: rdv_matched (it took an RTS; its data arrives as the message rdv_id).
    bool rdv = false;
    bool rts_sent = false;
    bool cleared = false;
    bool rdv_matched = false;
    uint64_t rdv_id = 0;
    int64_t deadline_ns = 0;  // timeout after the last progress (or after reaching its queue's front)
    /// A send whose RTS is out and whose CTS has not come.
    bool waits_for_cts() const { return rts_sent && !cleared; }
    WorkPtr work;
  };
  struct Early {  // a message buffered before a receive with its tag was posted
    uint64_t tag = 0;
    uint64_t total = 0;
    std::unique_ptr<char[]> data;  // total bytes, written by the pieces before anyone reads them (not zeroed)
    uint64_t got = 0;
    bool complete = false;
    uint64_t stamp = 0;  // arrival order across peers (the engine's counter when its first piece came)
    bool announced = false;  // an RTS: no data here; the receive that takes it sends the CTS for rdv_id
    uint64_t rdv_id = 0;
  };
  struct Incoming {  // the message of a peer now streaming in: into a receive or a buffer
    Op* op = nullptr;
    Early* early = nullptr;
  };
  // The engine thread's pass (loop), in this order: take what submit() queued; if broken, fail
  // it; else move sends (every peer), then any-source receives whose message is buffered, then
  // every channel that is read (peer order). Buffered messages go before the channels' next
  // messages: that is the header's "first to arrive" order. Any error a pass throws reaches the
  // one catch in loop(), which tells the core (on_failure_) and fails everything pending
  // (fail_all).
  void loop();
  /// Moves new_ into the queues (sleeping on cv_ while there is nothing to do and no channel to
  /// drain); false once stop() was called, after every pending operation failed with Closed.
  bool take_new();
  /// One pass over every peer; true if anything moved. Throws the first error.
  bool progress_all();
  /// After a pass that moved nothing: spin for the spin time, then check the deadlines and the
  /// peers (throws their error; an abort fails what is pending). True: sleep on the doorbell.
  bool settle(int64_t& idle_since);
  /// Throws TimeoutError for the first operation past its deadline (`now`).
  void check_deadlines(int64_t now) const;
  /// Every pending operation fails with e (the first failure is kept in failed_); the queues and
  /// the streams in progress are dropped.
  void fail_all(const std::exception_ptr& e);
  /// Every pending operation fails with Closed (stop()).
  void fail_closed();
  void for_each_op(const std::function<void(Op&)>& fn);

  /// Sends to `peer` and their bookkeeping (pending_, the deadlines of the receives that wait
  /// behind this rank's CTS to it).
  bool progress_sends_to(int peer);
  /// Sends to one peer: CTS answers first, then its queue in order (see Rendezvous above).
  bool progress_sends(int peer);
  /// p2p_begin, once per operation (before its first piece or its match).
  void begin(Op& op);
  bool advance(Op& op);
  /// A receive takes the RTS `id` from `peer`: it is matched, and the CTS is queued.
  void take_announced(Op& op, int peer, uint64_t id);
  /// The CTS `id` from `peer` clears that send's data.
  void on_cts(int peer, uint64_t id);
  /// Whether a send to `peer` waits for its CTS (then the peer's channel is read, and buffered
  /// past what no receive takes, even with no receive from it posted).
  bool awaits_cts(int peer) const;

  /// Whether this pass reads `peer`'s channel: a receive (from it or from any source) is posted,
  /// a message of it streams in, a send to it waits for its CTS, or every channel is drained.
  bool reads_channel(int peer) const;
  /// The receive side of one peer: tag matching (see the header). True if anything moved.
  bool progress_recvs(int peer);
  /// Posted receives from `peer` whose message is buffered (complete): copy it and finish; one
  /// that was announced (an RTS) is matched, its CTS queued, and its data awaited.
  bool take_buffered(int peer);
  /// What the first piece of a message from `peer` started (the piece is not released yet).
  enum class Start {
    kControl,  // a CTS or an RTS, handled whole: release the piece
    kData,     // data: incoming_[peer] names the receive or buffer it streams into
    kWaits,    // no receive takes it and it is not buffered: it stays in the channel
  };
  Start start_message(int peer, const SlotMeta& m, const char* src);
  /// The posted receive that takes a new message of `tag` from `peer` by the order rule (an
  /// any-source receive it picks is bound to `peer`), or null.
  Op* match_new(int peer, uint64_t tag);
  /// A data or RTS piece from `peer` that no receive takes: buffer it (host-memory slots, while
  /// something waits behind it or while draining) and return kData, else kWaits.
  Start buffer_or_wait(int peer, uint64_t tag, uint64_t total);
  /// Copies one piece of the message streaming in from `peer` and releases it.
  void take_piece(int peer, const SlotMeta& m, const char* src);
  /// After progress with `peer`: its receives count their deadline from now (and the sends to it
  /// waiting for a CTS that its message streaming in holds back).
  void refresh_recv_deadlines(int peer, bool mid_message);
  /// An any-source receive not yet matched to a peer's message (any tag when any_tag).
  Op* unmatched_any(uint64_t tag, bool any_tag);
  /// Throws Mismatch when a message of `total` bytes from `peer` does not fit op's buffer.
  void check_size(const Op& op, int peer, uint64_t total) const;
  /// Drops a finished receive from its queue (recvq_[peer] or anyq_).
  void erase_recv(int peer, Op* target);
  /// Any-source receives (not yet matched) whose message is buffered: copy and finish.
  bool match_any_early();
  /// Posts a begun receive's buffered message: copy it and finish the receive.
  void take_early(Op& op, const Early& e);
  void finish(Op& op, const std::exception_ptr& e);

  const int rank_, world_;
  CommDevice* dev_;
  std::function<void(const std::exception_ptr&)> on_failure_;
  // submit() (any thread) appends to new_ and stop() sets stopping_, both under mu_; the engine
  // thread moves new_ into its own queues under mu_. Everything below them is the engine
  // thread's alone.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> new_;
  bool stopping_ = false;
  bool started_ = false;
  bool forked_ = false;  // set in a forked child only (single-threaded there)
  std::thread thread_;
  uint64_t arrivals_ = 0;  // engine thread only: stamps Early messages in arrival order
  bool drain_ = false;     // engine thread only: buffer every unmatched message (see the header)
  // Engine thread only: the first data-phase failure (or abort). From then on the channels are
  // not read: the communicator is broken, and an operation that still reaches the engine fails
  // with this error at once.
  std::exception_ptr failed_;
  // Rendezvous: the size above which sends over host-memory slots use it (read at construction);
  // engine thread only: the next send id, the CTS answers owed per peer, and the send queues (per
  // peer, posting order).
  uint64_t eager_bytes_ = 0;
  uint64_t next_rdv_id_ = 1;
  std::vector<std::deque<uint64_t>> cts_out_;
  std::vector<std::list<Op>> sendq_;
  // Engine thread only: receives per peer (posting order), any-source receives (posting order;
  // one stays here once bound to a peer), the message streaming in per peer, the messages
  // buffered per peer (arrival order), and how many operations are queued in all.
  std::vector<std::list<Op>> recvq_;
  std::list<Op> anyq_;
  std::vector<Incoming> incoming_;
  std::vector<std::list<Early>> early_;
  size_t pending_ = 0;
  int64_t next_liveness_ = 0;  // engine thread only: when settle() next runs the liveness check
};

}  // namespace rc
