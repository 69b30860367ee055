// The offer point's parts that know nothing of the Trampoline class (bindings/torch/trampoline.cpp
// includes this file; the build copies both into the package, ringcomm/_data/torch/): torch's
// dtypes and reduce ops as the header's codes, a tensor as an RcArray, the RcFastApi table in
// use, and the offer of described arrays to one of its entries.
#pragma once
#include <torch/csrc/Dtype.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ringcomm/abi.h"

namespace {

namespace py = pybind11;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

bool fast_api_ok(const RcFastApi* a) {
  return a != nullptr && a->version == RC_FAST_API_VERSION && a->size >= sizeof(RcFastApi);
}

// ringcomm's dtype code of each torch ScalarType (-1: none), filled once at module import from
// the header's dtype names (torch.<name> for every entry of RC_DTYPES; a name this torch lacks
// stays unmapped, its tensors go the Python way) and read-only afterwards.
constexpr int kScalarTypes = static_cast<int>(c10::ScalarType::NumOptions);
int8_t g_dtype_code[kScalarTypes];

void init_dtype_codes() {
  for (int8_t& c : g_dtype_code) c = -1;
  py::module_ torch = py::module_::import("torch");
#define RC_TORCH_DTYPE_(name, code, bytes, str, ...)                                           \
  {                                                                                           \
    py::object d = py::getattr(torch, str, py::none());                                       \
    if (THPDtype_Check(d.ptr()))                                                              \
      g_dtype_code[static_cast<int>(reinterpret_cast<THPDtype*>(d.ptr())->scalar_type)] = code; \
  }
  RC_DTYPES(RC_TORCH_DTYPE_)
#undef RC_TORCH_DTYPE_
}

// Tensor x as an RcArray (byte strides in `strides`), or false when it has no such description
// (another layout, no storage, more than RC_ARRAY_MAX_DIMS dimensions): the Python path then
// explains. Whether the entry takes the description is the entry's rule, not decided here.
bool describe(const at::Tensor& x, RcArray* a, int64_t (&strides)[RC_ARRAY_MAX_DIMS]) {
  if (x.layout() != c10::kStrided || !x.has_storage() || x.dim() > RC_ARRAY_MAX_DIMS) return false;
  const bool cpu = x.device().is_cpu();
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const c10::IntArrayRef st = x.strides();
  for (size_t i = 0; i < st.size(); ++i) strides[i] = st[i] * esize;
  a->data = cpu && x.numel() != 0 ? x.data_ptr() : nullptr;
  a->shape = x.sizes().data();
  a->strides = strides;
  a->ndim = static_cast<int32_t>(x.dim());
  a->dtype = g_dtype_code[static_cast<int>(x.scalar_type())];
  a->device_type = cpu ? RC_DEVICE_CPU : 0;
  a->flags = RC_ARRAY_WRITABLE;
  return true;
}

// A handle (a reference to the communicator, from Communicator._fast_handle()) and the table
// that releases it; shared by the calls in flight, so disabling never frees it under them.
struct FastPath {
  FastPath(const RcFastApi* a, void* h) : api(a), handle(h) {}
  FastPath(const FastPath&) = delete;
  FastPath& operator=(const FastPath&) = delete;
  ~FastPath() { api->release(handle); }
  const RcFastApi* api;
  void* handle;
};

// The fast path over the table at `api` with `handle` (taken over), or null for a table of another
// version or size, or no handle (the handle is then left unreleased: its table cannot be trusted).
std::shared_ptr<const FastPath> make_fast_path(uintptr_t api, uintptr_t handle) {
  const auto* a = reinterpret_cast<const RcFastApi*>(api);
  if (!fast_api_ok(a) || handle == 0) return nullptr;
  // One allocation for the object and its count: a call reads both.
  return std::make_shared<const FastPath>(a, reinterpret_cast<void*>(handle));
}

// The work of a collective the fast path ran: complete, successful, its tensors the result.
// Complete from birth: no other thread can see it before the constructor returns, so it sets
// Work's flag without Work::finish()'s lock and wake-up.
class FastDoneWork : public c10d::Work {
 public:
  FastDoneWork(int rank, c10d::OpType op, const at::Tensor& t) : FastDoneWork(rank, op, std::vector<at::Tensor>{t}) {}
  FastDoneWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, op), outputs_(std::move(outputs)) {
    completed_ = true;
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(outputs_));
    return f;
  }

 private:
  std::vector<at::Tensor> outputs_;
};

