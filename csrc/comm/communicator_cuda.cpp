#include "comm/communicator_cuda.h"
#include "comm/header_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "algo/ring_schedule.h"
#include "comm/work.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cuda.h"
#include "transport/futex.h"

namespace rc {

namespace {

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

// The data plane of one collective on the CUDA transport's collective lane: every primitive is
// enqueued on the caller's stream.
class CudaSlotExec : public SlotExec {
 public:
  CudaSlotExec(CudaIpcTransport* t, cudaStream_t s) : t_(t), s_(s) {}
  size_t slot_bytes() const override { return t_->config().slot_bytes; }
  char* send_slot(int peer, const WaitCtx& w) override { return t_->send_slot(peer, Lane::kColl, w, s_); }
  void send_post(int peer, uint64_t bytes, uint64_t total, uint64_t tag) override {
    t_->send_post(peer, Lane::kColl, bytes, total, tag, s_);
  }
  const char* recv_slot(int peer, const WaitCtx& w, const SlotMeta** meta) override {
    return t_->recv_slot(peer, Lane::kColl, w, s_, meta);
  }
  void recv_done(int peer) override { t_->recv_done(peer, Lane::kColl, s_); }
  void reduce(void* dst, const void* a, const void* b, size_t n, DType dt, ReduceOp op, double scale) override {
    reduce_cuda(dst, a, b, n, dt, op, scale, s_, t_->config().max_blocks);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    RC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s_), " (" << bytes << " bytes)");
  }

 private:
  CudaIpcTransport* t_;
  cudaStream_t s_;
};

}  // namespace

// ---------------- GpuEvent / CudaWork ----------------

GpuEvent::GpuEvent() { RC_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), ""); }

GpuEvent::~GpuEvent() {
  if (ev != nullptr) (void)cudaEventDestroy(ev);  // fine while pending; fails harmlessly at exit
}

CudaWork::CudaWork(const std::shared_ptr<CudaCommunicator>& comm, std::string op, uint64_t seq)
    : comm_(comm), rank_(comm->rank()), device_(comm->device()), timeout_s_(comm->timeout()), op_(std::move(op)),
      seq_(seq), ev_(std::make_shared<GpuEvent>()) {}

CudaWork::~CudaWork() = default;

void CudaWork::mark_enqueued() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    enqueued_ = true;
  }
  cv_.notify_all();
}

void CudaWork::fail(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    enqueued_ = true;
    error_ = e;
  }
  cv_.notify_all();
}

bool CudaWork::wait_enqueued(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  const double limit = timeout_s >= 0 ? timeout_s : timeout_s_;
  if (!cv_.wait_for(lk, std::chrono::duration<double>(limit), [&] { return enqueued_; })) {
    if (timeout_s >= 0)
      RC_THROW(TimeoutError, "ringcomm: wait() on " << op_ << " timed out after " << timeout_s
                                                    << " s; the operation is still running");
    RC_THROW(TimeoutError, "ringcomm: " << op_ << " on rank " << rank_ << " was not carried out within "
                                        << limit << " s (RINGCOMM_TIMEOUT / timeout=)");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

void CudaWork::wait(double timeout_s) {
  wait_enqueued(timeout_s);
  std::shared_ptr<CudaCommunicator> comm = comm_.lock();
  if (!comm || comm->closed()) {
    // The communicator is gone or closed (its close drained what it could): poll the event alone.
    CudaDeviceGuard g(device_);
    const double limit = timeout_s >= 0 ? timeout_s : timeout_s_;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev_->ev);
      if (e == cudaSuccess) return;
      RC_CHECK(e == cudaErrorNotReady, Error, "ringcomm: " << op_ << " failed on the GPU: " << cudaGetErrorName(e));
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit)
        RC_THROW(TimeoutError, "ringcomm: wait() on " << op_ << " timed out after " << limit << " s");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  try {
    comm->wait_gpu(ev_->ev, op_, seq_, timeout_s);
  } catch (const TimeoutError&) {
    if (timeout_s < 0) comm->mark_broken(std::current_exception());
    throw;
  } catch (...) {
    comm->mark_broken(std::current_exception());
    throw;
  }
}

bool CudaWork::is_completed() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!enqueued_) return false;
    if (error_) return true;
  }
  CudaDeviceGuard g(device_);
  cudaError_t e = cudaEventQuery(ev_->ev);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) (void)cudaGetLastError();
  return true;  // done, or failed (wait() raises the CUDA error)
}

