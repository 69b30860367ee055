#include "comm/core.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>

#include "comm/header_exchange.h"
#include "common/caller_wait.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#ifdef RINGCOMM_TEST_HOOKS
#include "comm/test_hooks.h"
#endif

namespace rc {

// Every live core of this process, for the fork handlers. The one process-wide state of the
// core: fork() copies every communicator at once, so only a process-wide list can mark them.
// Allocated once and never destroyed (handlers and destructors may run during exit).
struct ForkRegistry {
  std::mutex mu;
  std::vector<CommCore*> cores;

  static ForkRegistry& get() {
    static ForkRegistry* r = [] {
      auto* reg = new ForkRegistry;
      pthread_atfork(&prepare, &parent, &child);
      return reg;
    }();
    return *r;
  }
  // prepare: hold the registry's and every core's mutexes across fork(), so that no lock the
  // child inherits is held by a thread that does not exist there. Order: registry, core, p2p
  // (no code path takes them in another order).
  static void prepare() {
    ForkRegistry& r = get();
    r.mu.lock();
    for (CommCore* c : r.cores) {
      c->mu_.lock();
      c->p2p_.lock_for_fork();
    }
  }
  static void parent() {
    ForkRegistry& r = get();
    for (CommCore* c : r.cores) {
      c->p2p_.unlock_after_fork();
      c->mu_.unlock();
    }
    r.mu.unlock();
  }
  static void child() {
    ForkRegistry& r = get();
    const int pid = static_cast<int>(getpid());
    for (CommCore* c : r.cores) {
      c->p2p_.unlock_after_fork();
      c->mu_.unlock();
      c->mark_forked(pid);
    }
    r.mu.unlock();
  }
};

CommCore::CommCore(int rank, int world, std::unique_ptr<CommDevice> dev, const Knobs& knobs)
    : rank_(rank), world_(world), dev_(std::move(dev)), checks_(rank, world, dev_->memory()),
      knobs_(SelectionKnobs::from_knobs(knobs)), caps_(dev_->caps()),
      p2p_(rank, world, dev_.get(), knobs.p2p_eager_bytes, [this](const std::exception_ptr& e) { mark_broken(e); }) {
  const int64_t keep = knobs.trace;
  RC_CHECK(keep >= 0 && keep <= (int64_t{1} << 20), InvalidArgument,
           "ringcomm: RINGCOMM_TRACE=" << keep << " must be 0 (off) or the number of calls to keep, at most 1048576");
  tracer_.configure(keep);
  ForkRegistry& r = ForkRegistry::get();
  std::lock_guard<std::mutex> lk(r.mu);
  r.cores.push_back(this);
}

CommCore::~CommCore() {
  try {
    close();
  } catch (...) {
  }
#ifdef RINGCOMM_TEST_HOOKS
  test_hooks::forget(this);
#endif
  ForkRegistry& r = ForkRegistry::get();
  std::lock_guard<std::mutex> lk(r.mu);
  r.cores.erase(std::remove(r.cores.begin(), r.cores.end(), this), r.cores.end());
}

void CommCore::mark_forked(int pid) {
  // The child is single-threaded here (inside fork()): the core's threads are the parent's.
  forked_pid_.store(pid);
  stopping_ = true;
  queue_.clear();
  busy_ = false;
  calls_ = 0;
  if (progress_.joinable()) new std::thread(std::move(progress_));  // never joined nor destroyed (see p2p)
  p2p_.forget_after_fork();
}

std::string CommCore::closed_reason() const {
  const int pid = forked_pid_.load();
  if (pid == 0) return {};
  return "ringcomm: the " + std::string(dev_->name()) + " (rank " + std::to_string(rank_) +
         ") was created before fork() and is used in a forked child (pid " + std::to_string(pid) +
         "); create a new communicator in the child";
}

void CommCore::start() {
  RC_CHECK(!connected_, Error, "ringcomm: the " << dev_->name() << " is already connected");
  connected_ = true;
  caps_ = dev_->caps();  // connecting settled what needs the peers (single-copy reads); no call ran yet
  if (knobs_.stream == SelectionKnobs::Stream::kAdapt && caps_.streaming_stores && world_ > 1 && !dev_->may_fuse()) {
    StoreAdapt::Params p;
    p.min_bytes = knobs_.stream_adapt_min_bytes;
    adapt_ = std::make_unique<StoreAdapt>(p);
  }
  progress_ = std::thread([this] { progress_loop(); });
  p2p_.start();
}

uint64_t CommCore::next_seq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seq_ + 1;
}

