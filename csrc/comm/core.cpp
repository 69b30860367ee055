#include "comm/core.h"

#include "comm/header_exchange.h"
#include "common/errors.h"
#include "common/knobs.h"
#include "common/log.h"
#include "kernels/reduce_cpu.h"

namespace rc {

CommCore::CommCore(int rank, int world, std::unique_ptr<CommDevice> dev)
    : rank_(rank), world_(world), dev_(std::move(dev)), checks_(rank, world, dev_->memory()),
      p2p_(rank, world, dev_.get(), [this](const std::exception_ptr& e) { mark_broken(e); }) {
  const int64_t keep = knob_int("RINGCOMM_TRACE");
  RC_CHECK(keep >= 0 && keep <= (int64_t{1} << 20), InvalidArgument,
           "ringcomm: RINGCOMM_TRACE=" << keep << " must be 0 (off) or the number of calls to keep, at most 1048576");
  tracer_.configure(keep);
}

CommCore::~CommCore() {
  try {
    close();
  } catch (...) {
  }
}

void CommCore::start() {
  RC_CHECK(!connected_, Error, "ringcomm: the " << dev_->name() << " is already connected");
  connected_ = true;
  progress_ = std::thread([this] { progress_loop(); });
  p2p_.start();
}

uint64_t CommCore::next_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seq_ + 1;
}

void CommCore::set_last_seq_for_test(uint64_t last) {
  std::lock_guard<std::mutex> lk(mu_);
  RC_CHECK(seq_ == 0 && queue_.empty() && !busy_, Error, "set_last_seq_for_test: collectives already ran");
  seq_ = last;
}

void CommCore::check_usable() const {
  if (closed_.load()) RC_THROW(Closed, "ringcomm: the " << dev_->name() << " (rank " << rank_ << ") is closed");
  RC_CHECK(connected_, Error, "ringcomm: the " << dev_->name() << " is not connected (call connect())");
  std::lock_guard<std::mutex> lk(mu_);
  if (!broken_.empty())
    RC_THROW(Error, "ringcomm: the " << dev_->name() << " on rank " << rank_
                                     << " is unusable after an earlier failure: " << broken_);
}

void CommCore::mark_broken(const std::exception_ptr& e) {
  std::string msg;
  const ErrorCode kind = error_code_of(e, &msg);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) return;
    broken_ = msg;
  }
  // Tell the peers: their waits raise with our reason instead of timing out.
  dev_->abort(abort_kind_of(kind), msg);
}

// ---------------- submission and execution ----------------

WorkPtr CommCore::submit(Coll coll, CollHeader hdr, Body body, Launch l, int64_t entry_ns) {
  check_usable();
  if (tracer_.on() && entry_ns == 0) entry_ns = trace_now_ns();
  hdr.coll = static_cast<uint32_t>(coll);
  Task task;
  bool inline_run = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t seq = ++seq_;
    task.work = std::make_shared<Work>(coll_name(coll), seq);
    WorkPtr work = task.work;
    task.fn = [this, seq, coll, hdr, l, work, entry_ns, body = std::move(body)] {
      TraceRecord* tr = tracer_.on() ? tracer_.begin(entry_ns) : nullptr;
      TraceCommit trace_guard(tracer_, tr);
      if (tr) trace_begin(*tr, seq, coll, hdr);
      const std::vector<CollHeader> headers = exchange_headers(dev_->control(), rank_, world_, seq, coll, hdr);
      if (tr) trace_headers_seen(*tr, coll, headers[rank_]);
      AlgoCtx c;
      c.trace = tr;
      c.rank = rank_;
      c.world = world_;
      c.seq = seq;
      c.op = coll_name(coll);
      c.dtype = static_cast<DType>(hdr.dtype);
      c.esize = dtype_size(c.dtype);
      auto fence = dev_->execute(coll, hdr, l.stream, c, [&](const AlgoCtx& cc) { body(cc, headers); });
      trace_guard.done();  // exit is stamped before the Work completes, so a waiter sees the record
      work->complete(fence);
    };
    if (!l.async && queue_.empty() && !busy_) {
      busy_ = true;  // we execute it on this thread; the progress thread waits for busy_ to clear
      inline_run = true;
    } else {
      queue_.push_back(task);
    }
  }
  if (inline_run) {
    run_task(task);
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
    }
  }
  cv_.notify_all();
  if (!l.async) task.work->wait_host(-1.0);
  return task.work;
}

void CommCore::run_task(Task& t) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) {
      std::string msg = "ringcomm: " + t.work->op() + " (seq " + std::to_string(t.work->seq()) +
                        ") on rank " + std::to_string(rank_) + " not run: the communicator failed earlier: " + broken_;
      t.work->fail(std::make_exception_ptr(Error(msg)));
      return;
    }
  }
  try {
    t.fn();  // completes the work (with the device's fence)
  } catch (const HeaderMismatch&) {
    t.work->fail(std::current_exception());
  } catch (...) {
    const std::exception_ptr e = std::current_exception();
    mark_broken(e);
    t.work->fail(e);
  }
}

void CommCore::progress_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return (stopping_ && queue_.empty()) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;  // stopping and drained
    Task t = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    run_task(t);
    lk.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void CommCore::reject(Coll coll) {
  (void)coll;
  try {
    submit(Coll::kRejected, CollHeader{}, [](const AlgoCtx&, const std::vector<CollHeader>&) {}, Launch{});
  } catch (const Mismatch&) {
    // Expected: every rank (this one included) raises for the rejected call.
  }
}