void CudaWork::stream_wait(cudaStream_t stream) {
  wait_enqueued(-1.0);
  CudaDeviceGuard g(device_);
  RC_CUDA(cudaStreamWaitEvent(stream, ev_->ev, 0), " (stream_wait on " << op_ << ")");
}

int CudaWork::error_code() {
  std::lock_guard<std::mutex> lk(mu_);
  return error_ ? static_cast<int>(error_code_of(error_, nullptr)) : -1;
}

std::string CudaWork::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!error_) return {};
  std::string msg;
  error_code_of(error_, &msg);
  return msg;
}

// ---------------- communicator: setup ----------------

CudaCommunicator::CudaCommunicator(int rank, int world, int device, double timeout_s)
    : rank_(rank), world_(world), device_(device), transport_(rank, world, device, timeout_s) {
  refresh_log_level();
}

CudaCommunicator::~CudaCommunicator() {
  try {
    close();
  } catch (...) {
  }
}

std::string CudaCommunicator::local_info() { return transport_.local_info(); }

std::string CudaCommunicator::create(const std::vector<std::string>& infos) { return transport_.create(infos); }

void CudaCommunicator::connect(const std::vector<std::string>& blobs) {
  RC_CHECK(!connected_, Error, "ringcomm: the CUDA communicator is already connected");
  transport_.attach(blobs);
  {
    CudaDeviceGuard g(device_);
    RC_CUDA(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking), "");
  }
  connected_ = true;
  p2p_thread_ = std::thread([this] { p2p_loop(); });
  const CudaIpcConfig& cc = transport_.config();
  RC_LOG(kInfo, rank_, world_,
         "transport cuda_ipc (GPU " << device_ << ", channel to the next rank "
         << (world_ > 1 ? channel_kind_name(transport_.kind(rank_, (rank_ + 1) % world_)) : "none") << "); slots " << cc.slot_bytes << " B x "
         << cc.nslots << " x 2 lanes per peer; all_reduce ring; reduce grid cap " << cc.max_blocks << " blocks; timeout "
         << cc.shm.timeout_s << " s");
}

uint64_t CudaCommunicator::next_seq() const {
  std::lock_guard<std::mutex> lk(coll_mu_);
  return seq_ + 1;
}

void CudaCommunicator::check_usable() const {
  if (closed_.load()) RC_THROW(Closed, "ringcomm: the CUDA communicator (rank " << rank_ << ") is closed");
  RC_CHECK(connected_, Error, "ringcomm: the CUDA communicator is not connected");
  std::lock_guard<std::mutex> lk(state_mu_);
  if (!broken_.empty())
    RC_THROW(Error, "ringcomm: the CUDA communicator on rank " << rank_
                                                             << " is unusable after an earlier failure: " << broken_);
}

void CudaCommunicator::mark_broken(const std::exception_ptr& e) {
  std::string msg;
  const ErrorCode kind = error_code_of(e, &msg);
  {
    std::lock_guard<std::mutex> lk(state_mu_);
    if (!broken_.empty()) return;
    broken_ = msg;
  }
  // Tell the peers: their waits raise with our reason instead of timing out.
  transport_.abort(abort_kind_of(kind), msg);
}

void CudaCommunicator::wait_gpu(cudaEvent_t ev, const std::string& op, uint64_t seq, double timeout_s) {
  WaitCtx w;
  w.op = op.c_str();
  w.seq = seq;
  CudaDeviceGuard g(device_);
  transport_.wait_event(ev, w, timeout_s);
}

void CudaCommunicator::track(const CudaWorkPtr& w) {
  std::lock_guard<std::mutex> lk(state_mu_);
  // Forget completed work from the front (work on several streams may complete out of order; a
  // completed event behind a pending one is dropped later).
  while (!pending_.empty() && cudaEventQuery(pending_.front()->ev) == cudaSuccess) pending_.pop_front();
  (void)cudaGetLastError();
  pending_.push_back(w->shared_event());
}

// ---------------- communicator: collectives ----------------

