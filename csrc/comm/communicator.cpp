#include "comm/communicator.h"
#include "comm/header_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <sstream>

#include "algo/context.h"
#include "common/knobs.h"
#include "common/log.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cpu_isa.h"
#include "transport/futex.h"

namespace rc {


const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "all_reduce";
    case Coll::kReduceScatter: return "reduce_scatter";
    case Coll::kAllGather: return "all_gather";
    case Coll::kBroadcast: return "broadcast";
    case Coll::kReduce: return "reduce";
    case Coll::kBarrier: return "barrier";
    case Coll::kAllToAll: return "all_to_all";
    case Coll::kGather: return "gather";
    case Coll::kScatter: return "scatter";
    case Coll::kRejected: return "rejected call";
  }
  return "unknown collective";
}

Communicator::Communicator(int rank, int world, double timeout_s)
    : rank_(rank), world_(world), transport_(rank, world, ((void)refresh_log_level(), ShmConfig::from_env(world, timeout_s))) {
  const std::string algo = knob_str("RINGCOMM_ALGO");
  if (algo == "ring") algo_ = Algo::kRing;
  else if (algo == "direct") algo_ = Algo::kDirect;
  else if (algo == "auto") algo_ = Algo::kAuto;
  else RC_THROW(InvalidArgument, "RINGCOMM_ALGO='" << algo << "': use ring, direct or auto");
  direct_max_bytes_ = knob_bytes("RINGCOMM_DIRECT_MAX_BYTES");
  scratch_.resize(transport_.config().slot_bytes);
}

Communicator::~Communicator() {
  try {
    close();
  } catch (...) {
  }
}

std::string Communicator::create() { return transport_.create(); }

void Communicator::connect(const std::vector<std::string>& names) {
  RC_CHECK(!connected_, Error, "ringcomm: communicator already connected");
  transport_.attach(names);
  connected_ = true;
  const ShmConfig& sc = transport_.config();
  RC_LOG(kInfo, rank_, world_,
         "transport shm; slots " << sc.slot_bytes << " B x " << sc.nslots << " x " << kNumLanes << " lanes per peer; "
         << "shared memory " << transport_.segment_bytes() << " B per rank; all_reduce "
         << (algo_ == Algo::kRing ? "ring" : algo_ == Algo::kDirect ? "direct" : "auto") << " (direct while bytes x "
         << "(world-1) <= " << direct_max_bytes_ << " B); store policy " << store_policy_.describe()
         << "; reduce ISA " << cpu_isa_name(reduce_cpu_isa()) << "; timeout " << sc.timeout_s << " s");
  progress_ = std::thread([this] { progress_loop(); });
  p2p_thread_ = std::thread([this] { p2p_loop(); });
}

uint64_t Communicator::next_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seq_ + 1;
}

void Communicator::check_usable() const {
  if (closed_.load()) RC_THROW(Closed, "ringcomm: the communicator (rank " << rank_ << ") is closed");
  RC_CHECK(connected_, Error, "ringcomm: the communicator is not connected (call connect())");
  std::lock_guard<std::mutex> lk(mu_);
  if (!broken_.empty())
    RC_THROW(Error, "ringcomm: the communicator on rank " << rank_
                                                        << " is unusable after an earlier failure: " << broken_);
}

// ---------------- collectives: submission and execution ----------------

namespace {

// The bytes a collective moves, for the store policy: the collectives whose element count the
// header exchange checks equal on every rank (so every rank classifies them alike); 0 otherwise.
uint64_t policy_bytes(Coll coll, const CollHeader& h) {
  switch (coll) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kReduce:
      return h.count > 0 ? static_cast<uint64_t>(h.count) * dtype_size(static_cast<DType>(h.dtype)) : 0;
    default:
      return 0;
  }
}

}  // namespace

