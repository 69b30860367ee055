// ringcomm's torch c10d Backend trampoline: a c10d::Backend that a Python class can subclass.
// torch 2.13 binds c10d::Backend without a constructor or a trampoline, so this is the only C++
// ringcomm's torch backend needs; every method forwards to the Python override of the name given
// below and all behaviour lives in Python (src/ringcomm/torch/). A method the Python class does
// not define falls back to c10d::Backend's, which raises "not supported". The build copies this
// file into the package (ringcomm/_data/torch/), and ringcomm/torch/extension.py compiles it just
// in time against the installed torch: ringcomm._C never links torch.
//
// One exception, the latency-critical calls: the offer point (Trampoline::offer and the
// functions it serves, offer_all_reduce, offer_all_to_all, offer_gather, offer_scatter and
// offer_barrier). Every torch call on this backend that a synchronous entry may run comes through
// it once: dist.all_reduce, dist.broadcast, dist.reduce, dist.all_to_all_single (with or without
// split sizes), dist.gather, dist.scatter and dist.barrier (allreduce(), broadcast(), reduce(),
// alltoall_base(), gather(), scatter(), barrier()), ringcomm.torch.all_reduce_'s direct call
// (all_reduce_now()) and torch.ops.ringcomm.all_reduce_ (all_reduce_op()). It decides whether
// the call is one the entry has (synchronous, its tensors described as RcArrays, a reduce op of
// RC_TORCH_OPS, a root's list or split sizes the Python half accepts, the fast path on) and, if
// so, offers it to the host communicator's synchronous entry
// (csrc/comm/sync_entry.h, whose rule decides whether it takes it) through RcFastApi,
// ringcomm._C's C ABI, without the GIL or Python. Its answer (Offer) is the only word on what
// happened: a call not offered goes to the Python override as every other call (which may offer
// what it composes, an AVG say, to the entry through ringcomm's own API); a declined call goes
// to the Python override marked `offered`, whose allreduce, broadcast, reduce, alltoall_base,
// gather, scatter and barrier then take the communicator's general path (Communicator.general(): never offered again). The Python half
// turns the fast path on while nothing needs it (_set_fast_path: not coalescing, no issue hooks,
// not shut down). The codes, the torch ops offered, the dimension limit and the ABI come from
// ringcomm/abi.h (csrc/include, copied into the package beside this file's copy, and on the
// include path of this build).
//
// The same offer without torch's collective front: torch.ops.ringcomm.all_reduce_(tensor,
// group_name, op), a dispatcher op over one CPU tensor of a named group, for latency-bound callers
// that would otherwise pay dist.all_reduce's Python, the ProcessGroup's dispatch and a Work per
// call. It runs synchronously: through the offer point when the group's backend is this trampoline
// (what the entry does not run, the Python override runs, waited), else the group's allreduce, waited.
//
// Lifetime: torch holds the backend through an intrusive_ptr from C++ only, so the Python object
// is kept alive by ringcomm (hooks.live_groups) until shutdown(); the override is looked up on it.
// A Work returned by Python is wrapped in a WorkRef that owns a reference to the Python object, so
// the Python work lives as long as torch holds the C++ one, and every Work virtual torch or the
// user calls (wait, get_future, is_completed, ...) reaches the Python work.
#include <pybind11/chrono.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>
#include <structmember.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "offer_point.h"
#include "ringcomm/abi.h"

namespace {

// A Python Work, seen from C++. work_ is the C++ half of the Python object (torch's PyWork
// trampoline forwards wait and get_future to it); the other virtuals call the Python method.
class WorkRef : public c10d::Work {
 public:
  explicit WorkRef(py::object obj) : work_(obj.cast<WorkPtr>()), obj_(std::move(obj)) {}
  ~WorkRef() override {
    py::gil_scoped_acquire gil;  // the Python reference is released under the GIL
    obj_ = py::object();
  }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }
  bool isCompleted() override { return call<bool>("is_completed"); }
  bool isSuccess() const override { return call<bool>("is_success"); }
  int sourceRank() const override { return call<int>("source_rank"); }
  std::vector<at::Tensor> result() override { return call<std::vector<at::Tensor>>("result"); }
  void synchronize() override { call<void>("synchronize"); }
  float getDuration() const override { return call<float>("_get_duration"); }
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object e = obj_.attr("exception")();
    if (e.is_none()) return nullptr;
    return std::make_exception_ptr(std::runtime_error(py::str(e).cast<std::string>()));
  }

 private:
  template <typename R>
  R call(const char* name) const {
    py::gil_scoped_acquire gil;
    if constexpr (std::is_void_v<R>) {
      obj_.attr(name)();
    } else {
      return obj_.attr(name)().template cast<R>();
    }
  }
  WorkPtr work_;
  py::object obj_;
};