std::vector<CollHeader> CudaCommunicator::exchange_headers(uint64_t seq, Coll coll, const CollHeader& mine) {
  return rc::exchange_headers(transport_.ctl(), rank_, world_, seq, coll, mine);
}

CudaWorkPtr CudaCommunicator::run(Coll coll, CollHeader hdr, cudaStream_t stream,
                                  const std::function<void(const SlotAlgoCtx&, const std::vector<CollHeader>&)>& body) {
  check_usable();
  hdr.coll = static_cast<uint32_t>(coll);
  std::lock_guard<std::mutex> lk(coll_mu_);
  const uint64_t seq = ++seq_;
  std::vector<CollHeader> headers;
  try {
    headers = exchange_headers(seq, coll, hdr);
  } catch (const HeaderMismatch&) {
    throw;  // seen alike by every rank before any data moved: the communicator stays usable
  } catch (...) {
    mark_broken(std::current_exception());
    throw;
  }
  try {
    CudaDeviceGuard g(device_);
    auto work = std::make_shared<CudaWork>(shared_from_this(), coll_name(coll), seq);
    CudaSlotExec x(&transport_, stream);
    SlotAlgoCtx c;
    c.x = &x;
    c.rank = rank_;
    c.world = world_;
    c.seq = seq;
    c.op = coll_name(coll);
    c.dtype = static_cast<DType>(hdr.dtype);
    c.esize = dtype_size(c.dtype);
    body(c, headers);
    RC_CUDA(cudaEventRecord(work->event(), stream), " (completion of " << coll_name(coll) << ")");
    work->mark_enqueued();
    track(work);
    return work;
  } catch (...) {
    mark_broken(std::current_exception());
    throw;
  }
}

void CudaCommunicator::reject(Coll coll) {
  (void)coll;
  try {
    run(Coll::kRejected, CollHeader{}, nullptr, [](const SlotAlgoCtx&, const std::vector<CollHeader>&) {});
  } catch (const Mismatch&) {
    // Expected: every rank (this one included) raises for the rejected call.
  }
}

// Local checks run before the header exchange. A rank whose arguments fail them still joins the
// exchange (as a rejection) so that its peers raise too instead of waiting for it.
#define RC_CUDA_LOCAL_CHECKS(coll, body) \
  do {                                   \
    try {                                \
      body;                              \
    } catch (const Error&) {             \
      if (!closed_.load()) reject(coll); \
      throw;                             \
    }                                    \
  } while (0)

void CudaCommunicator::check_root(int root, Coll coll) {
  RC_CHECK(root >= 0 && root < world_, InvalidArgument,
           "ringcomm: " << coll_name(coll) << ": root " << root << " is out of range [0, " << world_ << ")");
}

void CudaCommunicator::check_dev(const void* p, int64_t count, DType dt, const char* what, const char* coll) {
  RC_CHECK(count >= 0, InvalidArgument, "ringcomm: " << coll << ": negative element count " << count);
  dtype_size(dt);
  if (count == 0) return;
  RC_CHECK(p != nullptr, InvalidArgument, "ringcomm: " << coll << ": " << what << " buffer is null");
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof(a));
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    RC_THROW(InvalidArgument, "ringcomm: " << coll << ": " << what << " buffer is not CUDA memory ("
                                           << cudaGetErrorName(e) << ")");
  }
  const bool ok = (a.type == cudaMemoryTypeDevice && a.device == device_) || a.type == cudaMemoryTypeManaged;
  RC_CHECK(ok, InvalidArgument,
           "ringcomm: " << coll << ": " << what << " buffer is "
                        << (a.type == cudaMemoryTypeDevice ? "on CUDA device " + std::to_string(a.device)
                                                           : std::string("host memory"))
                        << " but this communicator's device is " << device_);
}

CudaWorkPtr CudaCommunicator::all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op,
                                         cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kAllReduce, {
    check_dev(in, count, dt, "input", coll_name(Coll::kAllReduce));
    check_dev(out, count, dt, "output", coll_name(Coll::kAllReduce));
    check_reduce_supported(dt, op);
    const size_t b = static_cast<size_t>(count) * dtype_size(dt);
    RC_CHECK(in == out || !overlaps(in, b, out, b), InvalidArgument,
             "ringcomm: all_reduce: input and output overlap partially");
  });
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), -1, count, 0};
  return run(Coll::kAllReduce, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_ring_all_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op);
  });
}