WorkPtr Communicator::submit(Coll coll, CollHeader hdr, std::function<void(uint64_t)> body, bool async) {
  check_usable();
  hdr.coll = static_cast<uint32_t>(coll);
  Task task;
  bool inline_run = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t seq = ++seq_;
    task.work = std::make_shared<Work>(coll_name(coll), seq);
    task.fn = [this, seq, coll, hdr, body = std::move(body)] {
      exchange_headers(seq, coll, hdr);
      const uint64_t bytes = policy_bytes(coll, hdr);
      const StorePolicy::Choice choice = store_policy_.choose(bytes, static_cast<int>(coll));
      stream_now_ = choice.stream;
      const auto t0 = std::chrono::steady_clock::now();
      body(seq);
      if (choice.cls >= 0) {
        const auto dt = std::chrono::steady_clock::now() - t0;
        store_policy_.record(choice, bytes, std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
      }
      RC_LOG(kTrace, rank_, world_,
             describe_header(hdr) << " seq " << seq << (choice.stream ? " streaming" : " cached") << " "
             << (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()) << " us");
    };
    if (!async && queue_.empty() && !busy_) {
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
    cv_.notify_all();
  } else {
    cv_.notify_all();
  }
  if (!async) task.work->wait(-1.0);
  return task.work;
}

void Communicator::run_task(Task& t) {
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
    t.fn();
    t.work->complete();
  } catch (const HeaderMismatch&) {
    t.work->fail(std::current_exception());
  } catch (...) {
    std::exception_ptr e = std::current_exception();
    std::string msg;
    ErrorCode kind = error_code_of(e, &msg);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (broken_.empty()) broken_ = msg;
    }
    // Tell the peers: their waits raise with our reason instead of timing out.
    transport_.abort(abort_kind_of(kind), msg);
    t.work->fail(e);
  }
}

void Communicator::progress_loop() {
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

void Communicator::exchange_headers(uint64_t seq, Coll coll, const CollHeader& mine) {
  rc::exchange_headers(transport_, rank_, world_, seq, coll, mine);
}

void Communicator::reject(Coll coll) {
  (void)coll;
  try {
    submit(Coll::kRejected, CollHeader{}, [](uint64_t) {}, false);
  } catch (const Mismatch&) {
    // Expected: every rank (this one included) raises for the rejected call.
  }
}

// The context of one collective's algorithm, on the executing thread (stream_now_ was set by
// the task for this collective; scratch_ is that thread's).
AlgoCtx Communicator::algo_ctx(uint64_t seq, const char* op, DType dt) {
  AlgoCtx c;
  c.t = &transport_;
  c.rank = rank_;
  c.world = world_;
  c.seq = seq;
  c.op = op;
  c.dtype = dt;
  c.esize = dtype_size(dt);
  c.stream = stream_now_;
  c.scratch = scratch_.data();
  return c;
}

// Local checks run before the header exchange. A rank whose arguments fail them still joins the
// exchange (as a rejection) so that its peers raise too instead of waiting for it.
#define RC_LOCAL_CHECKS(coll, body)  \
  do {                               \
    try {                            \
      body;                          \
    } catch (const Error&) {         \
      if (!closed_.load()) reject(coll); \
      throw;                         \
    }                                \
  } while (0)

void Communicator::check_root(int root, Coll coll) {
  RC_CHECK(root >= 0 && root < world_, InvalidArgument,
           "ringcomm: " << coll_name(coll) << ": root " << root << " is out of range [0, " << world_ << ")");
}

void Communicator::check_ptr(const void* p, int64_t count, const char* what, Coll coll) {
  RC_CHECK(count >= 0, InvalidArgument, "ringcomm: " << coll_name(coll) << ": negative element count " << count);
  RC_CHECK(count == 0 || p != nullptr, InvalidArgument,
           "ringcomm: " << coll_name(coll) << ": " << what << " buffer is null");
}

WorkPtr Communicator::all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kAllReduce, {
    check_ptr(in, count, "input", Coll::kAllReduce);
    check_ptr(out, count, "output", Coll::kAllReduce);
    check_reduce_supported(dt, op);
  });
  const int64_t bytes = count * static_cast<int64_t>(dtype_size(dt));
  const bool direct = algo_ == Algo::kDirect ||
                      (algo_ == Algo::kAuto && bytes * (world_ - 1) <= direct_max_bytes_);
  // count2 carries the algorithm so that ranks configured differently raise MismatchError.
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), -1, count, direct ? 1 : 0};
  return submit(Coll::kAllReduce, h, [=](uint64_t seq) {
    AlgoCtx c = algo_ctx(seq, "all_reduce", dt);
    if (direct) {
      direct_all_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op);
    } else {
      ring_all_reduce(c, static_cast<const char*>(in), static_cast<char*>(out), count, op);
    }
  }, async);
}

