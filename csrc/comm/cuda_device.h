// The CUDA communicator's device part (comm/device.h) over the CUDA IPC transport.
//
// A collective's data phase runs on the thread that executes it (the caller's, unless other
// work is queued): it walks the schedule enqueueing copies and reduce kernels on the caller's
// stream (CudaChannel) and returns once everything is enqueued. At each slot hand-off the host
// waits, bounded, for its own GPU's work on that slot (transport/cuda_ipc.h) and for the peers'
// side (slot flow control). Enqueueing before the call returns is what keeps stream order: work
// the caller enqueues after the call runs after the collective. The Work's fence is an event
// recorded after the collective: wait() polls it, bounded by the timeout and checking the peers'
// liveness; stream_wait() makes another stream wait for it.
// send/recv run on an internal stream that first waits for the caller's stream (an event
// recorded at the call); their fence is recorded after the copies.
// RINGCOMM_CUDA_P2P=device: all_reduce, reduce_scatter, all_gather (equal contributions),
// broadcast and reduce run on the device ring instead (comm/cuda_ring.h): one launch per call, no
// host wait and no header exchange (the ring kernel checks each piece's slot header).
// A collective or send/recv that runs on the host-ordered path refuses a capturing stream: its
// host waits and event queries cannot be captured.
// Every fence's event is also kept in pending_ until seen complete, so that close() can let the
// GPU finish (bounded, whether or not the communicator broke) before the transport's memory,
// events and registrations go; what it could not drain the transport retires instead.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/cuda_ring.h"
#include "comm/device.h"
#include "comm/validation.h"
#include "comm/work.h"
#include "common/knobs.h"
#include "transport/cuda_channel.h"
#include "transport/cuda_ipc.h"
#include "transport/shm_control.h"

namespace rc {

class CommCore;

/// A CUDA event shared by a fence and the device's list of pending work.
struct GpuEvent {
  cudaEvent_t ev = nullptr;
  GpuEvent();
  ~GpuEvent();
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;
};

/// Buffers must be device memory of the communicator's GPU (or managed memory).
class DeviceMemoryCheck final : public MemoryCheck {
 public:
  explicit DeviceMemoryCheck(int device) : device_(device) {}
  void check(const void* p, const char* what, const char* op) const override;

 private:
  int device_;
};

class CudaDevice final : public CommDevice {
 public:
  CudaDevice(int rank, int world, int device, double timeout_s, const Knobs& knobs);
  ~CudaDevice() override;
  /// The core whose device part this is (fences hold it weakly: they must never own it).
  void set_core(CommCore* core) { core_ = core; }
  CudaIpcTransport& transport() { return transport_; }
  int device() const { return device_; }
  /// Setup step 3 (transport/cuda_ipc.h): attach, then create the point-to-point stream.
  void connect(const std::vector<std::string>& blobs);
  /// Wait (bounded, checking peers) for an event of this device's work.
  void wait_gpu(cudaEvent_t ev, const std::string& op, uint64_t seq, double timeout_s);

  const char* name() const override { return "CUDA communicator"; }
  ShmControl& control() override { return transport_.ctl(); }
  bool has_control() const override { return transport_.created(); }
  const MemoryCheck* memory() const override { return &memcheck_; }
  void abort(uint32_t kind, const std::string& msg) override { transport_.abort(kind, msg); }
  std::shared_ptr<DeviceFence> execute(Coll coll, const CollHeader& h, void* stream, AlgoCtx& c,
                                       FunctionRef<void(const AlgoCtx&)> body) override;
  void check_submit(Coll coll, const CollHeader& h, const CollArgs& a, void* stream) override;
  bool fused(Coll coll, const CollHeader& h, const CollArgs& a) const override;
  bool may_fuse() const override { return ring_ != nullptr; }
  std::shared_ptr<DeviceFence> run_fused(Coll coll, const CollHeader& h, const CollArgs& a, void* stream,
                                         uint64_t seq) override;
  /// The device ring (RINGCOMM_CUDA_P2P=device, after connect), else nullptr.
  DeviceRing* ring() { return ring_.get(); }
  Channel& p2p_channel() override { return *p2p_ch_; }
  bool p2p_slots_in_host_memory() const override { return false; }
  void p2p_thread_start() override;
  void* p2p_prepare(void* stream) override;
  void p2p_begin(void* token) override;
  std::shared_ptr<DeviceFence> p2p_end(void* token, bool ok) override;
  void close(bool broken) override;
  /// The internal stream send/recv run on (0 before connect; it lives until exit, see close()):
  /// the Python layer marks tensors used there (record_stream) and keeps the others alive.
  uintptr_t p2p_stream_handle() const { return reinterpret_cast<uintptr_t>(p2p_stream_); }
  /// True when every copy enqueued on the internal stream so far has finished (cudaStreamQuery):
  /// the arrays of completed or failed point-to-point operations may then be let go.
  bool p2p_idle();

 private:
  /// A fence for `ev`, recorded after this device's work, and tracked in pending_.
  std::shared_ptr<DeviceFence> fence(std::shared_ptr<GpuEvent> ev);

  const int rank_, world_, device_;
  CudaIpcTransport transport_;
  DeviceMemoryCheck memcheck_;
  CommCore* core_ = nullptr;
  cudaStream_t p2p_stream_ = nullptr;
  std::unique_ptr<CudaChannel> p2p_ch_;
  std::unique_ptr<DeviceRing> ring_;
  std::shared_ptr<GpuEvent> ring_last_;  // the last eager ring call's completion (under pending_mu_)
  std::mutex pending_mu_;
  std::deque<std::shared_ptr<GpuEvent>> pending_;  // events of enqueued work not yet seen complete
};

}  // namespace rc