template <class Check>
WorkPtr CommCore::collective(Coll coll, const Check& check, Body body, Launch l) {
  const int64_t entry_ns = tracer_.on() ? trace_now_ns() : 0;
  check_usable();
  CollHeader h;
  try {
    h = check();
  } catch (const Error&) {
    if (!closed_.load()) reject(coll);
    throw;
  }
  return submit(coll, h, std::move(body), l, entry_ns);
}

// ---------------- collectives ----------------

WorkPtr CommCore::all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, Launch l) {
  return collective(Coll::kAllReduce, [&] {
    const bool direct = dev_->use_direct(count * static_cast<int64_t>(dtype_size(dt)));
    return checks_.all_reduce(in, out, count, dt, op, direct);
  }, [=](const AlgoCtx& c, const std::vector<CollHeader>& hs) {
    // The algorithm this rank chose is in its header (count2); the exchange checked all agree.
    if (hs[rank_].count2 != 0) {
      direct_all_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op);
    } else {
      ring_all_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op);
    }
  }, l);
}

WorkPtr CommCore::reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, Launch l) {
  return collective(Coll::kReduceScatter, [&] { return checks_.reduce_scatter(in, out, in_count, dt, op); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    ring_reduce_scatter(c, static_cast<const char*>(in), static_cast<char*>(out), in_count, op);
  }, l);
}

WorkPtr CommCore::all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt, Launch l) {
  return collective(Coll::kAllGather, [&] { return checks_.all_gather(in, out, in_count, out_count, dt); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>& hs) {
    // Every rank's contribution size is known only from the headers.
    std::vector<int64_t> counts(world_, 0);
    for (int p = 0; p < world_; ++p) counts[p] = hs[p].count2;
    check_all_gather_block(rank_, in, out, counts, out_count, c.esize);
    ring_all_gather(c, static_cast<const char*>(in), static_cast<char*>(out), counts);
  }, l);
}

WorkPtr CommCore::broadcast(void* buf, int64_t count, DType dt, int root, Launch l) {
  return collective(Coll::kBroadcast, [&] { return checks_.broadcast(buf, count, dt, root); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    chain_broadcast(c, static_cast<char*>(buf), count, root);
  }, l);
}

WorkPtr CommCore::reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, Launch l) {
  return collective(Coll::kReduce, [&] { return checks_.reduce(in, out, count, dt, op, root); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    chain_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op, root);
  }, l);
}

WorkPtr CommCore::barrier(Launch l) {
  // The header exchange is itself a barrier: nobody leaves it before every rank has arrived.
  return submit(Coll::kBarrier, CollHeader{}, [](const AlgoCtx&, const std::vector<CollHeader>&) {}, l);
}

WorkPtr CommCore::all_to_all(const void* in, void* out, std::vector<int64_t> send_counts,
                             std::vector<int64_t> recv_counts, DType dt, Launch l) {
  return collective(Coll::kAllToAll, [&] { return checks_.all_to_all(in, out, send_counts, recv_counts, dt); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    direct_all_to_all(c, static_cast<const char*>(in), static_cast<char*>(out), send_counts,
                      split_offsets(send_counts), recv_counts, split_offsets(recv_counts));
  }, l);
}

WorkPtr CommCore::gather(const void* in, void* out, int64_t count, DType dt, int root, Launch l) {
  return collective(Coll::kGather, [&] { return checks_.gather(in, out, count, dt, root); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    direct_gather(c, static_cast<const char*>(in), static_cast<char*>(out), count, root);
  }, l);
}

WorkPtr CommCore::scatter(const void* in, void* out, int64_t count, DType dt, int root, Launch l) {
  return collective(Coll::kScatter, [&] { return checks_.scatter(in, out, count, dt, root); },
                    [=](const AlgoCtx& c, const std::vector<CollHeader>&) {
    direct_scatter(c, static_cast<const char*>(in), static_cast<char*>(out), count, root);
  }, l);
}

// ---------------- point-to-point ----------------

WorkPtr CommCore::send(const void* buf, int64_t bytes, int dst, uint64_t tag, Launch l) {
  check_usable();
  checks_.p2p(buf, bytes, dst, true);
  WorkPtr w = p2p_.submit(true, const_cast<char*>(static_cast<const char*>(buf)), bytes, dst, tag, l.stream);
  if (!l.async) w->wait_host(-1.0);
  return w;
}

WorkPtr CommCore::recv(void* buf, int64_t bytes, int src, uint64_t tag, Launch l) {
  check_usable();
  checks_.p2p(buf, bytes, src, false);
  WorkPtr w = p2p_.submit(false, static_cast<char*>(buf), bytes, src, tag, l.stream);
  if (!l.async) w->wait_host(-1.0);
  return w;
}

// ---------------- shutdown ----------------

void CommCore::close() {
  if (closed_.exchange(true)) return;
  {
    std::unique_lock<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  {
    // A collective running inline on another thread finishes first (its waits are bounded).
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
  }
  p2p_.stop();
  bool broken;
  {
    std::lock_guard<std::mutex> lk(mu_);
    broken = !broken_.empty();
  }
  dev_->close(broken || !connected_);
}

}  // namespace rc