// A backend's front stamps, off until its `_front_trace(True)` (torch_apart.py --trace turns
// them on): CLOCK_MONOTONIC, the core's trace clock, when the backend's allreduce() was entered
// and when it returned its work, for the last such call. Off, they cost one relaxed load per call.
struct FrontStamps {
  std::atomic<bool> on{false};
  std::atomic<int64_t> in_ns{0}, out_ns{0};
  static int64_t now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  /// The entry stamp, or 0 while off.
  int64_t enter() const { return on.load(std::memory_order_relaxed) ? now() : 0; }
  /// Record a call entered at `t_in` (0: stamps off, nothing recorded) as leaving now.
  void leave(int64_t t_in) {
    if (t_in == 0) return;
    out_ns.store(now(), std::memory_order_relaxed);
    in_ns.store(t_in, std::memory_order_relaxed);
  }
  py::tuple get() const {
    return py::make_tuple(in_ns.load(std::memory_order_relaxed), out_ns.load(std::memory_order_relaxed));
  }
};

// Raise ringcomm's exception for ErrorCode `code` (ringcomm.core.errors.from_code), marked as raised
// by the core (every rank has been told: see ringcomm/torch/steps.py).
[[noreturn]] void raise_ringcomm(int code, const char* msg) {
  py::gil_scoped_acquire gil;
  py::object exc = py::module_::import("ringcomm.core.errors").attr("from_code")(code, msg);
  exc.attr("_ringcomm_issued") = true;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// The entry's code of the reduce op named `name` in RC_REDUCE_OPS, or -1.
constexpr int32_t entry_code(std::string_view name) {
#define RC_ENTRY_CODE_(enumerator, code, str, kinds) \
  if (name == str) return code;
  RC_REDUCE_OPS(RC_ENTRY_CODE_)
#undef RC_ENTRY_CODE_
  return -1;
}

// The reduce ops offered to the entry (RC_TORCH_OPS): each one's name, c10d op and entry code.
// The names torch.ops.ringcomm.all_reduce_'s `op` takes are these names in lower case.
struct TorchOp {
  std::string_view name;
  c10d::ReduceOp::RedOpType op;
  int32_t code;
};
#define RC_TORCH_OP_(name) TorchOp{#name, c10d::ReduceOp::name, entry_code(#name)},
constexpr TorchOp kTorchOps[] = {RC_TORCH_OPS(RC_TORCH_OP_)};
#undef RC_TORCH_OP_

constexpr bool every_torch_op_has_a_code() {
  for (const TorchOp& t : kTorchOps)
    if (t.code < 0) return false;
  return true;
}
static_assert(every_torch_op_has_a_code(), "RC_TORCH_OPS names an op RC_REDUCE_OPS lacks");

// The offered op of c10d op `op`, or null (AVG, PREMUL_SUM: composed by the Python half).
const TorchOp* torch_op(c10d::ReduceOp::RedOpType op) {
  for (const TorchOp& t : kTorchOps)
    if (t.op == op) return &t;
  return nullptr;
}

// The offered op of entry code `code`, or null.
const TorchOp* torch_op_of_code(long code) {
  for (const TorchOp& t : kTorchOps)
    if (t.code == code) return &t;
  return nullptr;
}

// The entry's code of c10d reduce op `op`, or -1 when it is not offered.
int32_t entry_op(const c10d::ReduceOp& op) {
  const TorchOp* t = torch_op(op.op_);
  return t != nullptr ? t->code : -1;
}

constexpr char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Name `name` in lower case.
std::string lower(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = lower(c);
  return s;
}

// Whether `s` is `name` in lower case.
bool is_lower_of(std::string_view s, std::string_view name) {
  if (s.size() != name.size()) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != lower(name[i])) return false;
  return true;
}

// The c10d op of torch.ops.ringcomm.all_reduce_'s `op` (a lower-case name of RC_TORCH_OPS);
// ValueError for any other.
c10d::ReduceOp::RedOpType reduce_op_named(std::string_view name) {
  for (const TorchOp& t : kTorchOps)
    if (is_lower_of(name, t.name)) return t.op;
  std::string names;
  for (const TorchOp& t : kTorchOps) names += (names.empty() ? "" : ", ") + lower(t.name);
  TORCH_CHECK_VALUE(false, "ringcomm all_reduce_: op must be one of ", names, "; got '", name,
                    "' (dist.all_reduce takes the others)");
}

