#include "comm/cuda_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "comm/cuda_device.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "device/ring_cuda.h"
#include "transport/shm_types.h"

namespace rc {

CudaRingLayout device_ring_layout() {
  CudaRingLayout l;
  l.max_lanes = dev::kMaxLanes;
  l.slot_stride = [](size_t slot_bytes) { return static_cast<size_t>(dev::ring_slot_stride(slot_bytes)); };
  l.region_bytes = [](size_t slot_bytes, size_t nslots, size_t lanes) {
    return static_cast<size_t>(dev::ring_region_bytes(slot_bytes, nslots, lanes));
  };
  l.blocks_per_sm = [](int device) {
    // The least of every instantiation: whichever kernel a call launches fits the budget.
    CudaDeviceGuard g(device);
    int least = -1;
    for (const void* k : ring_kernels()) {
      int n = 0;
      RC_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kRingThreads, 0),
              " (the ring kernel's resident blocks per SM on device " << device << ")");
      least = least < 0 ? n : std::min(least, n);
    }
    return least < 0 ? 0 : least;
  };
  return l;
}

namespace {

// The fence of one ring call: its event on the ring's stream. A failure the watchdog or the
// status record reports makes it complete (query) and raise (wait) without waiting for the event.
template <class H>
class RingFence final : public DeviceFence {
 public:
  RingFence(std::shared_ptr<H> ring, std::shared_ptr<GpuEvent> ev, int device, double timeout_s)
      : ring_(ring), ev_(std::move(ev)), device_(device), timeout_s_(timeout_s) {}

  bool query() override {
    if (ring_->error()) return true;
    CudaDeviceGuard g(device_);
    const cudaError_t e = cudaEventQuery(ev_->ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) (void)cudaGetLastError();
    return true;
  }

  void wait(const std::string& op, uint64_t seq, double timeout_s) override {
    CudaDeviceGuard g(device_);
    const double limit = timeout_s >= 0 ? timeout_s : timeout_s_;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (std::exception_ptr e = ring_->error()) std::rethrow_exception(e);
      const cudaError_t e = cudaEventQuery(ev_->ev);
      if (e == cudaSuccess) break;
      RC_CHECK(e == cudaErrorNotReady, Error, "ringcomm: " << op << " failed on the GPU: " << cudaGetErrorName(e));
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit)
        RC_THROW(TimeoutError, "ringcomm: wait() on " << op << " (seq " << seq << "): Timed out after " << limit << " s");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // The kernel has exited: a failure it recorded is in the status record now.
    if (std::exception_ptr e = ring_->error()) std::rethrow_exception(e);
  }

  void stream_wait(void* stream) override {
    CudaDeviceGuard g(device_);
    RC_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev_->ev, 0), " (stream_wait)");
  }

 private:
  std::shared_ptr<H> ring_;
  std::shared_ptr<GpuEvent> ev_;
  int device_;
  double timeout_s_;
};

const char* reason_name(uint32_t r) {
  switch (static_cast<dev::Reason>(r)) {
    case dev::Reason::kTimeout: return "timed out";
    case dev::Reason::kAbort: return "aborted";
    case dev::Reason::kMismatch: return "mismatched slot header";
    case dev::Reason::kCorrupt: return "impossible flag value";
    default: return "unknown failure";
  }
}

// The slot header's field a mismatch names (dev::Field).
const char* field_name(uint32_t f) {
  static const char* const names[] = {"", "sequence", "piece index", "collective", "dtype", "op", "root", "count",
                                      "bytes"};
  return f < sizeof(names) / sizeof(names[0]) ? names[f] : "";
}

}  // namespace

DeviceRing::DeviceRing(CudaIpcTransport& t, int rank, int world, int device,
                       std::function<void(std::exception_ptr)> on_error)
    : t_(t), rank_(rank), world_(world), device_(device), health_(std::make_shared<Health>()) {
  health_->on_error = std::move(on_error);
}

DeviceRing::~DeviceRing() { stop(); }

DeviceRing::Health::~Health() {
  // Host-mapped: a kernel that outlived an undrained close may still write them; release()
  // drops the last reference only after a drain, and fences hold theirs until they go.
  if (status != nullptr) (void)cudaFreeHost(status);
  if (abort != nullptr) (void)cudaFreeHost(abort);
}