// The override is looked up with Trampoline's own type info: typeid(c10d::Backend) taken in this
// extension need not match torch's registration of it, and PYBIND11_OVERRIDE (which looks up the
// base class) would then never find the Python method.
#define RC_OVERRIDE(pyname, base_call, on_result, ...)                                         \
  do {                                                                                         \
    py::gil_scoped_acquire gil;                                                                \
    py::function fn = py::get_override(static_cast<const Trampoline*>(this), pyname);          \
    if (fn) {                                                                                  \
      py::object r = fn(__VA_ARGS__);                                                          \
      on_result;                                                                               \
    }                                                                                          \
  } while (0);                                                                                 \
  return base_call

// After shutdown() or abort() the Python half may be gone (nothing keeps it alive then): a call
// raises ringcomm.ClosedError here, as the Python half would, instead of reaching c10d::Backend.
#define RC_WORK(pyname, base, ...)                                                 \
  if (closed_.load(std::memory_order_acquire)) raise_closed(pyname);               \
  RC_OVERRIDE(pyname, c10d::Backend::base(__VA_ARGS__),                            \
              return c10::make_intrusive<WorkRef>(r), __VA_ARGS__)

// Every collective and point-to-point call counts once in the group's sequence number as it
// enters (gloo's rule: the calls issued on this backend, failed ones included), whichever path
// then runs it.
#define RC_COUNT() seq_.fetch_add(1, std::memory_order_relaxed)

// One tensor list and the options; an output and an input argument and the options.
#define RC_OP1(name, Opts)                                        \
  WorkPtr name(Tensors& t, const c10d::Opts& o) override {        \
    RC_COUNT();                                                   \
    RC_WORK(#name, name, t, o);                                   \
  }
#define RC_OP2(name, Out, In, Opts)                                      \
  WorkPtr name(Out& out, In& in, const c10d::Opts& o) override {         \
    RC_COUNT();                                                          \
    RC_WORK(#name, name, out, in, o);                                    \
  }

using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// A backend that moves nothing (allreduce: a completed Work at once, the tensor untouched): its
// dist.all_reduce is the floor every c10d backend pays. Registered only by ringcomm.torch.null_backend.
// Its front stamps (FrontStamps) bracket allreduce() as the ringcomm backend's do.
struct NullBackend : c10d::Backend {
  NullBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "ringcomm_null"; }
  WorkPtr allreduce(Tensors& t, const c10d::AllreduceOptions&) override {
    const int64_t t_in = front_.enter();
    WorkPtr w = c10::make_intrusive<FastDoneWork>(getRank(), c10d::OpType::ALLREDUCE, t.at(0));
    front_.leave(t_in);
    return w;
  }
  FrontStamps front_;
};

class Trampoline : public c10d::Backend {
 public:
  Trampoline(int rank, int size) : c10d::Backend(rank, size) {}

  // Constant, so that it answers after shutdown too (torch names the backend in its errors).
  const std::string getBackendName() const override { return "ringcomm"; }
  bool supportsCoalescing() const override { return true; }
  bool supportsShrinking() const override { return true; }  // Python: GroupCore.shrink
  bool supportsSplitting() const override { return true; }  // Python: GroupCore.split
  // The options torch copies for a split (Python: GroupCore._backend_options).
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    RC_OVERRIDE("_backend_options", c10d::Backend::getBackendOptions(),
                return r.cast<c10::intrusive_ptr<c10d::Backend::Options>>());
  }
  // ProcessGroup::splitGroup calls this on every rank that enters it; the Python half returns
  // the new backend of the ranks in `ranks`, or None on a rank outside them (torch then gives
  // that rank no group).
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    if (closed_.load(std::memory_order_acquire)) raise_closed("split");
    RC_OVERRIDE("split", c10d::Backend::split(store, ranks, opts),
                if (r.is_none()) return nullptr;
                return r.cast<c10::intrusive_ptr<c10d::Backend>>(), store, ranks, opts);
  }
  void eagerConnectSingleDevice(at::Device device) override {
    if (closed_.load(std::memory_order_acquire)) raise_closed("eager_connect_single_device");
    RC_OVERRIDE("eager_connect_single_device",
                c10d::Backend::eagerConnectSingleDevice(device), return, device);
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    RC_OVERRIDE("set_timeout", c10d::Backend::setTimeout(timeout), return, timeout);
  }
  void startCoalescing() override {
    RC_OVERRIDE("start_coalescing", c10d::Backend::startCoalescing(), return);
  }
  WorkPtr endCoalescing() override {
    RC_OVERRIDE("end_coalescing", c10d::Backend::endCoalescing(),
                return c10::make_intrusive<WorkRef>(r));
  }
  void abort() override { close("abort"); }
  void shutdown() override { close("shutdown"); }
  c10d::ErrorType getError() override {
    RC_OVERRIDE("get_error", c10d::Backend::getError(),
                return static_cast<c10d::ErrorType>(py::int_(r).cast<int>()));
  }
  // timeout: BarrierOptions.timeout (kUnsetTimeout, negative, for the group's own)
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override {
    RC_OVERRIDE("_monitored_barrier", c10d::Backend::monitoredBarrier(o, wait_all_ranks), return,
                o.timeout, wait_all_ranks);
  }
  // The sequence number starts at 0 on every rank of a new group, so the ranks agree on it
  // without an exchange (gloo's setSequenceNumberForGroup does nothing either).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(std::memory_order_relaxed); }

  // Collectives by argument shape; the Python method has the C++ name. Those of the offer point
  // (but allreduce) end in RC_OFFERED: the entry's completed work when it ran the call, else the
  // Python override's, told whether the call was offered.
