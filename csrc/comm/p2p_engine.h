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
// sender's outbox (the shm transport's outbox layout, transport/shm.h): every receiver of that
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
  void loop();
  /// Sends to one peer: CTS answers first, then its queue in order (see Rendezvous above).
  bool progress_sends(int peer, std::list<Op>& q);
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
  bool progress_recvs(int peer, std::list<Op>& q, std::list<Op>& anyq, Incoming& in, std::list<Early>& early,
                      size_t& pending);
  /// Any-source receives (not yet matched) whose message is buffered: copy and finish.
  bool match_any_early(std::list<Op>& anyq, std::vector<std::list<Early>>& early,
                       const std::vector<std::list<Op>>& recvq, size_t& pending);
  /// Posts a begun receive's buffered message: copy it and finish the receive.
  void take_early(Op& op, const Early& e);
  void finish(Op& op, const std::exception_ptr& e);

  const int rank_, world_;
  CommDevice* dev_;
  std::function<void(const std::exception_ptr&)> on_failure_;
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
};

}  // namespace rc