void DeviceRing::release(bool drained) {
  if (!drained) {
    // Kernels may still run: their memory stays until exit.
    new std::shared_ptr<Health>(health_);  // NOLINT: deliberately leaked
    return;
  }
  if (state_ != nullptr) (void)cudaFree(state_);
  state_ = nullptr;
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

void DeviceRing::init() {
  CudaDeviceGuard g(device_);
  const CudaIpcConfig& c = t_.config();
  // Load every ring kernel now (lazy loading would load one at its first launch, in the middle of
  // a call, while a peer's kernel may be spinning on this rank's).
  for (const void* k : ring_kernels()) {
    cudaFuncAttributes fa;
    RC_CUDA(cudaFuncGetAttributes(&fa, k), " (loading the device ring's kernels on device " << device_ << ")");
  }
  RC_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), " (the device ring's stream)");
  void* p = nullptr;
  RC_CUDA(cudaMalloc(&p, sizeof(dev::LaneState) * c.ring_lanes), " (the device ring's lane states)");
  state_ = static_cast<dev::LaneState*>(p);
  RC_CUDA(cudaMemsetAsync(state_, 0, sizeof(dev::LaneState) * c.ring_lanes, stream_), "");
  RC_CUDA(cudaStreamSynchronize(stream_), " (zeroing the device ring's lane states)");
  Health& h = *health_;
  RC_CUDA(cudaHostAlloc(&p, sizeof(dev::Status), cudaHostAllocMapped | cudaHostAllocPortable), " (status record)");
  h.status = static_cast<dev::Status*>(p);
  std::memset(h.status, 0, sizeof(*h.status));
  RC_CUDA(cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable), " (abort word)");
  h.abort = static_cast<uint32_t*>(p);
  std::memset(h.abort, 0, 64);
  RC_CUDA(cudaHostGetDevicePointer(&p, h.status, 0), "");
  status_dev_ = static_cast<dev::Status*>(p);
  RC_CUDA(cudaHostGetDevicePointer(&p, h.abort, 0), "");
  abort_dev_ = static_cast<uint32_t*>(p);
  self_ = t_.ring_region(rank_);
  left_ = t_.ring_region((rank_ + world_ - 1) % world_);
  right_ = t_.ring_region((rank_ + 1) % world_);
  RC_LOG(kInfo, rank_, world_, c.ring.why << "; " << ring_kernels().size() << " ring kernels loaded");
  watchdog_ = std::thread([this] { watch(); });
}

std::shared_ptr<DeviceFence> DeviceRing::launch(Coll coll, DType dt, ReduceOp op, const void* in, void* out,
                                                int64_t count, int root, cudaStream_t caller,
                                                const std::function<void(std::shared_ptr<GpuEvent>)>& keep,
                                                uint64_t seq) {
  if (std::exception_ptr e = error()) std::rethrow_exception(e);
  CudaDeviceGuard g(device_);
  const CudaIpcConfig& c = t_.config();
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  RC_CUDA(cudaStreamIsCapturing(caller, &cs), " (" << coll_name(coll) << ")");
  const bool capturing = cs != cudaStreamCaptureStatusNone;
  dev::RingArgs a;
  std::memset(&a, 0, sizeof(a));
  switch (coll) {
    case Coll::kAllReduce: a.coll = dev::Coll::kAllReduce; break;
    case Coll::kReduceScatter: a.coll = dev::Coll::kReduceScatter; break;
    case Coll::kAllGather: a.coll = dev::Coll::kAllGather; break;
    case Coll::kBroadcast: a.coll = dev::Coll::kBroadcast; break;
    case Coll::kReduce: a.coll = dev::Coll::kReduce; break;
    default: RC_THROW(Error, "ringcomm: " << coll_name(coll) << " does not run on the device ring");
  }
  // Carried in every slot header, so that a receiver catches a mismatched call (op: any code
  // for the collectives that combine nothing, whose headers carry kNoOp).
  a.dtype = static_cast<uint32_t>(dt);
  a.op = static_cast<uint32_t>(op);
  a.root = coll == Coll::kBroadcast || coll == Coll::kReduce ? root : 0;
  a.rank = rank_;
  a.world = world_;
  a.nlanes = c.ring.lanes;
  a.nslots = static_cast<int>(c.ring.nslots);
  a.count = count;
  a.slot_bytes = c.ring.slot_bytes;
  a.slot_stride = c.ring_slot_stride;
  a.scale = 1.0 / world_;  // AVG's factor; the other ops ignore it (kernels/reduce_ops.h)
  a.in = in;
  a.out = out;
  a.self = reinterpret_cast<dev::SignalPage*>(self_);
  a.right = reinterpret_cast<dev::SignalPage*>(right_);
  a.left = reinterpret_cast<dev::SignalPage*>(left_);
  a.recv_slots = self_ + dev::ring_slots_offset();
  a.send_slots = right_ + dev::ring_slots_offset();
  a.state = state_;
  a.status = status_dev_;
  a.abort = abort_dev_;
  a.timeout_ns = static_cast<uint64_t>(c.shm.timeout_s * 1e9);
  {
    std::lock_guard<std::mutex> lk(health_->mu);
    health_->last_op = coll_name(coll);
    health_->last_seq = seq;
  }
  // caller -> ring stream -> caller, by events of this process only; no host wait.
  auto joined = std::make_shared<GpuEvent>();
  auto done = std::make_shared<GpuEvent>();
  RC_CUDA(cudaEventRecord(joined->ev, caller), " (" << coll_name(coll) << ": joining the caller's stream)");
  RC_CUDA(cudaStreamWaitEvent(stream_, joined->ev, 0), "");
  ring_cuda(a, dt, op, stream_);
  RC_CUDA(cudaEventRecord(done->ev, stream_), " (" << coll_name(coll) << ": completion)");
  RC_CUDA(cudaStreamWaitEvent(caller, done->ev, 0), " (" << coll_name(coll) << ": back to the caller's stream)");
  if (capturing) return nullptr;
  keep(done);
  return std::make_shared<RingFence<Health>>(health_, std::move(done), device_, c.shm.timeout_s);
}