#define RC_OFFERED(pyname, optype, result, got, base_call, ...)                                         \
  if (got == Offer::kDone) return c10::make_intrusive<FastDoneWork>(getRank(), c10d::OpType::optype, result); \
  if (closed_.load(std::memory_order_acquire)) raise_closed(pyname);                                    \
  RC_OVERRIDE(pyname, base_call, return c10::make_intrusive<WorkRef>(r), __VA_ARGS__, got == Offer::kDeclined)
  WorkPtr broadcast(Tensors& t, const c10d::BroadcastOptions& o) override {
    RC_COUNT();
    const Offer got = offer(t, o);
    RC_OFFERED("broadcast", BROADCAST, t[0], got, c10d::Backend::broadcast(t, o), t, o);
  }
  WorkPtr allreduce(Tensors& t, const c10d::AllreduceOptions& o) override {
    const int64_t t_in = front_.enter();
    RC_COUNT();
    const Offer got = offer(t, o);
    if (got == Offer::kDone) {
      WorkPtr w = c10::make_intrusive<FastDoneWork>(getRank(), c10d::OpType::ALLREDUCE, t[0]);
      front_.leave(t_in);
      return w;
    }
    return allreduce_python(t, o, got == Offer::kDeclined);
  }
  WorkPtr reduce(Tensors& t, const c10d::ReduceOptions& o) override {
    RC_COUNT();
    const Offer got = offer(t, o);
    RC_OFFERED("reduce", REDUCE, t[0], got, c10d::Backend::reduce(t, o), t, o);
  }
  WorkPtr gather(TensorLists& outs, Tensors& in, const c10d::GatherOptions& o) override {
    RC_COUNT();
    const Offer got = offer_gather(outs, in, o);
    const bool on_root = getRank() == o.rootRank && outs.size() == 1;
    RC_OFFERED("gather", GATHER, on_root ? outs[0] : Tensors{}, got, c10d::Backend::gather(outs, in, o), outs, in, o);
  }
  WorkPtr scatter(Tensors& outs, TensorLists& ins, const c10d::ScatterOptions& o) override {
    RC_COUNT();
    const Offer got = offer_scatter(outs, ins, o);
    RC_OFFERED("scatter", SCATTER, outs, got, c10d::Backend::scatter(outs, ins, o), outs, ins, o);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override {
    RC_COUNT();
    const Offer got = offer_barrier(o);
    RC_OFFERED("barrier", BARRIER, Tensors{}, got, c10d::Backend::barrier(o), o);
  }
  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    RC_COUNT();
    const Offer got = offer_all_to_all(out, in, out_splits, in_splits, o);
    RC_OFFERED("alltoall_base", ALLTOALL_BASE, out, got,
               c10d::Backend::alltoall_base(out, in, out_splits, in_splits, o), out, in, out_splits, in_splits, o);
  }

  // ---- the offer point (see the file's header) ----
  /// `call(fast path)`: an entry's offer, or kNotOffered while the fast path is off.
  template <class F>
  Offer with_fast(F&& call) {
    const std::shared_ptr<const FastPath> fast = fast_path();
    return fast ? call(*fast) : Offer::kNotOffered;
  }
  /// Offer an in-place synchronous allreduce of `x` with entry op code `op` (-1: an op that is
  /// not offered) to the entry: kNotOffered while the fast path is off, for such an op or a
  /// tensor with no description.
  Offer offer_all_reduce(const at::Tensor& x, int32_t op) {
    if (op < 0) return Offer::kNotOffered;
    return with_fast([&](const FastPath& f) {
      return offer_to_entry(x, [&](const RcArray* a, char* msg, size_t len) {
        return f.api->all_reduce(f.handle, a, nullptr, op, msg, len);
      });
    });
  }
  /// A c10d allreduce, offered when it is synchronous, of one dense tensor, with an op of
  /// RC_TORCH_OPS.
  Offer offer(Tensors& t, const c10d::AllreduceOptions& o) {
    if (o.asyncOp || t.size() != 1 || o.sparseIndices) return Offer::kNotOffered;
    return offer_all_reduce(t[0], entry_op(o.reduceOp));
  }
  /// Whether a rooted c10d call may be offered: synchronous, of one tensor, its root a rank of
  /// this group (torch translated it; the entry checks it again).
  template <class Opts>
  bool rooted(const Tensors& t, const Opts& o) const {
    return !o.asyncOp && t.size() == 1 && o.rootTensor == 0 && o.rootRank >= 0 && o.rootRank < getSize();
  }
  /// A c10d broadcast, offered when rooted().
  Offer offer(Tensors& t, const c10d::BroadcastOptions& o) {
    if (!rooted(t, o)) return Offer::kNotOffered;
    const auto root = static_cast<int32_t>(o.rootRank);
    return with_fast([&](const FastPath& f) {
      return offer_to_entry(t[0], [&](const RcArray* a, char* msg, size_t len) {
        return f.api->broadcast(f.handle, a, root, msg, len);
      });
    });
  }
  /// A c10d reduce (in place on the root), offered when rooted(), with an op of RC_TORCH_OPS.
  Offer offer(Tensors& t, const c10d::ReduceOptions& o) {
    const int32_t op = entry_op(o.reduceOp);
    if (!rooted(t, o) || op < 0) return Offer::kNotOffered;
    const auto root = static_cast<int32_t>(o.rootRank);
    return with_fast([&](const FastPath& f) {
      return offer_to_entry(t[0], [&](const RcArray* a, char* msg, size_t len) {
        return f.api->reduce(f.handle, a, nullptr, op, root, msg, len);
      });
    });
  }
  /// A c10d alltoall_base (dist.all_to_all_single), offered when it is synchronous and, without
  /// split sizes, of an input and an output of one element count (as the Python half requires);
  /// with split sizes, when both sides' sizes are ones the Python half accepts (split_elements),
  /// offered as element counts.
  Offer offer_all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                         const std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) {
    if (o.asyncOp) return Offer::kNotOffered;
    if (out_splits.empty() && in_splits.empty()) {
      if (out.numel() != in.numel()) return Offer::kNotOffered;
      return with_fast([&](const FastPath& f) {
        return offer_pair_to_entry(in, out, [&](const RcArray* a, const RcArray* b, char* msg, size_t len) {
          return f.api->all_to_all(f.handle, a, b, msg, len);
        });
      });
    }
    std::vector<int64_t> sc, rcn;
    if (!split_elements(in, in_splits, &sc) || !split_elements(out, out_splits, &rcn)) return Offer::kNotOffered;
    return with_fast([&](const FastPath& f) {
      return offer_pair_to_entry(in, out, [&](const RcArray* a, const RcArray* b, char* msg, size_t len) {
        return f.api->all_to_all_v(f.handle, a, b, sc.data(), rcn.data(), static_cast<int32_t>(sc.size()), msg, len);
      });
    });
  }
  /// torch's split sizes of `t` (rows of dim 0; none: an even split) as element counts, exactly
  /// where the Python half's _split_elements accepts them (else false: it raises).
  bool split_elements(const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<int64_t>* e) const {
    if (t.dim() == 0) return false;
    int64_t row = 1;
    for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
    const int64_t w = getSize(), rows = t.size(0);
    if (splits.empty()) {
      if (rows % w != 0) return false;
      e->assign(static_cast<size_t>(w), rows / w * row);
      return true;
    }
    if (static_cast<int64_t>(splits.size()) != w) return false;
    int64_t sum = 0;
    for (const int64_t v : splits)
      if (v < 0 || __builtin_add_overflow(sum, v, &sum)) return false;
    if (sum != rows) return false;
    e->clear();
    for (const int64_t v : splits) e->push_back(v * row);
    return true;
  }
  /// Whether `ts` holds world-size CPU strided tensors of `x`'s dtype and element count (the
  /// root's list the Python half accepts for gather and scatter).
  bool root_list_ok(const Tensors& ts, const at::Tensor& x) const {
    if (static_cast<int64_t>(ts.size()) != getSize()) return false;
    for (const at::Tensor& t : ts)
      if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided || t.scalar_type() != x.scalar_type() ||
          t.numel() != x.numel())
        return false;
    return true;
  }
  /// Whether a c10d gather or scatter may be offered: synchronous, of one defined CPU tensor
  /// (`one`, its input or output), its root a rank of this group, the root's list (`lists`) one
  /// the Python half accepts and no list elsewhere.
  template <class Opts>
  bool rooted_list_ok(const Tensors& one, const TensorLists& lists, const Opts& o) const {
    if (o.asyncOp || one.size() != 1 || o.rootRank < 0 || o.rootRank >= getSize()) return false;
    const at::Tensor& x = one[0];
    if (!x.defined() || !x.device().is_cpu()) return false;
    return getRank() == o.rootRank ? lists.size() == 1 && root_list_ok(lists[0], x)
                                   : lists.empty() || lists[0].empty();
  }
  /// A c10d gather, offered when rooted_list_ok(). The root's list is handed over as one array
  /// when it lies back to back in memory, else gathered into a staging tensor and copied out.
  Offer offer_gather(TensorLists& outs, const Tensors& in, const c10d::GatherOptions& o) {
    if (!rooted_list_ok(in, outs, o)) return Offer::kNotOffered;
    const at::Tensor& x = in[0];
    const bool on_root = getRank() == o.rootRank;
    const auto root = static_cast<int32_t>(o.rootRank);
    return with_fast([&](const FastPath& f) {
      at::Tensor flat;
      bool staged = false;
      if (on_root) {
        flat = flat_view(outs[0]);
        if (!flat.defined()) {
          flat = at::empty({x.numel() * getSize()}, x.options());
          staged = true;
        }
      }
      const Offer got = offer_opt_pair_to_entry(
          &x, on_root ? &flat : nullptr, [&](const RcArray* a, const RcArray* b, char* msg, size_t len) {
            return f.api->gather(f.handle, a, b, root, msg, len);
          });
      if (got == Offer::kDone && staged) {
        const int64_t n = x.numel();
        for (size_t i = 0; i < outs[0].size(); ++i)
          outs[0][i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[0][i].sizes()));
      }
      return got;
    });
  }
  /// A c10d scatter, offered when rooted_list_ok() (the root's list staged into one tensor unless
  /// it lies back to back in memory).
  Offer offer_scatter(const Tensors& outs, const TensorLists& ins, const c10d::ScatterOptions& o) {
    if (!rooted_list_ok(outs, ins, o)) return Offer::kNotOffered;
    const at::Tensor& y = outs[0];
    const bool on_root = getRank() == o.rootRank;
    const auto root = static_cast<int32_t>(o.rootRank);
    return with_fast([&](const FastPath& f) {
      at::Tensor flat;
      if (on_root) {
        flat = flat_view(ins[0]);
        if (!flat.defined()) {
          std::vector<at::Tensor> rows;
          rows.reserve(ins[0].size());
          for (const at::Tensor& t : ins[0]) rows.push_back(t.reshape({-1}));
          flat = at::cat(rows);
        }
      }
      return offer_opt_pair_to_entry(on_root ? &flat : nullptr, &y,
                                     [&](const RcArray* a, const RcArray* b, char* msg, size_t len) {
                                       return f.api->scatter(f.handle, a, b, root, msg, len);
                                     });
    });
  }
  /// A c10d barrier, offered when it is synchronous and without a timeout of its own (one the
  /// Python half bounds the wait by).
  Offer offer_barrier(const c10d::BarrierOptions& o) {
    if (o.asyncOp || o.timeout.count() > 0) return Offer::kNotOffered;
    return with_fast([&](const FastPath& f) {
      return offer_described([&](char* msg, size_t len) { return f.api->barrier(f.handle, msg, len); });
    });
  }

  /// ringcomm.torch.all_reduce_'s call (DirectCall below), from Python with the GIL: an
  /// in-place synchronous allreduce of the tensor `obj` with the entry's reduce op `op` (the
  /// code of an op of RC_TORCH_OPS), through the offer point without the dispatcher, torch's
  /// collective front or a Work. True when it ran here, counted in the sequence number: the
  /// entry took it, or declined it and the Python half ran it as dist.all_reduce would have,
  /// never offered again (a failure raises ringcomm's exception, also counted). False when it
  /// is not offered: `obj` not a tensor, `op` not such a code, a tensor that dist.all_reduce
  /// does not hand to this backend as it is (on another device, which the group routes to that
  /// device's backend; complex, which dist.all_reduce hands over as its real view), one with no
  /// description, or the fast path off: nothing was done or counted, and the caller takes
  /// dist.all_reduce. After shutdown() or abort() it raises ClosedError (counted), as every
  /// call does. Like dist.all_reduce, it neither bumps the tensor's version nor records autograd
  /// history; unlike it, it does not pass through the dispatcher, so a TorchDispatchMode does
  /// not see it.
  bool all_reduce_now(py::handle obj, long op) {
    if (closed_.load(std::memory_order_acquire)) {
      RC_COUNT();  // as allreduce() counts the call it refuses
      raise_closed("allreduce");
    }
    const TorchOp* top = torch_op_of_code(op);
    if (top == nullptr || !THPVariable_Check(obj.ptr())) return false;
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    if (!t.device().is_cpu() || t.is_complex()) return false;
    Offer got;
    try {
      got = offer_all_reduce(t, top->code);
    } catch (...) {
      RC_COUNT();  // failed in the entry: counted, as allreduce() counts it
      throw;
    }
    if (got == Offer::kNotOffered) return false;
    RC_COUNT();
    if (got == Offer::kDeclined) {
      Tensors ts{t};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp(top->op);
      o.asyncOp = false;
      allreduce_python(ts, o, true)->wait();
    }
    return true;
  }
  /// allreduce() through the Python half, for a call already counted; `offered`: the offer point
  /// offered it and the entry declined it (the Python half then never offers it again).
  WorkPtr allreduce_python(Tensors& t, const c10d::AllreduceOptions& o, bool offered) {
    if (closed_.load(std::memory_order_acquire)) raise_closed("allreduce");
    RC_OVERRIDE("allreduce", c10d::Backend::allreduce(t, o), return c10::make_intrusive<WorkRef>(r), t, o,
                offered);
  }
  /// Count one call in the group's sequence number (what every collective does as it enters).
  void count_call() { RC_COUNT(); }
  RC_OP1(allreduce_coalesced, AllreduceCoalescedOptions)
  RC_OP1(allreduce_sparse, AllreduceOptions)
  RC_OP2(allgather, TensorLists, Tensors, AllgatherOptions)
  RC_OP2(allgather_coalesced, TensorLists, Tensors, AllgatherOptions)
  RC_OP2(reduce_scatter, Tensors, TensorLists, ReduceScatterOptions)
  RC_OP2(_allgather_base, at::Tensor, at::Tensor, AllgatherOptions)
  RC_OP2(_reduce_scatter_base, at::Tensor, at::Tensor, ReduceScatterOptions)
  RC_OP2(allgather_into_tensor_coalesced, Tensors, Tensors, AllgatherOptions)
  RC_OP2(reduce_scatter_tensor_coalesced, Tensors, Tensors, ReduceScatterOptions)
  RC_OP2(alltoall, Tensors, Tensors, AllToAllOptions)
  WorkPtr send(Tensors& t, int dst, int tag) override {
    RC_COUNT();
    RC_WORK("send", send, t, dst, tag);
  }
  WorkPtr recv(Tensors& t, int src, int tag) override {
    RC_COUNT();
    RC_WORK("recv", recv, t, src, tag);
  }
  WorkPtr recvAnysource(Tensors& t, int tag) override {
    RC_COUNT();
    RC_WORK("recv_anysource", recvAnysource, t, tag);
  }

  /// abort() or shutdown(): the Python half's method `name`, then every later call raises
  /// ClosedError from C++ (the Python half is released once it has shut down).
  void close(const char* name) {
    {
      py::gil_scoped_acquire gil;
      py::function fn = py::get_override(static_cast<const Trampoline*>(this), name);
      if (fn) fn();
    }
    closed_.store(true, std::memory_order_release);
  }

  FrontStamps front_;  // allreduce()'s stamps (RINGCOMM_TRACE)

  /// The fast path's table and handle while it is on, else null (held by the call in flight).
  std::shared_ptr<const FastPath> fast_path() {
    std::lock_guard<std::mutex> lk(fast_mu_);
    return fast_;
  }

  /// Enable the allreduce and broadcast fast path on ringcomm._C's RcFastApi table at `api` with
  /// `handle` (this object takes it over), or disable it (api 0, handle 0). Returns whether the
  /// fast path is now on (a table of another version or size leaves it off).
  bool set_fast_path(uintptr_t api, uintptr_t handle) {
    std::shared_ptr<const FastPath> next = make_fast_path(api, handle);
    std::shared_ptr<const FastPath> old;
    {
      std::lock_guard<std::mutex> lk(fast_mu_);
      old = std::move(fast_);
      fast_ = next;
    }
    return next != nullptr;  // `old` is released here, outside the lock
  }

 private:
  std::mutex fast_mu_;
  std::shared_ptr<const FastPath> fast_;  // null: the fast path is off
  std::atomic<uint64_t> seq_{0};          // calls issued (getSequenceNumberForGroup)
  std::atomic<bool> closed_{false};       // set once abort() or shutdown() returned
};

