// The device ring on a CUDA communicator (RINGCOMM_CUDA_P2P=device): all_reduce, reduce_scatter,
// all_gather (the ring), broadcast and reduce (the chain along the ring, as the host's chain
// broadcast and reduce) as ONE launch of the fused ring kernel (device/ring_cuda.h) per call.
//
// Registered once, at connect: every rank's region (signal page and receive slots) is a part of
// its CUDA IPC inbox (transport/cuda_ipc.h: exported, opened and zeroed at setup); the lanes'
// expected values (LaneState) are device memory of this rank; the status record and the abort
// word are host-mapped (cudaHostAlloc). A call touches only these and the caller's two buffers,
// so a call captured in a CUDA graph replays with whatever the buffers then hold, and the
// sequence of every call, eager or replayed, comes from the device's LaneState.
//
// A call, on the caller's thread, waits for nothing on the host:
//   event record (caller's stream) -> stream wait (the ring's own stream) -> one launch (the ring's
//   stream) -> event record (the ring's stream) -> stream wait (the caller's stream).
// While the caller's stream is capturing, nothing is queried or synchronized (the call's Work has
// no fence: a captured call runs only when the graph is launched).
//
// Errors without a wait: a watchdog thread per communicator looks, every RINGCOMM_CUDA_WATCHDOG_US,
// at the status record (written by a kernel's failing lane: timeout, abort, mismatch, corrupt
// word) and at the control plane (a peer dead or aborted, this rank aborting). Either sets the
// abort word (every wait of this rank's kernels then ends) and turns into ONE typed error
// (TimeoutError, PeerFailureError, MismatchError, naming op, rank, peer, step and sequence) that
// breaks the communicator (CommCore::mark_broken: the peers are aborted too and its errored()
// reports it without a wait) and is raised by the next wait or query of a ring call's Work.
// The watchdog calls no CUDA function, so it never disturbs a capture.
//
// Setup (transport/cuda_ipc.h's plan_device_ring, at create): the grid (lanes) fits every rank's
// SM budget, so that every grid on a GPU is resident at once and a spinning grid never waits on
// one that cannot run; init loads every ring kernel (ring_kernels()) so that no module is loaded
// during a call. No stream of this ring is the legacy default stream, and a device wait of a call
// depends only on work enqueued before it (the caller's stream up to the call) and on the peers.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/coll.h"
#include "comm/work.h"
#include "common/dtype.h"
#include "device/ring_proto.h"
#include "transport/cuda_ipc.h"

namespace rc {

struct GpuEvent;

/// How the device ring (csrc/device/ring_proto.h) lays out its region in each rank's CUDA IPC
/// inbox, for the transport that allocates it.
CudaRingLayout device_ring_layout();

class DeviceRing {
 public:
  /// on_error: called once, from the watchdog thread, with the typed error (the core breaks).
  DeviceRing(CudaIpcTransport& t, int rank, int world, int device, std::function<void(std::exception_ptr)> on_error);
  ~DeviceRing();
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  /// After the transport's attach: the stream, the lane states, status and abort, the regions;
  /// starts the watchdog.
  void init();
  /// Whether `coll` runs on the device ring.
  static bool runs(Coll coll) {
    return coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kAllGather ||
           coll == Coll::kBroadcast || coll == Coll::kReduce;
  }
  /// Enqueue one call (see above). count: all_reduce / reduce_scatter the input's elements,
  /// all_gather each rank's, broadcast / reduce the buffer's. broadcast: `out` is the buffer;
  /// reduce: `out` is written on the root only. root: broadcast / reduce only. Returns the fence
  /// of the call (nullptr while `caller` is capturing).
  /// `keep`: the device's record of enqueued work (for close's drain), not touched while capturing.
  /// `seq`: the communicator's sequence of the call (named by the watchdog's errors).
  std::shared_ptr<DeviceFence> launch(Coll coll, DType dt, ReduceOp op, const void* in, void* out, int64_t count,
                                      int root, cudaStream_t caller,
                                      const std::function<void(std::shared_ptr<GpuEvent>)>& keep,
                                      uint64_t seq = 0);
  /// The typed error of a failure seen so far (nullptr: none). Reads the status record itself too,
  /// so that a wait that saw its event complete does not depend on the watchdog's period.
  std::exception_ptr error() { return health_->error(); }
  /// Stop the watchdog (before the transport goes).
  void stop();
  /// After stop(): free the lane states and the stream when no launch can still run (drained).
  void release(bool drained);
  cudaStream_t stream() const { return stream_; }
  /// The registered ranges of this rank (own region, the peers' regions, lane states, status,
  /// abort), for tests: [begin, end) pairs.
  std::vector<std::pair<uintptr_t, uintptr_t>> registered() const;

 private:
  void watch();
  /// The status record, the abort word and the first error: shared with the calls' fences, which
  /// may outlive the communicator (a Work kept by the caller).
  struct Health {
    dev::Status* status = nullptr;  // host-mapped
    uint32_t* abort = nullptr;      // host-mapped
    std::function<void(std::exception_ptr)> on_error;
    std::mutex mu;
    std::string last_op;  // the op of the last launch (the status record does not carry it)
    uint64_t last_seq = 0;  // its communicator sequence
    std::exception_ptr err;
    ~Health();
    std::exception_ptr error();
    /// The status record as a typed error (nullptr while its reason is 0).
    std::exception_ptr status_error();
    void record(std::exception_ptr e);
  };

  CudaIpcTransport& t_;
  const int rank_, world_, device_;
  std::shared_ptr<Health> health_;
  cudaStream_t stream_ = nullptr;
  dev::LaneState* state_ = nullptr;  // device memory, [lanes]
  dev::Status* status_dev_ = nullptr;
  uint32_t* abort_dev_ = nullptr;
  char *self_ = nullptr, *left_ = nullptr, *right_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace rc