std::exception_ptr DeviceRing::Health::status_error() {
  if (status == nullptr) return nullptr;
  const uint32_t why = dev::SysU32(status->reason).load(cuda::std::memory_order_acquire);
  if (why == 0) return nullptr;
  std::string op;
  {
    std::lock_guard<std::mutex> lk(mu);
    op = last_op;
  }
  const dev::Status& s = *status;
  std::ostringstream m;
  m << "ringcomm: " << op << " (device sequence " << s.seq << ") on rank " << s.rank << ": the device ring "
    << reason_name(why);
  if (*field_name(s.field) != '\0') m << " (" << field_name(s.field) << ")";
  m << " at step " << s.step << " (lane " << s.lane << ") with peer " << s.peer << " (expected "
    << s.expected << ", saw " << s.seen << ")";
  switch (static_cast<dev::Reason>(why)) {
    case dev::Reason::kTimeout: return std::make_exception_ptr(TimeoutError(m.str()));
    case dev::Reason::kAbort: return std::make_exception_ptr(PeerFailure(m.str() + ": this rank or a peer aborted"));
    case dev::Reason::kMismatch: return std::make_exception_ptr(Mismatch(m.str()));
    default: return std::make_exception_ptr(Error(m.str()));
  }
}

void DeviceRing::Health::record(std::exception_ptr e) {
  bool first = false;
  std::function<void(std::exception_ptr)> notify;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!err) {
      err = e;
      first = true;
      notify = on_error;
    }
  }
  // Every wait of this rank's kernels ends at its next check.
  if (abort != nullptr) dev::SysU32(*abort).store(1u, cuda::std::memory_order_release);
  if (first && notify) notify(e);
}

std::exception_ptr DeviceRing::Health::error() {
  {
    std::lock_guard<std::mutex> lk(mu);
    if (err) return err;
  }
  if (std::exception_ptr e = status_error()) {
    record(e);
    std::lock_guard<std::mutex> lk(mu);
    return err;
  }
  return nullptr;
}

void DeviceRing::watch() {
  const auto period = std::chrono::microseconds(t_.config().watchdog_us);
  while (!stop_.load(std::memory_order_acquire)) {
    if (error() == nullptr) {
      // The errors name the last launched call (a peer's failure ends it too).
      std::string op;
      WaitCtx w;
      {
        std::lock_guard<std::mutex> lk(health_->mu);
        op = health_->last_op;
        w.seq = health_->last_seq;
      }
      w.op = op.empty() ? "the device ring's watchdog" : op.c_str();
      try {
        // A dead or aborted peer (or this rank aborting) throws the typed error the host path
        // would raise; the kernels of this rank stop at their next check of the abort word.
        t_.ctl().check_peers(w, /*check_liveness=*/true);
        if (t_.ctl().aborting()) RC_THROW(Error, "ringcomm: rank " << rank_ << " is aborting");
      } catch (...) {
        health_->record(std::current_exception());
      }
    }
    std::this_thread::sleep_for(period);
  }
}

void DeviceRing::stop() {
  stop_.store(true, std::memory_order_release);
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> lk(health_->mu);
  health_->on_error = nullptr;  // the core may go; fences keep only the error state
}

std::vector<std::pair<uintptr_t, uintptr_t>> DeviceRing::registered() const {
  const CudaIpcConfig& c = t_.config();
  auto r = [](const void* p, size_t n) {
    return std::make_pair(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n);
  };
  return {r(self_, c.ring_bytes), r(left_, c.ring_bytes), r(right_, c.ring_bytes),
          r(state_, sizeof(dev::LaneState) * c.ring_lanes), r(status_dev_, sizeof(dev::Status)), r(abort_dev_, 64)};
}

}  // namespace rc
