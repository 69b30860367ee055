#include "comm/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/core.h"
#include "comm/cuda_ring.h"
#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/log.h"
#include "common/errors.h"

namespace rc {

// ---------------- events and fences ----------------

GpuEvent::GpuEvent() { RC_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), ""); }

GpuEvent::~GpuEvent() {
  if (ev != nullptr) (void)cudaEventDestroy(ev);  // fine while pending; fails harmlessly at exit
}

namespace {

// The device part of a Work: an event recorded after the enqueued GPU work. Holds the core
// weakly (the p2p thread must never own it); once the core is gone or closed, waits poll the
// event without peer checks, bounded by the communicator's timeout.
class EventFence final : public DeviceFence {
 public:
  EventFence(std::weak_ptr<CommCore> core, CudaDevice* dev, std::shared_ptr<GpuEvent> ev, double timeout_s)
      : core_(std::move(core)), dev_(dev), device_(dev->device()), timeout_s_(timeout_s), ev_(std::move(ev)) {}

  bool query() override {
    CudaDeviceGuard g(device_);
    const cudaError_t e = cudaEventQuery(ev_->ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) (void)cudaGetLastError();
    return true;  // done, or failed (wait() raises the CUDA error)
  }

  void wait(const std::string& op, uint64_t seq, double timeout_s) override {
    std::shared_ptr<CommCore> core = core_.lock();
    if (!core || core->closed()) {
      // The communicator is gone or closed (its close drained what it could): poll the event alone.
      CudaDeviceGuard g(device_);
      const double limit = timeout_s >= 0 ? timeout_s : timeout_s_;
      const auto t0 = std::chrono::steady_clock::now();
      for (;;) {
        const cudaError_t e = cudaEventQuery(ev_->ev);
        if (e == cudaSuccess) return;
        RC_CHECK(e == cudaErrorNotReady, Error, "ringcomm: " << op << " failed on the GPU: " << cudaGetErrorName(e));
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit)
          RC_THROW(TimeoutError, "ringcomm: wait() on " << op << ": Timed out after " << limit << " s");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    // core is alive, so is its device part (dev_).
    try {
      dev_->wait_gpu(ev_->ev, op, seq, timeout_s);
    } catch (const TimeoutError&) {
      if (timeout_s < 0) core->mark_broken(std::current_exception());
      throw;
    } catch (...) {
      core->mark_broken(std::current_exception());
      throw;
    }
  }

  void stream_wait(void* stream) override {
    // ev_ is this process's own event, recorded after work that depends on no peer (every peer
    // dependency was a host wait, transport/cuda_ipc.h): the stream cannot be blocked forever.
    CudaDeviceGuard g(device_);
    RC_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev_->ev, 0), " (stream_wait)");
  }

 private:
  std::weak_ptr<CommCore> core_;
  CudaDevice* dev_;
  int device_;
  double timeout_s_;
  std::shared_ptr<GpuEvent> ev_;
};

}  // namespace

void DeviceMemoryCheck::check(const void* p, const char* what, const char* op) const {
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof(a));
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    RC_THROW(InvalidArgument, "ringcomm: " << op << ": " << what << " buffer is not CUDA memory ("
                                           << cudaGetErrorName(e) << ")");
  }
  const bool ok = (a.type == cudaMemoryTypeDevice && a.device == device_) || a.type == cudaMemoryTypeManaged;
  RC_CHECK(ok, InvalidArgument,
           "ringcomm: " << op << ": " << what << " buffer is "
                        << (a.type == cudaMemoryTypeDevice ? "on CUDA device " + std::to_string(a.device)
                                                           : std::string("host memory"))
                        << " but this communicator's device is " << device_);
}

// ---------------- the device part ----------------

CudaDevice::CudaDevice(int rank, int world, int device, double timeout_s, const Knobs& knobs)
    : rank_(rank), world_(world), device_(device),
      transport_(rank, world, device, ((void)set_log_level(knobs.debug), timeout_s), knobs, device_ring_layout()),
      memcheck_(device) {}

CudaDevice::~CudaDevice() = default;

