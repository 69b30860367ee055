// The communicator core: one per process and group, shared by the host and the CUDA
// communicator, which differ only in their device part (comm/device.h: the pointer check, the
// channels, what runs after the host part). It numbers every collective, checks its arguments
// (comm/validation.h), checks with a header exchange that all ranks called the same collective
// with consistent arguments, and runs the work in issue order: inline on the caller's thread
// when nothing is queued, else on the progress thread. Point-to-point messages progress on the
// p2p engine's thread (comm/p2p_engine.h).
//
// Threading invariants:
//  - Collectives execute one at a time, in submission order: `busy_` (guarded by mu_) marks the
//    thread currently executing one; only that thread touches the collective lane and the board.
//  - After a failure in the data phase the communicator is "broken" (the slot streams are no
//    longer in step): every later call raises, and the peers are told (the control plane's abort
//    flag) so that their waits raise with our reason instead of timing out. Failures in the
//    header phase (mismatch, a rank rejecting its arguments) are seen identically by every rank
//    before any data moves, so the communicator stays usable after them.
//  - A rank whose arguments fail the local checks still joins the header exchange, as a
//    rejection, so that its peers raise too instead of waiting for it.
//
// Thread-safety contract (what callers may rely on):
//  - Calls from several threads on one communicator are allowed and are serialized in issue
//    order: the order in which they take mu_ in submit() is their sequence number, and they run
//    one at a time in that order. Every rank must issue the same collectives in the same order,
//    so threads that issue different collectives concurrently must order them themselves.
//  - close() may be called from any thread, at any time, more than once. Work queued and not
//    started fails with Closed; a call waiting inside the transport raises Closed (naming the
//    operation, rank, peer, step and sequence) within one liveness slice (the transport's
//    closing flag); a call that starts after close() began raises Closed. The segments are
//    unmapped only after every call has left the core: calls_ counts the threads inside the
//    core's public calls and the progress thread counts through busy_; close() waits for both to
//    drain, bounded by the timeout, and leaves the mappings in place (never unmaps under a
//    thread) if they do not.
//  - fork() after init: a pthread_atfork child handler marks every live core of the child as
//    forked (the handlers hold every core's mutexes across fork(), so the child's copies are
//    consistent). In the child every call raises Closed ("used in a forked child"), closed() is
//    true, and close() / the destructor only drop the child's mappings: they never write the
//    parent's state word, board or channels, never unlink, never join the parent's threads.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algo/trace_record.h"
#include "comm/coll.h"
#include "comm/coll_header.h"
#include "comm/cost_model.h"
#include "comm/device.h"
#include "comm/dispatch.h"
#include "comm/p2p_engine.h"
#include "comm/selection.h"
#include "comm/store_adapt.h"
#include "comm/trace.h"
#include "comm/validation.h"
#include "comm/work.h"
#include "common/dtype.h"
#include "common/knobs.h"