CommCore::Call::Call(CommCore* c) : c_(c) {
  if (c->forked_pid_.load() != 0) throw Closed(c->closed_reason());
  std::lock_guard<std::mutex> lk(c->mu_);
  if (c->stopping_)
    RC_THROW(Closed, "ringcomm: the " << c->dev_->name() << " (rank " << c->rank_ << ") is closed");
  ++c->calls_;
}

CommCore::Call::~Call() {
  std::lock_guard<std::mutex> lk(c_->mu_);
  // Only close() waits for calls_ to reach 0 (draining_ set, under mu_, before it checks): a
  // notify otherwise would wake the progress thread for nothing on every call.
  if (--c_->calls_ == 0 && c_->draining_) c_->cv_.notify_all();
}

void CommCore::check_usable() const {
  if (forked_pid_.load() != 0) throw Closed(closed_reason());
  if (closed_.load()) RC_THROW(Closed, "ringcomm: the " << dev_->name() << " (rank " << rank_ << ") is closed");
  RC_CHECK(connected_, Error, "ringcomm: the " << dev_->name() << " is not connected (call connect())");
  if (!broken_flag_.load(std::memory_order_acquire)) return;
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
    broken_flag_.store(true, std::memory_order_release);
    first_error_ = e;
  }
  // Tell the peers: their waits raise with our reason instead of timing out.
  dev_->abort(abort_kind_of(kind), msg);
}

void CommCore::abort(const std::string& reason) {
  if (forked_pid_.load() != 0) return;
  std::unique_ptr<Call> call;
  try {
    call = std::make_unique<Call>(this);  // close() keeps the mappings until this returns
  } catch (const Closed&) {
    return;  // closed: nothing left to abort
  }
  const std::string msg = "the " + std::string(dev_->name()) + " on rank " + std::to_string(rank_) +
                          " was aborted (abort()): " + (reason.empty() ? std::string("no reason given") : reason);
  std::deque<Task> dropped;
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken_.empty()) {
      broken_ = msg;
      broken_flag_.store(true, std::memory_order_release);
      first_error_ = std::make_exception_ptr(Error("ringcomm: " + msg));
      first = true;
    }
    dropped.swap(queue_);
  }
  cv_.notify_all();
  if (dev_->has_control()) {
    dev_->control().set_aborting(msg);  // our waits, on every thread, raise
    if (first) dev_->abort(abort_kind_of(ErrorCode::kError), "ringcomm: " + msg);  // the peers' waits raise
    dev_->control().ring_doorbell(rank_);  // the p2p thread fails what is pending
  }
  for (Task& t : dropped) {
    t.work->fail(std::make_exception_ptr(Error("ringcomm: " + t.work->op() + " (seq " + std::to_string(t.work->seq()) +
                                               ") on rank " + std::to_string(rank_) + " did not run: " + msg)));
  }
}

std::exception_ptr CommCore::errored() const {
  std::lock_guard<std::mutex> lk(mu_);
  return first_error_;
}

// ---------------- submission and execution ----------------