CudaWorkPtr CudaCommunicator::reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op,
                                             cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kReduceScatter, {
    const int64_t own = in_count >= 0 ? ring::chunk_count(in_count, world_, rank_) : 0;
    check_dev(in, in_count, dt, "input", coll_name(Coll::kReduceScatter));
    check_dev(out, own, dt, "output", coll_name(Coll::kReduceScatter));
    check_reduce_supported(dt, op);
    const size_t es = dtype_size(dt);
    const char* own_in = static_cast<const char*>(in) + ring::chunk_offset(in_count, world_, rank_) * es;
    RC_CHECK(out == own_in || !overlaps(in, static_cast<size_t>(in_count) * es, out, static_cast<size_t>(own) * es),
             InvalidArgument,
             "ringcomm: reduce_scatter: the output overlaps the input (it may only be this rank's own chunk of it)");
  });
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), -1, in_count, 0};
  return run(Coll::kReduceScatter, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_ring_reduce_scatter(c, static_cast<const char*>(in), static_cast<char*>(out), in_count, op);
  });
}

CudaWorkPtr CudaCommunicator::all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt,
                                         cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kAllGather, {
    check_dev(in, in_count, dt, "input", coll_name(Coll::kAllGather));
    check_dev(out, out_count, dt, "output", coll_name(Coll::kAllGather));
    RC_CHECK(in_count <= out_count, InvalidArgument,
             "ringcomm: all_gather: input has " << in_count << " elements but the output only " << out_count);
    const size_t es = dtype_size(dt);
    if (overlaps(in, static_cast<size_t>(in_count) * es, out, static_cast<size_t>(out_count) * es)) {
      // In place: the input must be an element-aligned slice of the output (its own block,
      // checked against every rank's count once the headers are in).
      const uintptr_t d = reinterpret_cast<uintptr_t>(in) - reinterpret_cast<uintptr_t>(out);
      RC_CHECK(in >= out && d % es == 0 && d / es + static_cast<uint64_t>(in_count) <= static_cast<uint64_t>(out_count),
               InvalidArgument, "ringcomm: all_gather: the input overlaps the output without being a slice of it");
    }
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, -1, out_count, in_count};
  return run(Coll::kAllGather, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>& hs) {
    std::vector<int64_t> counts(world_, 0);
    int64_t before = 0;
    for (int p = 0; p < world_; ++p) {
      counts[p] = hs[p].count2;
      if (p < rank_) before += counts[p];
    }
    const size_t es = c.esize;
    if (overlaps(in, static_cast<size_t>(in_count) * es, out, static_cast<size_t>(out_count) * es) &&
        static_cast<const char*>(in) != static_cast<const char*>(out) + before * es) {
      RC_THROW(InvalidArgument, "ringcomm: all_gather on rank " << rank_ << ": the input is a slice of the output but "
                                                               << "not this rank's block (elements " << before << ".."
                                                               << before + in_count << ")");
    }
    slot_ring_all_gather(c, static_cast<const char*>(in), static_cast<char*>(out), counts);
  });
}

CudaWorkPtr CudaCommunicator::broadcast(void* buf, int64_t count, DType dt, int root, cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kBroadcast, {
    check_dev(buf, count, dt, "the", coll_name(Coll::kBroadcast));
    check_root(root, Coll::kBroadcast);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return run(Coll::kBroadcast, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_chain_broadcast(c, static_cast<char*>(buf), count, root);
  });
}

CudaWorkPtr CudaCommunicator::reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root,
                                     cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kReduce, {
    check_dev(in, count, dt, "input", coll_name(Coll::kReduce));
    check_root(root, Coll::kReduce);
    if (rank_ == root) {
      check_dev(out, count, dt, "output", coll_name(Coll::kReduce));
      const size_t b = static_cast<size_t>(count) * dtype_size(dt);
      RC_CHECK(in == out || !overlaps(in, b, out, b), InvalidArgument,
               "ringcomm: reduce: input and output overlap partially");
    }
    check_reduce_supported(dt, op);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), root, count, 0};
  return run(Coll::kReduce, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_chain_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op, root);
  });
}