WorkPtr Communicator::reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kReduceScatter, {
    check_ptr(in, in_count, "input", Coll::kReduceScatter);
    check_ptr(out, in_count / world_ + (rank_ < in_count % world_ ? 1 : 0), "output", Coll::kReduceScatter);
    check_reduce_supported(dt, op);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), -1, in_count, 0};
  return submit(Coll::kReduceScatter, h, [=](uint64_t seq) {
    ring_reduce_scatter(algo_ctx(seq, "reduce_scatter", dt),
                        static_cast<const char*>(in), static_cast<char*>(out), in_count, op);
  }, async);
}

WorkPtr Communicator::all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt,
                                 bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kAllGather, {
    check_ptr(in, in_count, "input", Coll::kAllGather);
    check_ptr(out, out_count, "output", Coll::kAllGather);
    RC_CHECK(in_count <= out_count, InvalidArgument,
             "ringcomm: all_gather: input has " << in_count << " elements but the output only " << out_count);
    dtype_size(dt);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, -1, out_count, in_count};
  // Every rank's contribution size is known only from the headers: gather them in the body.
  return submit(Coll::kAllGather, h, [=](uint64_t seq) {
    std::vector<int64_t> counts(world_, 0);
    if (world_ == 1) {
      counts[0] = in_count;
    } else {
      const uint32_t bs = board_seq_of(seq);
      WaitCtx w;
      w.op = "all_gather";
      w.seq = seq;
      for (int p = 0; p < world_; ++p) counts[p] = (p == rank_) ? in_count : transport_.wait_header(p, bs, w).count2;
    }
    ring_all_gather(algo_ctx(seq, "all_gather", dt), static_cast<const char*>(in),
                    static_cast<char*>(out), counts);
  }, async);
}

WorkPtr Communicator::broadcast(void* buf, int64_t count, DType dt, int root, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kBroadcast, {
    check_ptr(buf, count, "", Coll::kBroadcast);
    check_root(root, Coll::kBroadcast);
    dtype_size(dt);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return submit(Coll::kBroadcast, h, [=](uint64_t seq) {
    chain_broadcast(algo_ctx(seq, "broadcast", dt), static_cast<char*>(buf), count, root);
  }, async);
}

WorkPtr Communicator::reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kReduce, {
    check_ptr(in, count, "input", Coll::kReduce);
    check_root(root, Coll::kReduce);
    if (rank_ == root) check_ptr(out, count, "output", Coll::kReduce);
    check_reduce_supported(dt, op);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), static_cast<uint32_t>(op), root, count, 0};
  return submit(Coll::kReduce, h, [=](uint64_t seq) {
    chain_reduce(algo_ctx(seq, "reduce", dt), static_cast<const char*>(in),
                 static_cast<char*>(out), count, op, root);
  }, async);
}

WorkPtr Communicator::barrier(bool async) {
  // The header exchange is itself a barrier: nobody leaves it before every rank has arrived.
  return submit(Coll::kBarrier, CollHeader{}, [](uint64_t) {}, async);
}