// ringcomm.torch.all_reduce_'s direct call of one backend: a callable `call(tensor, op_code)` ->
// bool (Trampoline::all_reduce_now), made by the backend's `_direct_all_reduce()`. A plain
// CPython type with vectorcall, so that a call from Python costs one C call rather than
// pybind11's general dispatch. `owner` is the backend's Python object, held strongly: its holder
// keeps the Trampoline that `tr` points to alive for as long as this object lives.
struct DirectCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* owner;
  Trampoline* tr;
};

PyObject* direct_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "ringcomm direct all_reduce: expected (tensor, op_code)");
    return nullptr;
  }
  const long op = PyLong_AsLong(args[1]);
  if (op == -1 && PyErr_Occurred()) return nullptr;
  try {
    const bool done = reinterpret_cast<DirectCall*>(self)->tr->all_reduce_now(args[0], op);
    return PyBool_FromLong(done);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void direct_call_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<DirectCall*>(self)->owner);
  Py_TYPE(self)->tp_free(self);
}

PyMemberDef kDirectCallMembers[] = {
    {const_cast<char*>("owner"), T_OBJECT, offsetof(DirectCall, owner), READONLY,
     const_cast<char*>("the backend whose all_reduce this calls")},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject g_direct_call_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "ringcomm_c10d.DirectAllReduce";
  t.tp_basicsize = sizeof(DirectCall);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = offsetof(DirectCall, vectorcall);
  t.tp_call = PyVectorcall_Call;
  t.tp_dealloc = direct_call_dealloc;
  t.tp_members = kDirectCallMembers;
  t.tp_doc = "call(tensor, op_code) -> bool: the backend's synchronous all_reduce offered to the entry";
  return t;
}();