WorkPtr CommCore::submit(Coll coll, CollHeader hdr, CollArgs args, Launch l, int64_t entry_ns) {
  check_usable();
  if (tracer_.on() && entry_ns == 0) entry_ns = now_ns();
  hdr.coll = static_cast<uint32_t>(coll);
  const Selection sel = select(coll, selection_bytes(coll, hdr), world_, knobs_, caps_);
  hdr.algo = static_cast<uint8_t>(sel.algo);
  hdr.proto = static_cast<uint8_t>(sel.proto);
  hdr.store = static_cast<uint8_t>(sel.store);
  if (coll == Coll::kAllToAll && sel.proto == Proto::kCMA &&
      cma_blocks_qualify(args.send_counts, args.recv_counts, dtype_size(static_cast<DType>(hdr.dtype)), knobs_))
    hdr.flags |= kHeaderCmaBlocks;
  const Route& route = route_of(coll, sel.algo, sel.proto);
  if (coll != Coll::kRejected) dev_->check_submit(coll, hdr, args, l.stream);
  Task task;
  WorkPtr work;  // task.work, which moves with a queued task
  bool inline_run = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // close() sets stopping_ before it fails the queue: a task is either queued before that (and
    // failed by close) or refused here, never queued after the progress thread left.
    if (stopping_)
      RC_THROW(Closed, "ringcomm: " << coll_name(coll) << " on rank " << rank_ << ": the " << dev_->name()
                                    << " is closed");
    const uint64_t seq = ++seq_;
#ifdef RINGCOMM_TEST_HOOKS
    if (coll != Coll::kRejected) test_hooks::apply_next_header(this, hdr);
#endif
    hdr.seq = static_cast<uint32_t>(seq);
    task.work = std::make_shared<Work>(coll_name(coll), seq);
    task.seq = seq;
    task.coll = coll;
    task.hdr = hdr;
    task.route = &route;
    task.args = std::move(args);
    task.l = l;
    task.entry_ns = entry_ns;
    if (!l.async && queue_.empty() && !busy_) {
      busy_ = true;  // we execute it on this thread; the progress thread waits for busy_ to clear
      inline_run = true;
    } else {
      work = task.work;
      queue_.push_back(std::move(task));
    }
  }
  bool wake = true;  // queued: the progress thread runs it
  if (inline_run) {
    {
      CallerWaitScope caller;  // this thread's caller is blocked on the call (the waits' `auto`)
      run_task(task);
    }
    work = std::move(task.work);
    std::lock_guard<std::mutex> lk(mu_);
    busy_ = false;
    // Clearing busy_ matters to the progress thread only when work is queued (or it is told to
    // stop), and to close() only while it drains; both read it under mu_, so a later change of
    // either notifies by itself. Otherwise a notify is a futex wake and a pointless wake-up of
    // the progress thread on every synchronous call.
    wake = !queue_.empty() || stopping_ || draining_;
  }
  if (wake) cv_.notify_all();
  if (!l.async) work->wait_host(-1.0);
  return work;
}

void CommCore::drain_in_slot(const std::vector<CollHeader>& all, uint64_t seq, Coll coll) {
  Channel* ch = nullptr;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || !slot_before_header_for(all[p], p, rank_, world_)) continue;
    if (ch == nullptr) ch = dev_->header_slot_channel();
    RC_CHECK(ch != nullptr, Error, "ringcomm: " << coll_name(coll) << " (seq " << seq << ") on rank " << rank_
                                   << ": rank " << p << " handed off its first piece with its header, but the "
                                   << dev_->name() << " has no channel for it");
    WaitCtx w;
    w.op = coll_name(coll);
    w.seq = seq;
    const SlotMeta* meta = nullptr;
    ch->recv_slot(p, w, PiecePlace{}, &meta);
    if (meta->tag != seq) {
      RC_THROW(Error, "ringcomm: " << coll_name(coll) << " (seq " << seq << ") on rank " << rank_
                      << ": the slot rank " << p << " handed off with its header is tagged seq " << meta->tag
                      << " (the ranks' slot streams diverged)");
    }
    ch->recv_done(p);
  }
}