WorkPtr Communicator::all_to_all(const void* in, void* out, std::vector<int64_t> send_counts,
                                 std::vector<int64_t> recv_counts, DType dt, bool async) {
  check_usable();
  int64_t in_total = 0, out_total = 0;
  RC_LOCAL_CHECKS(Coll::kAllToAll, {
    RC_CHECK(static_cast<int>(send_counts.size()) == world_ && static_cast<int>(recv_counts.size()) == world_,
             InvalidArgument, "ringcomm: all_to_all: split lists need " << world_ << " entries, got "
                                                                         << send_counts.size() << " and " << recv_counts.size());
    for (int p = 0; p < world_; ++p) {
      RC_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0, InvalidArgument, "ringcomm: all_to_all: negative split size");
      in_total += send_counts[p];
      out_total += recv_counts[p];
    }
    check_ptr(in, in_total, "input", Coll::kAllToAll);
    check_ptr(out, out_total, "output", Coll::kAllToAll);
    dtype_size(dt);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, -1, in_total, out_total};
  return submit(Coll::kAllToAll, h, [=](uint64_t seq) {
    std::vector<int64_t> soff(world_, 0), roff(world_, 0);
    for (int p = 1; p < world_; ++p) {
      soff[p] = soff[p - 1] + send_counts[p - 1];
      roff[p] = roff[p - 1] + recv_counts[p - 1];
    }
    direct_all_to_all(algo_ctx(seq, "all_to_all", dt), static_cast<const char*>(in),
                      static_cast<char*>(out), send_counts, soff, recv_counts, roff);
  }, async);
}

WorkPtr Communicator::gather(const void* in, void* out, int64_t count, DType dt, int root, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kGather, {
    check_ptr(in, count, "input", Coll::kGather);
    check_root(root, Coll::kGather);
    if (rank_ == root) check_ptr(out, count * world_, "output", Coll::kGather);
    dtype_size(dt);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return submit(Coll::kGather, h, [=](uint64_t seq) {
    direct_gather(algo_ctx(seq, "gather", dt), static_cast<const char*>(in),
                  static_cast<char*>(out), count, root);
  }, async);
}

WorkPtr Communicator::scatter(const void* in, void* out, int64_t count, DType dt, int root, bool async) {
  check_usable();
  RC_LOCAL_CHECKS(Coll::kScatter, {
    check_ptr(out, count, "output", Coll::kScatter);
    check_root(root, Coll::kScatter);
    if (rank_ == root) check_ptr(in, count * world_, "input", Coll::kScatter);
    dtype_size(dt);
  });
  CollHeader h{0, static_cast<uint32_t>(dt), 0, root, count, 0};
  return submit(Coll::kScatter, h, [=](uint64_t seq) {
    direct_scatter(algo_ctx(seq, "scatter", dt), static_cast<const char*>(in),
                   static_cast<char*>(out), count, root);
  }, async);
}

// ---------------- point-to-point ----------------

WorkPtr Communicator::send(const void* buf, int64_t bytes, int dst, uint64_t tag, bool async) {
  return submit_p2p(true, const_cast<char*>(static_cast<const char*>(buf)), bytes, dst, tag, async);
}

WorkPtr Communicator::recv(void* buf, int64_t bytes, int src, uint64_t tag, bool async) {
  return submit_p2p(false, static_cast<char*>(buf), bytes, src, tag, async);
}

WorkPtr Communicator::submit_p2p(bool is_send, char* buf, int64_t bytes, int peer, uint64_t tag, bool async) {
  check_usable();
  const char* name = is_send ? "send" : "recv";
  RC_CHECK(peer >= 0 && peer < world_ && peer != rank_, InvalidArgument,
           "ringcomm: " << name << ": peer " << peer << " is not another rank of this communicator (rank " << rank_
                        << ", world size " << world_ << ")");
  RC_CHECK(bytes >= 0 && (bytes == 0 || buf != nullptr), InvalidArgument, "ringcomm: " << name << ": bad buffer");
  P2POp op;
  op.is_send = is_send;
  op.peer = peer;
  op.buf = buf;
  op.bytes = static_cast<uint64_t>(bytes);
  op.tag = tag;
  op.deadline_ns = now_ns() + static_cast<int64_t>(transport_.config().timeout_s * 1e9);
  op.work = std::make_shared<Work>(name, 0);
  WorkPtr w = op.work;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_new_.push_back(std::move(op));
  }
  p2p_cv_.notify_all();
  transport_.ring_doorbell(rank_);  // wake our p2p thread if it sleeps on the doorbell
  if (!async) w->wait(-1.0);
  return w;
}