// The direct call of the backend whose Python object is `owner` (a Trampoline).
py::object make_direct_call(py::object owner) {
  Trampoline* tr = owner.cast<Trampoline*>();
  DirectCall* d = PyObject_New(DirectCall, &g_direct_call_type);
  if (d == nullptr) throw py::error_already_set();
  d->vectorcall = direct_call;
  d->owner = owner.release().ptr();
  d->tr = tr;
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(d));
}

// torch.ops.ringcomm.all_reduce_ on CPU: see the file's header.
void all_reduce_op(at::Tensor& t, c10::string_view group_name, c10::string_view op_name) {
  const c10d::ReduceOp op(reduce_op_named(std::string_view(op_name.data(), op_name.size())));
  const c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(std::string(group_name));
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  opts.asyncOp = false;
  // The call blocks until every rank has joined: never with the GIL (a caller from Python holds
  // it, and other threads of this process may need it meanwhile).
  std::optional<py::gil_scoped_release> nogil;
  if (PyGILState_Check()) nogil.emplace();
  const c10::intrusive_ptr<c10d::Backend> backend = pg->getBackend(c10::DeviceType::CPU);
  if (auto* tr = dynamic_cast<Trampoline*>(backend.get())) {
    tr->count_call();
    const Offer got = tr->offer(tensors, opts);
    if (got != Offer::kDone) tr->allreduce_python(tensors, opts, got == Offer::kDeclined)->wait();
    return;
  }
  pg->allreduce(tensors, opts)->wait();
}

}  // namespace