namespace rc {

/// How a call is launched: `async` returns before the host part completes (the host
/// communicator's async_op); `stream` is the device stream the work is ordered on (CUDA).
struct Launch {
  bool async = false;
  void* stream = nullptr;
};

class CommCore : public std::enable_shared_from_this<CommCore> {
 public:
  virtual ~CommCore();
  CommCore(const CommCore&) = delete;
  CommCore& operator=(const CommCore&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  double timeout() const { return dev_->control().timeout_s(); }
  /// Seconds any single wait may take, for waits that start from now on (> 0; inf: no limit).
  void set_timeout(double seconds) { dev_->control().set_timeout(seconds); }
  bool closed() const { return closed_.load() || forked_pid_.load() != 0; }
  /// Why calls raise Closed when that is not close(): the fork message, or empty.
  std::string closed_reason() const;
  uint64_t next_seq() const;

  // Collectives. Pointers must stay valid until the returned Work completes. Without l.async the
  // call returns after the host part completed (and throws on failure).
  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, Launch l);
  WorkPtr reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, Launch l);
  WorkPtr all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt, Launch l);
  WorkPtr broadcast(void* buf, int64_t count, DType dt, int root, Launch l);
  WorkPtr reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, Launch l);
  WorkPtr barrier(Launch l);
  WorkPtr all_to_all(const void* in, void* out, std::vector<int64_t> send_counts, std::vector<int64_t> recv_counts,
                     DType dt, Launch l);
  WorkPtr gather(const void* in, void* out, int64_t count, DType dt, int root, Launch l);
  WorkPtr scatter(const void* in, void* out, int64_t count, DType dt, int root, Launch l);
  /// Refuse this rank's arguments for the collective its peers are entering: joins the header
  /// exchange with a rejection so every rank raises instead of waiting. Returns after the exchange.
  void reject();

  // Point-to-point (matched in order per pair of ranks; sizes must agree).
  WorkPtr send(const void* buf, int64_t bytes, int dst, uint64_t tag, Launch l);
  WorkPtr recv(void* buf, int64_t bytes, int src, uint64_t tag, Launch l);

  /// From any thread: fail queued work and in-flight waits with Closed, stop the threads, wait
  /// (bounded by the timeout) for every call to leave the core, release the device. Idempotent.
  void close();
  /// Record a data-phase failure (the first one wins) and tell the peers.
  void mark_broken(const std::exception_ptr& e);
  /// The per-phase records of the last RINGCOMM_TRACE collectives, oldest first (comm/trace.h).
  std::vector<TraceRecord> trace() const { return tracer_.snapshot(); }
  /// From any thread (torchft-style recovery): every pending and future call on this
  /// communicator raises rc::Error carrying `reason`, promptly: queued work fails, waits in the
  /// transport raise within a liveness slice, and the peers are told (their waits raise
  /// PeerFailure naming this rank). No-op once closed. Create a new communicator to go on.
  void abort(const std::string& reason);
  /// The first error that made this communicator unusable (a data-phase failure or abort()),
  /// or null.
  std::exception_ptr errored() const;
  /// The cost model's profile this rank loaded (RINGCOMM_PROFILE, read at creation): every rank
  /// of a communicator must hold the same (ringcomm/core/host.py compares the hashes at init).
  const CostProfile& cost_profile() const { return knobs_.profile; }
  /// RINGCOMM_STREAM=adapt's policy once connected, or null where it does not run.
  const StoreAdapt* store_adapt() const { return adapt_.get(); }

 protected:
  CommCore(int rank, int world, std::unique_ptr<CommDevice> dev, const Knobs& knobs);
  /// After the transport is connected: start the threads.
  void start();
  bool connected() const { return connected_; }
  CommDevice& device_part() { return *dev_; }
  const SelectionKnobs& selection_knobs() const { return knobs_; }

 private:
  /// One collective as submitted: what execute() runs (inline on the caller's thread, or queued).
  struct Task {
    WorkPtr work;
    uint64_t seq = 0;
    Coll coll = Coll::kRejected;
    CollHeader hdr;           // this rank's header, with the selection (comm/selection.h)
    const Route* route = nullptr;  // the dispatch table's entry for hdr's selection
    CollArgs args;
    Launch l;
    int64_t entry_ns = 0;
  };
  /// Local checks (`check` returns this rank's header or throws; a throw rejects the call on
  /// every rank), then submit.
  template <class Check>
  WorkPtr collective(Coll coll, const Check& check, CollArgs args, Launch l);
  /// Select the algorithm, protocol and store for `hdr` (into it), look its route up, and run or
  /// queue the call.
  WorkPtr submit(Coll coll, CollHeader hdr, CollArgs args, Launch l, int64_t entry_ns = 0);
  /// On a header mismatch: take and release the one slot each header_in_slot peer handed us first.
  void drain_in_slot(const std::vector<CollHeader>& all, uint64_t seq, Coll coll);
  void run_task(Task& t);
  /// The header exchange and the data phase of t; completes t.work (with the device's fence).
  void execute(Task& t);
  void progress_loop();
  void check_usable() const;
  void reject_now();
  friend struct ForkRegistry;
  // The test module (bindings/test/comm_py.cpp): numbers collectives from a given value, under mu_.
  friend struct CommCoreTestAccess;
  void mark_forked(int pid);
  /// One public call inside the core (RAII): refuses (Closed) once close() began; close() waits
  /// until none is left before it releases the device.
  class Call {
   public:
    explicit Call(CommCore* c);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
   private:
    CommCore* c_;
  };

  const int rank_;
  const int world_;
  std::unique_ptr<CommDevice> dev_;
  ArgChecks checks_;
  Tracer tracer_;  // configured once from RINGCOMM_TRACE; written only by the executing thread
  const SelectionKnobs knobs_;  // the selection's knobs, read once at creation
  DeviceCaps caps_;  // what the device can run: asked at creation and again once connected (start())
  P2PEngine p2p_;
  bool connected_ = false;
  std::atomic<bool> closed_{false};
  std::atomic<int> forked_pid_{0};  // the child's pid in a forked child, else 0

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  int calls_ = 0;             // threads inside a public call (see Call)
  bool draining_ = false;     // close() waits for calls_ == 0 and !busy_ (cv_ notified then)
  uint64_t seq_ = 0;          // last collective sequence number handed out
  // On a device that may fuse calls (CommDevice::may_fuse): the header exchanges run so far, the
  // board's sequence (transport/shm_board.h), i.e. seq_ less the calls that ran fused; elsewhere
  // the board takes seq_ itself. Only the thread executing a task touches it (one at a time: busy_).
  uint64_t exchanges_ = 0;
  // The headers of the call being executed (exchange_headers fills it; the body reads it): only
  // the thread executing a task touches it, and its capacity is kept between calls.
  std::vector<CollHeader> headers_;
  // RINGCOMM_STREAM=adapt on a device with streaming stores (else null): the store of each call
  // through slots. Only the thread executing a task touches its agreed state (comm/store_adapt.h).
  std::unique_ptr<StoreAdapt> adapt_;
  std::string broken_;        // non-empty after a data-phase failure or abort()
  // Set (release, under mu_) right after broken_ first becomes non-empty and never cleared: the
  // per-call checks read it without mu_ and take the lock only to build the error.
  std::atomic<bool> broken_flag_{false};
  std::exception_ptr first_error_;  // the failure broken_ describes
  std::thread progress_;
};

}  // namespace rc