// Raise ringcomm.ClosedError for call `op` on a group that was shut down.
[[noreturn]] void raise_closed(const char* op) {
  py::gil_scoped_acquire gil;
  py::object exc = py::module_::import("ringcomm.core.errors").attr("ClosedError")(
      std::string("ringcomm: ") + op + " on a process group that was shut down");
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// What the offer point did with a call.
enum class Offer {
  kNotOffered,  // not a call the entry has: nothing done, the entry not called
  kDone,        // the entry ran it (the tensors hold the result)
  kDeclined,    // offered, and the entry declined it: nothing done; never offer it again
};

// Run an RcFastApi entry on arrays already described (`call(msg, msg_len)`), the GIL released
// around the call (it blocks until every rank has joined). A failure raises ringcomm's
// exception, marked as raised by the core (see raise_ringcomm).
template <class F>
Offer offer_described(F&& call) {
  char msg[2048];
  int rc;
  {
    std::optional<py::gil_scoped_release> nogil;
    if (PyGILState_Check()) nogil.emplace();
    rc = call(msg, sizeof msg);
  }
  if (rc == RC_CALL_DECLINED) return Offer::kDeclined;
  if (rc != RC_CALL_DONE) raise_ringcomm(rc - 1, msg);
  return Offer::kDone;
}

// Offer tensor x to one RcFastApi entry (`call(array, msg, msg_len)`). kNotOffered when x has no
// description. The caller holds x.
template <class F>
Offer offer_to_entry(const at::Tensor& x, F&& call) {
  RcArray a;
  int64_t strides[RC_ARRAY_MAX_DIMS];
  if (!describe(x, &a, strides)) return Offer::kNotOffered;
  return offer_described([&](char* msg, size_t len) { return call(&a, msg, len); });
}

// Offer tensors `in` and `out` (either may be null: no array, null handed to the entry) to one
// RcFastApi entry (`call(in, out, msg, msg_len)`), as offer_to_entry offers one.
template <class F>
Offer offer_opt_pair_to_entry(const at::Tensor* in, const at::Tensor* out, F&& call) {
  RcArray a, b;
  int64_t sa[RC_ARRAY_MAX_DIMS], sb[RC_ARRAY_MAX_DIMS];
  if ((in != nullptr && !describe(*in, &a, sa)) || (out != nullptr && !describe(*out, &b, sb)))
    return Offer::kNotOffered;
  return offer_described(
      [&](char* msg, size_t len) { return call(in ? &a : nullptr, out ? &b : nullptr, msg, len); });
}

// One tensor over `ts` (world() of them, one dtype, one element count each) when they lie back
// to back in one storage, contiguous: the 1-D view of them all; else undefined (the caller
// stages a copy). No view for empty tensors (no address to compare).
at::Tensor flat_view(const std::vector<at::Tensor>& ts) {
  const at::Tensor& t0 = ts.at(0);
  const int64_t n = t0.numel();
  if (n == 0 || !t0.has_storage()) return at::Tensor();
  const auto* base = static_cast<const char*>(t0.data_ptr());
  const int64_t step = n * static_cast<int64_t>(t0.element_size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (!t.is_contiguous() || t.scalar_type() != t0.scalar_type() || t.numel() != n || !t.has_storage() ||
        static_cast<const char*>(t.data_ptr()) != base + static_cast<int64_t>(i) * step ||
        !t.storage().is_alias_of(t0.storage()))
      return at::Tensor();
  }
  return t0.as_strided({n * static_cast<int64_t>(ts.size())}, {1}, t0.storage_offset());
}

// Offer tensors `in` and `out` to one RcFastApi entry (`call(in, out, msg, msg_len)`), as
// offer_to_entry offers one.
template <class F>
Offer offer_pair_to_entry(const at::Tensor& in, const at::Tensor& out, F&& call) {
  RcArray a, b;
  int64_t sa[RC_ARRAY_MAX_DIMS], sb[RC_ARRAY_MAX_DIMS];
  if (!describe(in, &a, sa) || !describe(out, &b, sb)) return Offer::kNotOffered;
  return offer_described([&](char* msg, size_t len) { return call(&a, &b, msg, len); });
}

}  // namespace