// Moves as many pieces as the channel allows right now; true if anything moved.
bool Communicator::p2p_advance(P2POp& op) {
  const size_t slot = transport_.config().slot_bytes;
  bool moved = false;
  while (!op.started || op.done < op.bytes) {
    if (op.is_send) {
      char* dst = transport_.try_send_slot(op.peer, Lane::kP2P, op.buf + op.done);
      if (dst == nullptr) return moved;
      uint64_t n = std::min<uint64_t>(slot, op.bytes - op.done);
      if (n > 0) std::memcpy(dst, op.buf + op.done, n);
      transport_.send_post(op.peer, Lane::kP2P, n, op.bytes, op.tag);
      op.done += n;
    } else {
      const SlotMeta* m = nullptr;
      const char* src = transport_.try_recv_slot(op.peer, Lane::kP2P, &m);
      if (src == nullptr) return moved;
      if (!op.started && m->total != op.bytes) {
        RC_THROW(Mismatch, "ringcomm: recv on rank " << rank_ << " from rank " << op.peer << ": the matching send has "
                                                     << m->total << " bytes but the receive buffer has " << op.bytes);
      }
      RC_CHECK(op.done + m->bytes <= op.bytes, Error, "ringcomm: recv: message overruns the buffer");
      if (m->bytes > 0) std::memcpy(op.buf + op.done, src, m->bytes);
      op.done += m->bytes;
      transport_.recv_done(op.peer, Lane::kP2P);
    }
    op.started = true;
    moved = true;
  }
  return moved;
}

void Communicator::p2p_loop() {
  std::vector<std::deque<P2POp>> sendq(world_), recvq(world_);
  size_t pending = 0;
  int64_t idle_since = 0, next_liveness = 0;
  auto fail_all = [&](std::exception_ptr e) {
    for (auto* qs : {&sendq, &recvq})
      for (auto& q : *qs) {
        for (auto& op : q) op.work->fail(e);
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
        fail_all(std::make_exception_ptr(
            Closed("ringcomm: the communicator was closed while this send/recv was pending")));
        return;
      }
    }
    const uint32_t bell = transport_.doorbell_value();
    bool progressed = false;
    for (auto* qs : {&sendq, &recvq}) {
      for (auto& q : *qs) {
        while (!q.empty()) {
          P2POp& op = q.front();
          try {
            progressed |= p2p_advance(op);
          } catch (...) {
            std::exception_ptr e = std::current_exception();
            std::string msg;
            ErrorCode kind = error_code_of(e, &msg);
            {
              std::lock_guard<std::mutex> lk(mu_);
              if (broken_.empty()) broken_ = msg;
            }
            transport_.abort(abort_kind_of(kind), msg);
            fail_all(e);
            break;
          }
          if (op.started && op.done == op.bytes) {
            op.work->complete();
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
    if (now - idle_since < transport_.config().spin_ns) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      continue;
    }
    // Idle: check deadlines and peers, then sleep until the doorbell rings (or a slice passes).
    try {
      for (auto* qs : {&sendq, &recvq})
        for (auto& q : *qs)
          if (!q.empty() && now > q.front().deadline_ns) {
            const P2POp& op = q.front();
            RC_THROW(TimeoutError, "ringcomm: " << (op.is_send ? "send to" : "recv from") << " rank " << op.peer
                                                << " on rank " << rank_ << " timed out after "
                                                << transport_.config().timeout_s << " s (" << op.done << " of "
                                                << op.bytes << " bytes moved)");
          }
      WaitCtx w;
      w.op = "send/recv";
      const bool live = now >= next_liveness;
      if (live) next_liveness = now + transport_.config().liveness_ns;
      transport_.check_peers(w, live);
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      std::string msg;
      error_code_of(e, &msg);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (broken_.empty()) broken_ = msg;
      }
      fail_all(e);
      continue;
    }
    transport_.doorbell_wait(bell, std::min<int64_t>(transport_.config().liveness_ns, 20'000'000));
  }
}

// ---------------- shutdown ----------------

void Communicator::close() {
  if (closed_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_stopping_ = true;
  }
  p2p_cv_.notify_all();
  if (connected_) transport_.ring_doorbell(rank_);
  if (p2p_thread_.joinable()) p2p_thread_.join();
  transport_.close();
}

}  // namespace rc
