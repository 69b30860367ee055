// The Communicator: one per process and group. It owns the transport, numbers every collective,
// checks with a header exchange that all ranks called the same collective with consistent
// arguments, and runs the work in issue order on a progress thread (or inline on the caller's
// thread when nothing is queued). Point-to-point messages progress on their own thread so that
// matching sends and receives posted in any order never deadlock behind each other.
//
// Threading invariants:
//  - Collectives execute one at a time, in submission order: `busy_` (guarded by mu_) marks the
//    thread currently executing one; only that thread touches the collective lane and the board.
//  - Point-to-point operations touch only the p2p lane, from the p2p thread only.
//  - After a failure in the data phase the communicator is "broken" (the slot streams are no
//    longer in step): every later call raises. Failures in the header phase (mismatch, a rank
//    rejecting its arguments) are seen identically by every rank before any data moves, so the
//    communicator stays usable after them.
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

#include "algo/context.h"
#include "comm/coll.h"
#include "comm/store_policy.h"
#include "comm/validation.h"
#include "comm/work.h"
#include "common/dtype.h"
#include "transport/shm.h"
#include "transport/shm_channel.h"

namespace rc {



using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  /// timeout_s <= 0 takes RINGCOMM_TIMEOUT (default 300 s).
  Communicator(int rank, int world, double timeout_s);
  ~Communicator();

  /// Rendezvous, step 1: create this rank's shared memory; publish the returned name.
  std::string create();
  /// Rendezvous, step 2: names of every rank's segment in rank order. Starts the threads.
  void connect(const std::vector<std::string>& names);

  int rank() const { return rank_; }
  int world() const { return world_; }
  double timeout() const { return transport_.config().timeout_s; }
  uint64_t next_seq() const;

  // Collectives. Pointers must stay valid until the returned Work completes. With async=false
  // the call returns after completion (and throws on failure).
  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, bool async);
  WorkPtr reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, bool async);
  WorkPtr all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt, bool async);
  WorkPtr broadcast(void* buf, int64_t count, DType dt, int root, bool async);
  WorkPtr reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, bool async);
  WorkPtr barrier(bool async);
  WorkPtr all_to_all(const void* in, void* out, std::vector<int64_t> send_counts,
                     std::vector<int64_t> recv_counts, DType dt, bool async);
  WorkPtr gather(const void* in, void* out, int64_t count, DType dt, int root, bool async);
  WorkPtr scatter(const void* in, void* out, int64_t count, DType dt, int root, bool async);
  /// Refuse this rank's arguments for collective `coll`: joins the header exchange with a
  /// rejection so every rank raises instead of waiting. Returns after the exchange.
  void reject(Coll coll);

  // Point-to-point (matched in order per pair of ranks; sizes must agree).
  WorkPtr send(const void* buf, int64_t bytes, int dst, uint64_t tag, bool async);
  WorkPtr recv(void* buf, int64_t bytes, int src, uint64_t tag, bool async);

  /// Finish queued work (bounded by the timeout), stop the threads, unmap. Idempotent.
  void close();
  bool closed() const { return closed_.load(); }

  // Ring schedule (pure) exposed for tests and for other transports.
 private:
  struct Task {
    std::function<void()> fn;
    WorkPtr work;
  };
  struct P2POp {
    bool is_send;
    int peer;
    char* buf;
    uint64_t bytes;
    uint64_t tag;
    uint64_t done = 0;
    bool started = false;
    int64_t deadline_ns = 0;
    WorkPtr work;
  };

  WorkPtr submit(Coll coll, CollHeader hdr, std::function<void(uint64_t)> body, bool async);
  void run_task(Task& t);
  void progress_loop();
  void exchange_headers(uint64_t seq, Coll coll, const CollHeader& mine);
  void check_usable() const;

  WorkPtr submit_p2p(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag, bool async);
  void p2p_loop();
  bool p2p_advance(P2POp& op);
  void p2p_fail_all(std::exception_ptr e);

  const int rank_;
  const int world_;
  ShmTransport transport_;
  // All-reduce algorithm choice: RINGCOMM_ALGO = ring | direct | auto (default). auto takes the
  // direct exchange (one hand-off) while its extra copies are cheap - message bytes times
  // (world-1) at most RINGCOMM_DIRECT_MAX_BYTES - and the bandwidth-optimal ring above that.
  enum class Algo { kRing, kDirect, kAuto } algo_ = Algo::kAuto;
  int64_t direct_max_bytes_ = 0;
  ArgChecks checks_;
  std::vector<char> scratch_;  // one slot of private memory (direct all-reduce, streamed fused reductions)
  ShmChannel channel_;         // the collective lane; used by the executing thread only
  // How this rank writes into peers' slots (cached or streaming stores), measured per size class;
  // both used by the executing thread only (collectives run one at a time).
  StorePolicy store_policy_;
  AlgoCtx algo_ctx(uint64_t seq, const char* op, DType dt);
  bool stream_now_ = false;
  bool connected_ = false;
  std::atomic<bool> closed_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  uint64_t seq_ = 0;          // last collective sequence number handed out
  std::string broken_;        // non-empty after a data-phase failure
  std::thread progress_;

  std::mutex p2p_mu_;
  std::condition_variable p2p_cv_;
  std::deque<P2POp> p2p_new_;
  bool p2p_stopping_ = false;
  std::thread p2p_thread_;
};

}  // namespace rc