TORCH_LIBRARY(ringcomm, m) {
  // Returns nothing (the tensor holds the result): torch.compile functionalizes a custom op that
  // mutates an argument only when its outputs do not alias it.
  m.def("all_reduce_(Tensor(a!) tensor, str group_name, str op='sum') -> ()");
}

TORCH_LIBRARY_IMPL(ringcomm, CPU, m) { m.impl("all_reduce_", &all_reduce_op); }

// Under torch.compile (fake and meta tensors): the tensor's metadata does not change.
void all_reduce_meta(at::Tensor&, c10::string_view, c10::string_view) {}

TORCH_LIBRARY_IMPL(ringcomm, Meta, m) { m.impl("all_reduce_", &all_reduce_meta); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");  // registers c10d::Backend, Work and the options
  init_dtype_codes();
  py::class_<Trampoline, c10d::Backend, c10::intrusive_ptr<Trampoline>>(m, "Trampoline")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("size"))
      .def("_set_fast_path", &Trampoline::set_fast_path, py::arg("api"), py::arg("handle"))
      .def("_direct_all_reduce", &make_direct_call)
      .def("_front_trace", [](Trampoline& t, bool on) { t.front_.on.store(on); }, py::arg("on"))
      .def("_front_stamps", [](const Trampoline& t) { return t.front_.get(); });
  py::class_<NullBackend, c10d::Backend, c10::intrusive_ptr<NullBackend>>(m, "NullBackend")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("size"))
      .def("_front_trace", [](NullBackend& t, bool on) { t.front_.on.store(on); }, py::arg("on"))
      .def("_front_stamps", [](const NullBackend& t) { return t.front_.get(); });
  if (PyType_Ready(&g_direct_call_type) < 0) throw py::error_already_set();
  // The entry's reduce-op code of each name torch.ops.ringcomm.all_reduce_ takes (RC_TORCH_OPS).
  py::dict ops;
  for (const TorchOp& t : kTorchOps) ops[py::str(lower(t.name))] = t.code;
  m.attr("REDUCE_OPS") = ops;
}