CudaWorkPtr CudaCommunicator::barrier(cudaStream_t stream) {
  // The header exchange is a host barrier: nobody leaves it before every rank has arrived.
  return run(Coll::kBarrier, CollHeader{}, stream, [](const SlotAlgoCtx&, const std::vector<CollHeader>&) {});
}

CudaWorkPtr CudaCommunicator::all_to_all(const void* in, void* out, std::vector<int64_t> send_counts,
                                         std::vector<int64_t> recv_counts, DType dt, cudaStream_t stream) {
  check_usable();
  int64_t in_total = 0, out_total = 0;
  RC_CUDA_LOCAL_CHECKS(Coll::kAllToAll, {
    RC_CHECK(static_cast<int>(send_counts.size()) == world_ && static_cast<int>(recv_counts.size()) == world_,
             InvalidArgument, "ringcomm: all_to_all: split lists need " << world_ << " entries, got "
                                                                         << send_counts.size() << " and "
                                                                         << recv_counts.size());
    for (int p = 0; p < world_; ++p) {
      RC_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0, InvalidArgument, "ringcomm: all_to_all: negative split size");
      in_total += send_counts[p];
      out_total += recv_counts[p];
    }
    check_dev(in, in_total, dt, "input", coll_name(Coll::kAllToAll));
    check_dev(out, out_total, dt, "output", coll_name(Coll::kAllToAll));
    const size_t es = dtype_size(dt);
    RC_CHECK(!overlaps(in, static_cast<size_t>(in_total) * es, out, static_cast<size_t>(out_total) * es),
             InvalidArgument, "ringcomm: all_to_all: input and output overlap (pass a copy of the input)");
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, -1, in_total, out_total};
  return run(Coll::kAllToAll, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    std::vector<int64_t> soff(world_, 0), roff(world_, 0);
    for (int p = 1; p < world_; ++p) {
      soff[p] = soff[p - 1] + send_counts[p - 1];
      roff[p] = roff[p - 1] + recv_counts[p - 1];
    }
    slot_direct_all_to_all(c, static_cast<const char*>(in), static_cast<char*>(out), send_counts, soff, recv_counts,
                           roff);
  });
}

CudaWorkPtr CudaCommunicator::gather(const void* in, void* out, int64_t count, DType dt, int root,
                                     cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kGather, {
    check_dev(in, count, dt, "input", coll_name(Coll::kGather));
    check_root(root, Coll::kGather);
    if (rank_ == root) {
      check_dev(out, count * world_, dt, "output", coll_name(Coll::kGather));
      const size_t b = static_cast<size_t>(count) * dtype_size(dt);
      const char* own = static_cast<const char*>(out) + rank_ * b;
      RC_CHECK(in == own || !overlaps(in, b, out, b * world_), InvalidArgument,
               "ringcomm: gather: the input overlaps the output without being the root's own block");
    }
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return run(Coll::kGather, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_direct_gather(c, static_cast<const char*>(in), static_cast<char*>(out), count, root);
  });
}