void CommCore::execute(Task& t) {
  const uint64_t seq = t.seq;
  const Coll coll = t.coll;
  // RINGCOMM_STREAM=adapt: this call's store and this rank's vote go into its header before
  // anything of the call moves (a header_in_slot piece goes before the header). It decides only
  // the calls it finds eligible, alike on every rank (header fields the exchange checks); on the
  // others no rank's vote counts and its state does not change, so they leave it out. An
  // all_to_all's sizes differ per rank and its header goes first: its vote goes into its header,
  // and its eligibility and store are decided after the exchange from every rank's header, alike
  // on every rank; the header's store stays the selection's, the body runs under the picked one.
  int64_t adapt_bytes =
      adapt_ != nullptr && coll != Coll::kRejected && coll != Coll::kBarrier ? selection_bytes(coll, t.hdr) : 0;
  const Proto proto = static_cast<Proto>(t.hdr.proto);
  bool adapting = adapt_bytes > 0 && adapt_->eligible(adapt_bytes, proto);
  const bool adapt_after_exchange =
      adapt_ != nullptr && coll == Coll::kAllToAll && (proto == Proto::kSimple || proto == Proto::kCMA);
  if (adapting) {
    t.hdr.store = static_cast<uint8_t>(adapt_->pick(adapt_bytes));
    t.hdr.flags |= adapt_->vote();
  } else if (adapt_after_exchange) {
    t.hdr.flags |= adapt_->vote();
  }
  Store run_store = static_cast<Store>(t.hdr.store);
  // The call's time for the policy: its first piece's copy (where one goes before the header) and
  // everything after the headers are in, but not the wait for them, which a late peer lengthens.
  int64_t adapt_ns = 0, adapt_t0 = 0;
  auto agreed = [&] {
    if (adapt_after_exchange) {
      // Under the cma protocol the call moves through slots unless every rank's blocks qualify.
      const bool through_slots = proto == Proto::kSimple || !cma_all_to_all_agreed(headers_);
      adapt_bytes = through_slots ? largest_input_bytes(headers_) : 0;
      adapting = adapt_bytes > 0 && adapt_->eligible(adapt_bytes, Proto::kSimple);
      if (adapting) {
        run_store = adapt_->pick(adapt_bytes);
        dev_->set_store(run_store);
      }
    }
    if (!adapting) return;
    adapt_->agree(headers_);
    adapt_t0 = now_ns();
  };
  const CollHeader& hdr = t.hdr;
  const Launch& l = t.l;
  TraceRecord* tr = tracer_.on() ? tracer_.begin(t.entry_ns) : nullptr;
  TraceCommit trace_guard(tracer_, tr);
  if (tr) trace_begin(*tr, seq, coll, hdr);
  // The hooks and the bodies below are named locals: the FunctionRefs that reach them do not own.
  // exchange_headers fills headers_ (kept between calls); the bodies read it as `headers`.
  const std::vector<CollHeader>& headers = headers_;
  HeaderHooks hooks;
  auto drain = [&](const std::vector<CollHeader>& all) { drain_in_slot(all, seq, coll); };
  hooks.on_mismatch = drain;
  AlgoCtx c;
  c.trace = tr;
  c.rank = rank_;
  c.world = world_;
  c.seq = seq;
  c.op = coll_name(coll);
  c.dtype = static_cast<DType>(hdr.dtype);
  c.esize = dtype_size(c.dtype);
  std::shared_ptr<DeviceFence> fence;
  const Route& route = *t.route;
  // A fused call is decided from this rank's own call and exchanges nothing: a local note for a
  // peer that would wait for our header (transport/shm_board.h), then the device's launch.
  if (world_ > 1 && coll != Coll::kRejected && dev_->fused(coll, hdr, t.args)) {
    dev_->control().mark_fused(seq);
    fence = dev_->run_fused(coll, hdr, t.args, l.stream, seq);
    trace_guard.done();
    t.work->complete(fence);
    return;
  }
  // The board numbers the exchanges: the calls themselves where no call is ever fused (then the
  // LL outboxes, numbered by call, pair with the board entries), else the exchanges only.
  ExchangeSeq xs;
  xs.watch_fused = dev_->may_fuse();
  xs.board_seq = xs.watch_fused ? ++exchanges_ : seq;
  // What goes before the header is decided from the header this rank posts (forged or not),
  // exactly as its peers decide from that header whether to drain a slot from it.
  if (world_ > 1 && route.first != nullptr && sent_before_header(hdr, rank_, world_)) {
    // Header phases collapse (comm/trace.h): header_posted is stamped just before the first
    // store a peer can read this header from, and first_slot equals header_seen (the first
    // piece travelled with the header). A header-in-slot piece does not carry the header (the
    // board store after it does: stamp once the piece is in every peer's slot); the LL outbox's
    // line 0 does (stamp before writing it).
    const bool header_in_first = !slot_before_header(hdr, rank_, world_);
    auto body = [&](const AlgoCtx& cc) {
      auto first = [&] {
        AlgoCtx quiet = cc;
        quiet.trace = nullptr;
        if (tr && header_in_first) tr->mark(kTraceHeaderPosted);
        const int64_t f0 = adapting ? now_ns() : 0;
        route.first(quiet, t.args, hdr);
        if (adapting) adapt_ns += now_ns() - f0;
        if (tr && !header_in_first) tr->mark(kTraceHeaderPosted);
      };
      hooks.before_post = first;
      exchange_headers(dev_->control(), rank_, world_, seq, coll, hdr, headers_, hooks, xs);
      agreed();
      // A peer whose wait for our header ran out has raised and posted its abort, but its
      // header and piece 0 are here, so none of our waits would block (and see it): ask once.
      WaitCtx w;
      w.op = coll_name(coll);
      w.seq = seq;
      dev_->control().check_peers(w, false);
      if (tr) {
        CollHeader ran = headers[rank_];
        ran.store = static_cast<uint8_t>(run_store);
        trace_headers_seen(*tr, coll, ran);
        tr->t[kTraceFirstSlot] = tr->t[kTraceHeaderSeen];
      }
      route.body(cc, t.args, headers);
      // A root whose whole broadcast went with the header moved no slot after it.
      if (tr && tr->t[kTraceLastSlot] == 0) tr->t[kTraceLastSlot] = tr->t[kTraceFirstSlot];
    };
    fence = dev_->execute(coll, hdr, l.stream, c, body);
  } else {
    exchange_headers(dev_->control(), rank_, world_, seq, coll, hdr, headers_, hooks, xs);
    agreed();
    CollHeader run = hdr;
    run.store = static_cast<uint8_t>(run_store);
    if (tr) trace_headers_seen(*tr, coll, run);
    auto body = [&](const AlgoCtx& cc) { route.body(cc, t.args, headers); };
    fence = dev_->execute(coll, run, l.stream, c, body);
  }
  if (adapting) {
    const Store used = run_store;
    int64_t ns = adapt_ns + (now_ns() - adapt_t0);
#ifdef RINGCOMM_TEST_HOOKS
    ns = test_hooks::store_cost_ns(used == Store::kStreaming, adapt_bytes, ns);
#endif
    adapt_->observe(adapt_bytes, used, ns);
  }
  trace_guard.done();  // exit is stamped before the Work completes, so a waiter sees the record
  t.work->complete(fence);
}