void CudaDevice::connect(const std::vector<std::string>& blobs) {
  transport_.attach(blobs);
  CudaDeviceGuard g(device_);
  RC_CUDA(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking), "");
  p2p_ch_ = std::make_unique<CudaChannel>(&transport_, Lane::kP2P, p2p_stream_);
  if (transport_.config().ring_bytes > 0 && world_ > 1) {
    CommCore* core = core_;
    ring_ = std::make_unique<DeviceRing>(transport_, rank_, world_, device_, [core](std::exception_ptr e) {
      if (core != nullptr) core->mark_broken(e);
    });
    ring_->init();
  }
  const CudaIpcConfig& cc = transport_.config();
  RC_LOG(kInfo, rank_, world_,
         "transport cuda_ipc (GPU " << device_ << ", channel to the next rank "
         << (world_ > 1 ? channel_kind_name(transport_.kind(rank_, (rank_ + 1) % world_)) : "none") << "); slots "
         << cc.slot_bytes << " B x " << cc.nslots << " x 2 lanes per peer; all_reduce ring; reduce grid cap "
         << cc.max_blocks << " blocks; control plane: " << transport_.ctl().describe_liveness() << "; "
         << transport_.ctl().describe_wait() << "; timeout " << cc.shm.timeout_s << " s");
}

void CudaDevice::wait_gpu(cudaEvent_t ev, const std::string& op, uint64_t seq, double timeout_s) {
  WaitCtx w;
  w.op = op.c_str();
  w.seq = seq;
  CudaDeviceGuard g(device_);
  transport_.wait_event(ev, w, timeout_s);
}

std::shared_ptr<DeviceFence> CudaDevice::fence(std::shared_ptr<GpuEvent> ev) {
  {
    std::lock_guard<std::mutex> lk(pending_mu_);
    // Forget completed work from the front (work on several streams may complete out of order; a
    // completed event behind a pending one is dropped later).
    while (!pending_.empty() && cudaEventQuery(pending_.front()->ev) == cudaSuccess) pending_.pop_front();
    (void)cudaGetLastError();
    pending_.push_back(ev);
  }
  return std::make_shared<EventFence>(core_->weak_from_this(), this, std::move(ev), transport_.config().shm.timeout_s);
}

std::shared_ptr<DeviceFence> CudaDevice::execute(Coll coll, const CollHeader&, void* stream, AlgoCtx& c,
                                                 FunctionRef<void(const AlgoCtx&)> body) {
  CudaDeviceGuard g(device_);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto ev = std::make_shared<GpuEvent>();
  CudaChannel ch(&transport_, Lane::kColl, s);
  c.ch = &ch;
  c.scratch = nullptr;
  body(c);
  RC_CUDA(cudaEventRecord(ev->ev, s), " (completion of " << coll_name(coll) << ")");
  return fence(std::move(ev));
}

namespace {

bool capturing(cudaStream_t s, const char* op) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  RC_CUDA(cudaStreamIsCapturing(s, &cs), " (" << op << ")");
  return cs != cudaStreamCaptureStatusNone;
}

[[noreturn]] void refuse_capture(const std::string& what) {
  RC_THROW(Unsupported, "ringcomm: " << what << " on a CUDA stream that is being captured into a graph: it runs on "
                                        "the host-ordered path, whose host waits cannot be captured (with "
                                        "RINGCOMM_CUDA_P2P=device, all_reduce, reduce_scatter, all_gather of equal "
                                        "contributions, broadcast and reduce run as one kernel and can be "
                                        "captured)");
}

}  // namespace

void CudaDevice::check_submit(Coll coll, const CollHeader& h, const CollArgs& a, void* stream) {
  if (fused(coll, h, a)) return;
  CudaDeviceGuard g(device_);
  if (capturing(static_cast<cudaStream_t>(stream), coll_name(coll))) refuse_capture(coll_name(coll));
}

bool CudaDevice::fused(Coll coll, const CollHeader&, const CollArgs& a) const {
  if (!ring_ || !DeviceRing::runs(coll)) return false;
  // The kernel moves equal contributions: an all_gather is fused when this rank's is the
  // output's equal part. With unequal contributions a rank whose part happens to be that size
  // fuses while the others take the host-ordered path: their header waits see it
  // (RoutingMismatch) and every rank raises MismatchError.
  return coll != Coll::kAllGather || a.count * world_ == a.out_count;
}