CudaWorkPtr CudaCommunicator::scatter(const void* in, void* out, int64_t count, DType dt, int root,
                                      cudaStream_t stream) {
  check_usable();
  RC_CUDA_LOCAL_CHECKS(Coll::kScatter, {
    check_dev(out, count, dt, "output", coll_name(Coll::kScatter));
    check_root(root, Coll::kScatter);
    if (rank_ == root) {
      check_dev(in, count * world_, dt, "input", coll_name(Coll::kScatter));
      const size_t b = static_cast<size_t>(count) * dtype_size(dt);
      const char* own = static_cast<const char*>(in) + rank_ * b;
      RC_CHECK(out == own || !overlaps(in, b * world_, out, b), InvalidArgument,
               "ringcomm: scatter: the output overlaps the input without being the root's own block");
    }
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return run(Coll::kScatter, h, stream, [=](const SlotAlgoCtx& c, const std::vector<CollHeader>&) {
    slot_direct_scatter(c, static_cast<const char*>(in), static_cast<char*>(out), count, root);
  });
}

// ---------------- point-to-point ----------------

CudaWorkPtr CudaCommunicator::send(const void* buf, int64_t bytes, int dst, uint64_t tag, cudaStream_t stream) {
  return submit_p2p(true, const_cast<char*>(static_cast<const char*>(buf)), bytes, dst, tag, stream);
}

CudaWorkPtr CudaCommunicator::recv(void* buf, int64_t bytes, int src, uint64_t tag, cudaStream_t stream) {
  return submit_p2p(false, static_cast<char*>(buf), bytes, src, tag, stream);
}

CudaWorkPtr CudaCommunicator::submit_p2p(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag,
                                         cudaStream_t stream) {
  check_usable();
  const char* name = is_send ? "send" : "recv";
  RC_CHECK(peer >= 0 && peer < world_ && peer != rank_, InvalidArgument,
           "ringcomm: " << name << ": peer " << peer << " is not another rank of this communicator (rank " << rank_
                        << ", world size " << world_ << ")");
  check_dev(buf, bytes, DType::kUInt8, "message", name);
  CudaDeviceGuard g(device_);
  P2POp op;
  op.is_send = is_send;
  op.peer = peer;
  op.buf = buf;
  op.bytes = static_cast<uint64_t>(bytes);
  op.tag = tag;
  op.deadline_ns = now_ns() + static_cast<int64_t>(timeout() * 1e9);
  op.work = std::make_shared<CudaWork>(shared_from_this(), name, 0);
  // The internal stream starts after everything the caller enqueued before this call.
  RC_CUDA(cudaEventCreateWithFlags(&op.ready, cudaEventDisableTiming), "");
  RC_CUDA(cudaEventRecord(op.ready, stream), " (" << name << ")");
  CudaWorkPtr w = op.work;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_new_.push_back(std::move(op));
  }
  p2p_cv_.notify_all();
  transport_.ctl().ring_doorbell(rank_);  // wake our p2p thread if it sleeps on the doorbell
  return w;
}

// Moves as many pieces as the channel allows right now; true if anything moved.
bool CudaCommunicator::p2p_advance(P2POp& op) {
  const size_t slot = transport_.config().slot_bytes;
  bool moved = false;
  if (!op.gated) {
    RC_CUDA(cudaStreamWaitEvent(p2p_stream_, op.ready, 0), "");
    op.gated = true;
  }
  while (!op.started || op.done < op.bytes) {
    if (op.is_send) {
      char* dst = transport_.try_send_slot(op.peer, Lane::kP2P, p2p_stream_);
      if (dst == nullptr) return moved;
      const uint64_t n = std::min<uint64_t>(slot, op.bytes - op.done);
      if (n > 0) RC_CUDA(cudaMemcpyAsync(dst, op.buf + op.done, n, cudaMemcpyDefault, p2p_stream_), "");
      transport_.send_post(op.peer, Lane::kP2P, n, op.bytes, op.tag, p2p_stream_);
      op.done += n;
    } else {
      const SlotMeta* m = nullptr;
      const char* src = transport_.try_recv_slot(op.peer, Lane::kP2P, p2p_stream_, &m);
      if (src == nullptr) return moved;
      if (!op.started && m->total != op.bytes) {
        RC_THROW(Mismatch, "ringcomm: recv on rank " << rank_ << " from rank " << op.peer << ": the matching send has "
                                                     << m->total << " bytes but the receive buffer has " << op.bytes);
      }
      RC_CHECK(op.done + m->bytes <= op.bytes, Error, "ringcomm: recv: message overruns the buffer");
      if (m->bytes > 0) RC_CUDA(cudaMemcpyAsync(op.buf + op.done, src, m->bytes, cudaMemcpyDefault, p2p_stream_), "");
      op.done += m->bytes;
      transport_.recv_done(op.peer, Lane::kP2P, p2p_stream_);
    }
    op.started = true;
    moved = true;
  }
  return moved;
}

void CudaCommunicator::p2p_loop() {
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  std::vector<std::deque<P2POp>> sendq(world_), recvq(world_);
  size_t pending = 0;
  int64_t idle_since = 0, next_liveness = 0;
  const ShmConfig& sc = transport_.config().shm;
  auto finish = [&](P2POp& op, std::exception_ptr e) {
    if (op.ready) (void)cudaEventDestroy(op.ready);
    op.ready = nullptr;
    if (e) {
      op.work->fail(e);
      return;
    }
    try {
      RC_CUDA(cudaEventRecord(op.work->event(), p2p_stream_), "");
      track(op.work);
      op.work->mark_enqueued();
    } catch (...) {
      op.work->fail(std::current_exception());
    }
  };
  auto fail_all = [&](std::exception_ptr e) {
    for (auto* qs : {&sendq, &recvq})
      for (auto& q : *qs) {
        for (auto& op : q) finish(op, e);
        q.clear();
      }
    pending = 0;
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(p2p_mu_);
      if (pending == 0) p2p_cv_.wait(lk, [&] { return p2p_stopping_ || !p2p_new_.empty(); });
      while (!p2p_new_.empty()) {
        P2POp op = std::move(p2p_new_.front());
        p2p_new_.pop_front();
        (op.is_send ? sendq : recvq)[op.peer].push_back(std::move(op));
        ++pending;
      }
      if (p2p_stopping_) {
        lk.unlock();
        fail_all(std::make_exception_ptr(Closed("ringcomm: the communicator was closed while this send/recv was pending")));
        return;
      }
    }
    const uint32_t bell = transport_.ctl().doorbell_value();
    bool progressed = false;
    for (auto* qs : {&sendq, &recvq}) {
      for (auto& q : *qs) {
        while (!q.empty()) {
          P2POp& op = q.front();
          try {
            progressed |= p2p_advance(op);
          } catch (...) {
            std::exception_ptr e = std::current_exception();
            mark_broken(e);
            fail_all(e);
            break;
          }
          if (op.started && op.done == op.bytes) {
            finish(op, nullptr);
            q.pop_front();
            --pending;
            progressed = true;
          } else {
            break;
          }
        }
      }
    }
    if (progressed || pending == 0) {
      idle_since = 0;
      continue;
    }
    const int64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < sc.spin_ns) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      continue;
    }
    try {
      for (auto* qs : {&sendq, &recvq})
        for (auto& q : *qs)
          if (!q.empty() && now > q.front().deadline_ns) {
            const P2POp& op = q.front();
            RC_THROW(TimeoutError, "ringcomm: " << (op.is_send ? "send to" : "recv from") << " rank " << op.peer
                                                << " on rank " << rank_ << " timed out after " << sc.timeout_s << " s ("
                                                << op.done << " of " << op.bytes << " bytes moved)");
          }
      WaitCtx w;
      w.op = "send/recv";
      const bool live = now >= next_liveness;
      if (live) next_liveness = now + sc.liveness_ns;
      transport_.ctl().check_peers(w, live);
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      mark_broken(e);
      fail_all(e);
      continue;
    }
    transport_.ctl().doorbell_wait(bell, std::min<int64_t>(sc.liveness_ns, 20'000'000));
  }
}