void CommCore::run_task(Task& t) {
  if (broken_flag_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) {
      std::string msg = "ringcomm: " + t.work->op() + " (seq " + std::to_string(t.work->seq()) +
                        ") on rank " + std::to_string(rank_) + " not run: the communicator failed earlier: " + broken_;
      t.work->fail(std::make_exception_ptr(Error(msg)));
      return;
    }
  }
  try {
    execute(t);  // completes the work (with the device's fence)
  } catch (const HeaderMismatch&) {
    t.work->fail(std::current_exception());
  } catch (const Closed&) {
    // Our own close() interrupted the wait: the peers see this rank closed (its state word),
    // not aborted.
    if (!closed_.load()) mark_broken(std::current_exception());
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
    {
      // A synchronous call queued behind async work: its caller is blocked on it all the same.
      CallerWaitScope caller(!t.l.async);
      run_task(t);
    }
    lk.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void CommCore::reject() {
  Call call(this);
  reject_now();
}

void CommCore::reject_now() {
  try {
    submit(Coll::kRejected, CollHeader{}, CollArgs{}, Launch{});
  } catch (const Mismatch&) {
    // Expected: every rank (this one included) raises for the rejected call.
  }
}

template <class Check>
WorkPtr CommCore::collective(Coll coll, const Check& check, CollArgs args, Launch l) {
  const int64_t entry_ns = tracer_.on() ? now_ns() : 0;
  Call call(this);
  check_usable();
  CollHeader h;
  try {
    h = check();
  } catch (const Error&) {
    if (!closed_.load()) reject_now();
    throw;
  }
  return submit(coll, h, std::move(args), l, entry_ns);
}

// ---------------- collectives ----------------

WorkPtr CommCore::all_reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.op = op;
  return collective(Coll::kAllReduce, [&] { return checks_.all_reduce(in, out, count, dt, op); }, std::move(a), l);
}

WorkPtr CommCore::reduce_scatter(const void* in, void* out, int64_t in_count, DType dt, ReduceOp op, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = in_count;
  a.op = op;
  return collective(Coll::kReduceScatter, [&] { return checks_.reduce_scatter(in, out, in_count, dt, op); },
                    std::move(a), l);
}

WorkPtr CommCore::all_gather(const void* in, void* out, int64_t in_count, int64_t out_count, DType dt, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = in_count;
  a.out_count = out_count;
  return collective(Coll::kAllGather, [&] { return checks_.all_gather(in, out, in_count, out_count, dt); },
                    std::move(a), l);
}

WorkPtr CommCore::broadcast(void* buf, int64_t count, DType dt, int root, Launch l) {
  CollArgs a;
  a.in = buf;
  a.out = buf;
  a.count = count;
  a.root = root;
  return collective(Coll::kBroadcast, [&] { return checks_.broadcast(buf, count, dt, root); }, std::move(a), l);
}

