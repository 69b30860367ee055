// The CUDA communicator: collectives on device buffers, enqueued on the caller's CUDA stream.
//
// Same contract as the host Communicator (comm/communicator.h) — every collective is numbered,
// a header exchange checks that all ranks called the same collective with consistent arguments
// (and lets a rank that rejects its arguments make every rank raise), a data-phase failure
// breaks the communicator and aborts the peers — with these differences:
//  - A collective runs on the CALLING thread: it exchanges headers, then walks the ring schedule
//    enqueueing copies, reduce kernels and IPC-event waits/records on the caller's stream, and
//    returns once everything is enqueued. The host never waits for the GPU (except on
//    kHostSync channels, see transport/cuda_ipc.h); it does wait, bounded, for the peers to
//    enqueue their side (slot flow control), i.e. a collective returns when every rank has
//    entered it. Enqueueing on the caller's thread is what keeps stream order: work the caller
//    enqueues after the call runs after the collective.
//  - The returned CudaWork holds an event recorded after the collective. wait() blocks the host
//    until it completes — polling, bounded by the timeout, checking the peers' liveness — and
//    stream_wait() makes another stream wait for it without blocking the host.
//  - send/recv progress on a helper thread over the p2p lane, on an internal stream that first
//    waits for the caller's stream (an event recorded at the call); their Work completes when the
//    copies have finished. Matching sends and receives posted in any order never deadlock.
//  - Collectives are serialised by a mutex: calls from several threads are safe but run one at a
//    time, in lock order (every rank must issue them in the same order, as always).
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algo/ring_cuda.h"
#include "comm/communicator.h"
#include "common/dtype.h"
#include "transport/cuda_ipc.h"

namespace rc {

class CudaCommunicator;

/// A CUDA event shared by a Work and the communicator's list of pending work (close() drains it).
struct GpuEvent {
  cudaEvent_t ev = nullptr;
  GpuEvent();
  ~GpuEvent();
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;
};

class CudaWork {
 public:
  /// Holds the communicator weakly (the p2p thread must never own it); once it is gone, waits
  /// poll the event without peer checks, bounded by the communicator's timeout.
  CudaWork(const std::shared_ptr<CudaCommunicator>& comm, std::string op, uint64_t seq);
  ~CudaWork();
  CudaWork(const CudaWork&) = delete;
  CudaWork& operator=(const CudaWork&) = delete;

  /// Block the host until the GPU work completes. timeout_s < 0: bounded by the communicator's
  /// timeout (a TimeoutError then breaks the communicator); >= 0: TimeoutError after timeout_s,
  /// the work keeps running. Raises the operation's error, or PeerFailure when a peer dies.
  void wait(double timeout_s);
  bool is_completed();
  /// Make `stream` wait for the work (no host blocking once the work is enqueued).
  void stream_wait(cudaStream_t stream);
  int error_code();  // -1: none
  std::string error_message();
  const std::string& op() const { return op_; }
  uint64_t seq() const { return seq_; }

  // ---- for the communicator ----
  cudaEvent_t event() const { return ev_->ev; }
  const std::shared_ptr<GpuEvent>& shared_event() const { return ev_; }
  /// The work's GPU part is enqueued (ev_ recorded after it).
  void mark_enqueued();
  void fail(std::exception_ptr e);

 private:
  bool wait_enqueued(double timeout_s);
  std::weak_ptr<CudaCommunicator> comm_;
  int rank_ = 0;
  int device_ = 0;
  double timeout_s_ = 0;
  std::string op_;
  uint64_t seq_;
  std::shared_ptr<GpuEvent> ev_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool enqueued_ = false;
  std::exception_ptr error_;
};
using CudaWorkPtr = std::shared_ptr<CudaWork>;

class CudaCommunicator : public std::enable_shared_from_this<CudaCommunicator> {
 public:
  /// device: the CUDA device ordinal every buffer of this communicator lives on.
  CudaCommunicator(int rank, int world, int device, double timeout_s);
  ~CudaCommunicator();

  /// Setup (the caller moves the bytes between ranks; see transport/cuda_ipc.h).
  std::string local_info();
  std::string create(const std::vector<std::string>& infos);
  void connect(const std::vector<std::string>& blobs);

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  double timeout() const { return transport_.config().shm.timeout_s; }
  bool closed() const { return closed_.load(); }
  std::string channels() const { return transport_.describe_channels(); }
  uint64_t next_seq() const;

  // Collectives: device pointers on device(); `stream` is the caller's stream (0: legacy default).
  CudaWorkPtr all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, cudaStream_t stream);
  CudaWorkPtr reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, cudaStream_t stream);
  CudaWorkPtr all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt, cudaStream_t stream);
  CudaWorkPtr broadcast(void* buf, int64_t count, DType dt, int root, cudaStream_t stream);
  CudaWorkPtr reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, cudaStream_t stream);
  CudaWorkPtr barrier(cudaStream_t stream);
  CudaWorkPtr all_to_all(const void* in, void* out, std::vector<int64_t> send_counts, std::vector<int64_t> recv_counts,
                         DType dt, cudaStream_t stream);
  CudaWorkPtr gather(const void* in, void* out, int64_t count, DType dt, int root, cudaStream_t stream);
  CudaWorkPtr scatter(const void* in, void* out, int64_t count, DType dt, int root, cudaStream_t stream);
  void reject(Coll coll);

  CudaWorkPtr send(const void* buf, int64_t bytes, int dst, uint64_t tag, cudaStream_t stream);
  CudaWorkPtr recv(void* buf, int64_t bytes, int src, uint64_t tag, cudaStream_t stream);

  /// Finish (bounded) outstanding work, stop the p2p thread, release what is safe to release.
  void close();

  // ---- for CudaWork ----
  void wait_gpu(cudaEvent_t ev, const std::string& op, uint64_t seq, double timeout_s);
  void mark_broken(const std::exception_ptr& e);

 private:
  struct P2POp {
    bool is_send = false;
    int peer = 0;
    char* buf = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
    uint64_t done = 0;
    bool started = false;
    bool gated = false;       // the internal stream waits for the caller's stream
    cudaEvent_t ready = nullptr;
    int64_t deadline_ns = 0;
    CudaWorkPtr work;
  };

  CudaWorkPtr run(Coll coll, CollHeader hdr, cudaStream_t stream,
                  const std::function<void(const SlotAlgoCtx&, const std::vector<CollHeader>&)>& body);
  std::vector<CollHeader> exchange_headers(uint64_t seq, Coll coll, const CollHeader& mine);
  void check_usable() const;
  void check_dev(const void* p, int64_t count, DType dt, const char* what, const char* coll);
  void check_root(int root, Coll coll);
  void track(const CudaWorkPtr& w);
  CudaWorkPtr submit_p2p(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag, cudaStream_t stream);
  void p2p_loop();
  bool p2p_advance(P2POp& op);

  const int rank_;
  const int world_;
  const int device_;
  CudaIpcTransport transport_;
  bool connected_ = false;
  std::atomic<bool> closed_{false};

  mutable std::mutex coll_mu_;  // one collective at a time; guards seq_
  uint64_t seq_ = 0;
  mutable std::mutex state_mu_;
  std::string broken_;                       // non-empty after a data-phase failure
  std::deque<std::shared_ptr<GpuEvent>> pending_;  // events of enqueued work not yet seen complete

  cudaStream_t p2p_stream_ = nullptr;
  std::mutex p2p_mu_;
  std::condition_variable p2p_cv_;
  std::deque<P2POp> p2p_new_;
  bool p2p_stopping_ = false;
  std::thread p2p_thread_;
};

}  // namespace rc