// ---------------- shutdown ----------------

void CudaCommunicator::close() {
  if (closed_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_stopping_ = true;
  }
  p2p_cv_.notify_all();
  if (connected_) transport_.ctl().ring_doorbell(rank_);
  if (p2p_thread_.joinable()) p2p_thread_.join();
  bool drained = false;
  if (connected_) {
    std::lock_guard<std::mutex> lk(coll_mu_);  // a collective in progress finishes (bounded) first
    bool broken;
    {
      std::lock_guard<std::mutex> slk(state_mu_);
      broken = !broken_.empty();
    }
    if (!broken) {
      // Let the GPU finish what this communicator enqueued (bounded): only then may the inbox,
      // events and staging registrations go (transport close).
      try {
        CudaDeviceGuard g(device_);
        const double wait_s = transport_.config().close_wait_s;
        std::deque<std::shared_ptr<GpuEvent>> pending;
        {
          std::lock_guard<std::mutex> slk(state_mu_);
          pending.swap(pending_);
        }
        WaitCtx w;
        w.op = "close";
        for (auto& e : pending) transport_.wait_event(e->ev, w, wait_s);
        drained = true;
        if (p2p_stream_) (void)cudaStreamDestroy(p2p_stream_);
        p2p_stream_ = nullptr;
      } catch (...) {
        drained = false;
      }
    }
  }
  transport_.close(drained);
}

}  // namespace rc