WorkPtr CommCore::reduce(const void* in, void* out, int64_t count, DType dt, ReduceOp op, int root, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.op = op;
  a.root = root;
  return collective(Coll::kReduce, [&] { return checks_.reduce(in, out, count, dt, op, root); }, std::move(a), l);
}

WorkPtr CommCore::barrier(Launch l) {
  // The header exchange is itself a barrier: nobody leaves it before every rank has arrived.
  Call call(this);
  return submit(Coll::kBarrier, CollHeader{}, CollArgs{}, l);
}

WorkPtr CommCore::all_to_all(const void* in, void* out, std::vector<int64_t> send_counts,
                             std::vector<int64_t> recv_counts, DType dt, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.send_counts = send_counts;
  a.recv_counts = recv_counts;
  return collective(Coll::kAllToAll, [&] { return checks_.all_to_all(in, out, send_counts, recv_counts, dt); },
                    std::move(a), l);
}

WorkPtr CommCore::gather(const void* in, void* out, int64_t count, DType dt, int root, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.root = root;
  return collective(Coll::kGather, [&] { return checks_.gather(in, out, count, dt, root); }, std::move(a), l);
}

WorkPtr CommCore::scatter(const void* in, void* out, int64_t count, DType dt, int root, Launch l) {
  CollArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.root = root;
  return collective(Coll::kScatter, [&] { return checks_.scatter(in, out, count, dt, root); }, std::move(a), l);
}

// ---------------- point-to-point ----------------

WorkPtr CommCore::send(const void* buf, int64_t bytes, int dst, uint64_t tag, Launch l) {
  Call call(this);
  check_usable();
  checks_.p2p(buf, bytes, dst, true);
  WorkPtr w = p2p_.submit(true, const_cast<char*>(static_cast<const char*>(buf)), bytes, dst, tag, l.stream);
  if (!l.async) w->wait_host(-1.0);
  return w;
}

WorkPtr CommCore::recv(void* buf, int64_t bytes, int src, uint64_t tag, Launch l) {
  Call call(this);
  check_usable();
  checks_.p2p(buf, bytes, src, false);
  WorkPtr w = p2p_.submit(false, static_cast<char*>(buf), bytes, src, tag, l.stream);
  if (!l.async) w->wait_host(-1.0);
  return w;
}

// ---------------- shutdown ----------------

void CommCore::close() {
  if (closed_.exchange(true)) return;
  if (forked_pid_.load() != 0) {
    dev_->forget_after_fork();  // the parent's shared memory: drop our mappings, write nothing
    return;
  }
  // From here every transport wait of this process raises Closed within a liveness slice.
  if (dev_->has_control()) dev_->control().set_closing();
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;  // Call and submit() refuse from now on
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (Task& t : dropped) {
    t.work->fail(std::make_exception_ptr(Closed(
        "ringcomm: " + t.work->op() + " (seq " + std::to_string(t.work->seq()) + ") on rank " +
        std::to_string(rank_) + " did not run: the " + dev_->name() + " was closed while it was queued")));
  }
  if (progress_.joinable()) {
    if (progress_.get_id() == std::this_thread::get_id()) {
      progress_.detach();  // close() from the destructor of work run on that thread
    } else {
      progress_.join();
    }
  }
  p2p_.stop();
  bool drained;
  {
    // Calls still inside the core (a synchronous call running inline, a caller between its
    // check and its submit) leave promptly: their waits raise Closed.
    std::unique_lock<std::mutex> lk(mu_);
    draining_ = true;  // from now on the last call out, and busy_ clearing, notify
    const double wait_s = dev_->has_control() ? dev_->control().config().timeout_s : 0.0;
    const int64_t deadline = deadline_after(now_ns(), wait_s);
    drained = true;
    while (calls_ != 0 || busy_) {
      const int64_t left = deadline - now_ns();
      if (left <= 0) {
        drained = false;
        break;
      }
      cv_.wait_for(lk, std::chrono::nanoseconds(std::min<int64_t>(left, 100'000'000)));
    }
  }
  if (!drained) {
    // Never unmap under a thread that is still inside: keep the mappings (the process's memory
    // only; the segments were unlinked at attach).
    RC_LOG(kWarn, rank_, world_, "close(): calls still inside the " << dev_->name()
                                 << " after the timeout; its shared memory stays mapped");
    return;
  }
  bool broken;
  {
    std::lock_guard<std::mutex> lk(mu_);
    broken = !broken_.empty();
  }
  dev_->close(broken || !connected_);
}

}  // namespace rc