std::shared_ptr<DeviceFence> CudaDevice::run_fused(Coll coll, const CollHeader& h, const CollArgs& a, void* stream,
                                                   uint64_t seq) {
  return ring_->launch(coll, static_cast<DType>(h.dtype), a.op, a.in, a.out, a.count, a.root,
                       static_cast<cudaStream_t>(stream), [this](std::shared_ptr<GpuEvent> ev) {
                         // The ring's stream is in order: its last event covers every launch
                         // (close() drains it). Nothing is queried here.
                         std::lock_guard<std::mutex> lk(pending_mu_);
                         ring_last_ = std::move(ev);
                       },
                       seq);
}

void CudaDevice::p2p_thread_start() {
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
}

void* CudaDevice::p2p_prepare(void* stream) {
  // The internal stream starts after everything the caller enqueued before this call.
  CudaDeviceGuard g(device_);
  if (capturing(static_cast<cudaStream_t>(stream), "send/recv")) refuse_capture("send/recv");
  cudaEvent_t ready = nullptr;
  RC_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "");
  const cudaError_t e = cudaEventRecord(ready, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaEventDestroy(ready);
    RC_CUDA(e, " (send/recv)");
  }
  return ready;
}

void CudaDevice::p2p_begin(void* token) {
  RC_CUDA(cudaStreamWaitEvent(p2p_stream_, static_cast<cudaEvent_t>(token), 0), "");
}

std::shared_ptr<DeviceFence> CudaDevice::p2p_end(void* token, bool ok) {
  if (token != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(token));
  if (!ok) return nullptr;
  auto ev = std::make_shared<GpuEvent>();
  RC_CUDA(cudaEventRecord(ev->ev, p2p_stream_), "");
  return fence(std::move(ev));
}

bool CudaDevice::p2p_idle() {
  if (p2p_stream_ == nullptr) return true;  // never created: nothing ran on it
  CudaDeviceGuard g(device_);
  const cudaError_t e = cudaStreamQuery(p2p_stream_);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;  // a failed stream: nothing proves its copies are over
  }
  return true;
}

void CudaDevice::close(bool broken) {
  // Let the GPU finish what this communicator enqueued (bounded by RINGCOMM_CUDA_CLOSE_WAIT),
  // broken or not: only then may the inbox, events and staging registrations go (transport
  // close). The drain checks no peer: no stream of ours waits on a peer's event
  // (transport/cuda_ipc.h), so our work completes whether the peers live or not. A GPU error or
  // a kernel outliving the bound leaves the work undrained: the transport then retires its
  // memory instead of freeing it.
  if (ring_) ring_->stop();  // the watchdog reads the control plane, which the transport closes
  bool drained = false;
  try {
    CudaDeviceGuard g(device_);
    const double wait_s = transport_.config().close_wait_s;
    std::deque<std::shared_ptr<GpuEvent>> pending;
    {
      std::lock_guard<std::mutex> lk(pending_mu_);
      pending.swap(pending_);
      if (ring_last_) pending.push_back(std::move(ring_last_));
    }
    WaitCtx w;
    w.op = broken ? "close (after a failure)" : "close";
    const int64_t t0 = now_ns();
    auto left_s = [&] { return std::max(0.0, wait_s - static_cast<double>(now_ns() - t0) * 1e-9); };
    for (auto& e : pending) transport_.wait_event(e->ev, w, left_s(), /*check_peers=*/false);
    if (p2p_stream_) {
      // Copies of failed point-to-point operations have no fence in pending_: drain the stream.
      cudaEvent_t tail = nullptr;
      RC_CUDA(cudaEventCreateWithFlags(&tail, cudaEventDisableTiming), "");
      const cudaError_t er = cudaEventRecord(tail, p2p_stream_);
      if (er == cudaSuccess) {
        try {
          transport_.wait_event(tail, w, left_s(), /*check_peers=*/false);
        } catch (...) {
          (void)cudaEventDestroy(tail);
          throw;
        }
      }
      (void)cudaEventDestroy(tail);
      RC_CUDA(er, " (draining the point-to-point stream)");
      // The stream itself is never destroyed: torch tensors marked with record_stream for it
      // (ringcomm/cuda/inflight.py) may be freed after close, and the allocator then records an
      // event on it. An idle stream until exit costs next to nothing.
    }
    drained = true;
  } catch (...) {
    drained = false;
  }
  if (ring_) ring_->release(drained);
  transport_.close(drained);
}

}  // namespace rc
