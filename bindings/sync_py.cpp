// The fronts of the synchronous entries (comm/sync_entry.h). A Python object is described as an
// RcArray (ringcomm/abi.h) straight from its own fields, without Python code in between:
//   - a numpy array: pybind11's proxies of the array and its dtype (a few loads; the element
//     type as DLPack's (code, bits) from the dtype's kind and item size);
//   - a torch tensor (its exact type): its DLPack capsule, made by torch.utils.dlpack.to_dlpack,
//     read here as DLManagedTensor. Nothing of torch is linked or imported: the bridge is armed
//     only once some code has imported torch.
// Anything else is not described and the binding returns False having done nothing, as it does
// when the entry declines the description; the caller then goes the general way.
// The C ABI (RcFastApi) lets the torch c10d trampoline call the same entries with its own
// descriptions.
#include "sync_py.h"

#include <pybind11/numpy.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "comm/sync_entry.h"
#include "common/errors.h"
#include "errors_py.h"

namespace py = pybind11;

namespace rc_py {

namespace {

// ---- DLPack (dlpack.h, ABI version 0.x: the "dltensor" capsule's DLManagedTensor) ----------
// The layout is DLPack's stable C ABI; only the fields read here are named.
struct DLDevice_ {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType_ {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor_ {
  void* data;
  DLDevice_ device;
  int32_t ndim;
  DLDataType_ dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor_ {
  DLTensor_ dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor_* self);
};

// What torch is to this module once some code imported it: its Tensor type and to_dlpack. Set
// once under the GIL; the references are kept for the life of the process (never released, so
// that nothing runs at interpreter teardown).
struct TorchBridge {
  PyTypeObject* tensor = nullptr;
  PyObject* to_dlpack = nullptr;
};

const TorchBridge* torch_bridge() {
  static TorchBridge bridge;
  if (bridge.tensor != nullptr) return &bridge;
  PyObject* mods = PyImport_GetModuleDict();  // borrowed
  PyObject* torch = PyDict_GetItemString(mods, "torch");  // borrowed; torch imported by someone
  if (torch == nullptr) return nullptr;
  try {
    py::object tensor = py::reinterpret_borrow<py::object>(torch).attr("Tensor");
    py::object to_dlpack = py::module_::import("torch.utils.dlpack").attr("to_dlpack");
    if (!PyType_Check(tensor.ptr())) return nullptr;
    bridge.to_dlpack = to_dlpack.release().ptr();
    bridge.tensor = reinterpret_cast<PyTypeObject*>(tensor.release().ptr());
  } catch (py::error_already_set&) {
    return nullptr;  // a torch without these: its tensors go the general way
  }
  return &bridge;
}

// One object as an RcArray, and what keeps the memory it points at alive during the call (a
// numpy array: the caller's reference; a tensor: its DLPack capsule, whose destructor runs the
// DLManagedTensor's deleter, since the capsule is never renamed "used_dltensor" here). Make and
// destroy it with the GIL held; use array() without it.
class Described {
 public:
  explicit Described(PyObject* obj) {
    if (py::array::check_(obj)) {
      numpy(obj);
      return;
    }
    const TorchBridge* tb = torch_bridge();
    if (tb != nullptr && Py_TYPE(obj) == tb->tensor) dlpack(obj, tb->to_dlpack);
  }
  Described(const Described&) = delete;
  Described& operator=(const Described&) = delete;

  bool ok() const { return ok_; }
  const RcArray& array() const { return a_; }

 private:
  void numpy(PyObject* obj) {
    static_assert(sizeof(ssize_t) == sizeof(int64_t), "numpy's npy_intp is read as int64_t");
    const auto* p = py::detail::array_proxy(obj);
    const py::dtype d = py::reinterpret_borrow<py::dtype>(p->descr);
    int32_t dl = -1;
    switch (d.kind()) {
      case 'f': dl = RC_DL_FLOAT; break;
      case 'i': dl = RC_DL_INT; break;
      case 'u': dl = RC_DL_UINT; break;
      case 'b': dl = RC_DL_BOOL; break;
      default: break;
    }
    a_.data = p->data;
    a_.ndim = p->nd;
    a_.shape = reinterpret_cast<const int64_t*>(p->dimensions);
    a_.strides = reinterpret_cast<const int64_t*>(p->strides);
    a_.dtype = d.byteorder() == '>' ? -1 : rc_dtype_of_dl(dl, static_cast<int32_t>(8 * d.itemsize()));
    a_.device_type = RC_DEVICE_CPU;
    a_.flags = (p->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) ? RC_ARRAY_WRITABLE : 0;
    ok_ = true;
  }

  void dlpack(PyObject* obj, PyObject* to_dlpack) {
    PyObject* cap = PyObject_CallOneArg(to_dlpack, obj);
    if (cap == nullptr) {  // no storage, a sparse layout, the meta device, ...
      PyErr_Clear();
      return;
    }
    keep_ = py::reinterpret_steal<py::object>(cap);
    auto* m = static_cast<DLManagedTensor_*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m == nullptr) {
      PyErr_Clear();
      return;
    }
    const DLTensor_& t = m->dl_tensor;
    if (t.ndim < 0 || t.ndim > RC_ARRAY_MAX_DIMS || t.dtype.lanes != 1) return;
    a_.data = t.data != nullptr ? static_cast<char*>(t.data) + t.byte_offset : nullptr;
    a_.ndim = t.ndim;
    a_.shape = t.shape;
    a_.strides = nullptr;
    if (t.strides != nullptr) {
      const int64_t esize = t.dtype.bits / 8;
      for (int32_t i = 0; i < t.ndim; ++i) strides_[i] = t.strides[i] * esize;
      a_.strides = strides_;
    }
    a_.dtype = rc_dtype_of_dl(t.dtype.code, t.dtype.bits);
    a_.device_type = t.device.device_type;
    a_.flags = RC_ARRAY_WRITABLE;  // DLPack 0.x has no read-only flag; torch's memory is writable
    ok_ = true;
  }

  RcArray a_{};
  int64_t strides_[RC_ARRAY_MAX_DIMS];
  py::object keep_;
  bool ok_ = false;
};

// The fast C ABI (RcFastApi). A handle owns a reference to its communicator, so a call made
// through it never outlives the object, whatever Python closes or drops meanwhile (a closed
// communicator raises ClosedError).
struct FastHandle {
  std::shared_ptr<rc::Communicator> comm;
};

void fast_release(void* h) { delete static_cast<FastHandle*>(h); }

// Runs `call` (true: done, false: declined) and reports as RcFastApi does.
template <class F>
int fast_call(char* msg, size_t msg_len, F&& call) {
  try {
    return call() ? RC_CALL_DONE : RC_CALL_DECLINED;
  } catch (...) {
    std::string m;
    const rc::ErrorCode code = rc::error_code_of(std::current_exception(), &m);
    if (msg_len > 0) std::snprintf(msg, msg_len, "%s", m.c_str());
    return 1 + static_cast<int>(code);
  }
}

int fast_all_reduce(void* h, const RcArray* in, const RcArray* out, int32_t op, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_all_reduce(*static_cast<FastHandle*>(h)->comm, *in, out, op); });
}

int fast_broadcast(void* h, const RcArray* buf, int32_t root, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_broadcast(*static_cast<FastHandle*>(h)->comm, *buf, root); });
}

// A root given from Python as a rank: an int (not a bool or another subclass) in [0, INT32_MAX].
// False, the Python error cleared, for anything else (the entry checks it against the world).
bool root_of(py::handle root, int32_t* r) {
  if (!PyLong_CheckExact(root.ptr())) return false;
  const long long v = PyLong_AsLongLong(root.ptr());
  if (v < 0 || v > INT32_MAX) {  // -1 also for an overflow (the error is cleared)
    PyErr_Clear();
    return false;
  }
  *r = static_cast<int32_t>(v);
  return true;
}

int fast_reduce(void* h, const RcArray* in, const RcArray* out, int32_t op, int32_t root, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_reduce(*static_cast<FastHandle*>(h)->comm, *in, out, op, root); });
}

int fast_all_to_all(void* h, const RcArray* in, const RcArray* out, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_all_to_all(*static_cast<FastHandle*>(h)->comm, *in, *out); });
}

// Split sizes given from Python: None (*given false), or a list or tuple of exactly `world` ints
// (not bools or other subclasses), each in int64_t. False, the Python error cleared, for
// anything else (the entry checks the sizes themselves).
bool splits_of(py::handle h, int world, std::vector<int64_t>* s, bool* given) {
  *given = !h.is_none();
  if (!*given) return true;
  PyObject* o = h.ptr();
  if (!PyList_CheckExact(o) && !PyTuple_CheckExact(o)) return false;
  const Py_ssize_t len = PySequence_Fast_GET_SIZE(o);
  if (len != world) return false;
  PyObject** items = PySequence_Fast_ITEMS(o);
  s->resize(static_cast<size_t>(len));
  for (Py_ssize_t i = 0; i < len; ++i) {
    if (!PyLong_CheckExact(items[i])) return false;
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    (*s)[static_cast<size_t>(i)] = v;
  }
  return true;
}

int fast_all_to_all_v(void* h, const RcArray* in, const RcArray* out, const int64_t* send_counts,
                      const int64_t* recv_counts, int32_t n, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] {
    if (n < 0 || send_counts == nullptr || recv_counts == nullptr) return false;
    const std::vector<int64_t> sc(send_counts, send_counts + n), rcn(recv_counts, recv_counts + n);
    return rc::sync_all_to_all(*static_cast<FastHandle*>(h)->comm, *in, *out, &sc, &rcn);
  });
}

int fast_gather(void* h, const RcArray* in, const RcArray* out, int32_t root, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_gather(*static_cast<FastHandle*>(h)->comm, *in, out, root); });
}

int fast_scatter(void* h, const RcArray* in, const RcArray* out, int32_t root, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_scatter(*static_cast<FastHandle*>(h)->comm, in, *out, root); });
}

int fast_barrier(void* h, char* msg, size_t msg_len) {
  return fast_call(msg, msg_len, [&] { return rc::sync_barrier(*static_cast<FastHandle*>(h)->comm); });
}

const RcFastApi kFastApi = {RC_FAST_API_VERSION, sizeof(RcFastApi), &fast_release, &fast_all_reduce,
                            &fast_broadcast,     &fast_reduce,       &fast_all_to_all,
                            &fast_all_to_all_v,  &fast_gather,       &fast_scatter,
                            &fast_barrier};

// ---- The Python front: each entry a builtin function bound to its communicator ---------------
// `communicator.sync_all_reduce` (a property) makes a builtin function whose self is a capsule
// owning the communicator and naming its entry; calling it parses the positional arguments here
// (no per-call binding machinery: the calls are about a microsecond), releases the GIL around the
// entry, and maps an rc::Error to its Python class through the one table (errors_py.h). An
// entry's run() gets exactly max_args arguments, the optional ones past those given as None.

// The GIL released for the scope (the entries' waits); taken back before any Python object is
// touched again, exceptions included.
class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {}
  ~NoGil() { PyEval_RestoreThread(state_); }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* state_;
};

// An int op code (exactly int, not a bool); false for anything else.
bool op_of(PyObject* o, int32_t* op) {
  if (!PyLong_CheckExact(o)) return false;
  const long v = PyLong_AsLong(o);
  if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
    PyErr_Clear();
    return false;
  }
  *op = static_cast<int32_t>(v);
  return true;
}

// An array argument the entry reads only on some ranks, or may be None there: absent (nullptr)
// where it is None or not read, else described (ok() false when it cannot be).
class OptionalArray {
 public:
  OptionalArray(PyObject* o, bool read) {
    if (read && o != Py_None) d_.emplace(o);
  }
  bool ok() const { return !d_ || d_->ok(); }
  const RcArray* get() const { return d_ ? &d_->array() : nullptr; }

 private:
  std::optional<Described> d_;
};

bool run_all_reduce(rc::Communicator& c, PyObject* const* a) {
  // (x, out, op): x into out (None: in place).
  int32_t op = 0;
  if (!op_of(a[2], &op)) return false;
  Described in(a[0]);
  OptionalArray out(a[1], true);
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_all_reduce(c, in.array(), out.get(), op);
}

bool run_broadcast(rc::Communicator& c, PyObject* const* a) {
  // (x, root): root an int, not a bool.
  int32_t r = 0;
  if (!root_of(a[1], &r)) return false;
  Described b(a[0]);
  if (!b.ok()) return false;
  NoGil nogil;
  return rc::sync_broadcast(c, b.array(), r);
}

bool run_reduce_scatter(rc::Communicator& c, PyObject* const* a) {
  // (output, input, op): this rank's chunk into output.
  int32_t op = 0;
  if (!op_of(a[2], &op)) return false;
  Described in(a[1]), out(a[0]);
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_reduce_scatter(c, in.array(), out.array(), op);
}

bool run_all_gather(rc::Communicator& c, PyObject* const* a) {
  // (output, input).
  Described in(a[1]), out(a[0]);
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_all_gather(c, in.array(), out.array());
}

bool run_reduce(rc::Communicator& c, PyObject* const* a) {
  // (x, out, op, root): onto root, into out there (None: in place); out is read on the root only.
  int32_t op = 0, r = 0;
  if (!op_of(a[2], &op) || !root_of(a[3], &r)) return false;
  Described in(a[0]);
  OptionalArray out(a[1], r == c.rank());
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_reduce(c, in.array(), out.get(), op, r);
}

bool run_all_to_all(rc::Communicator& c, PyObject* const* a) {
  // (output, input, output_splits, input_splits): split sizes None (even) or world ints.
  std::vector<int64_t> sc, rcn;
  bool has_sc = false, has_rc = false;
  if (!splits_of(a[3], c.world(), &sc, &has_sc) || !splits_of(a[2], c.world(), &rcn, &has_rc)) return false;
  Described in(a[1]), out(a[0]);
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_all_to_all(c, in.array(), out.array(), has_sc ? &sc : nullptr, has_rc ? &rcn : nullptr);
}

bool run_gather(rc::Communicator& c, PyObject* const* a) {
  // (output, input, root): output is read on the root only, where it must be given.
  int32_t r = 0;
  if (!root_of(a[2], &r)) return false;
  const bool root = r == c.rank();
  if (root && a[0] == Py_None) return false;
  Described in(a[1]);
  OptionalArray out(a[0], root);
  if (!in.ok() || !out.ok()) return false;
  NoGil nogil;
  return rc::sync_gather(c, in.array(), out.get(), r);
}

bool run_scatter(rc::Communicator& c, PyObject* const* a) {
  // (output, input, root): input is read on the root only, where it must be given.
  int32_t r = 0;
  if (!root_of(a[2], &r)) return false;
  const bool root = r == c.rank();
  if (root && a[1] == Py_None) return false;
  Described out(a[0]);
  OptionalArray in(a[1], root);
  if (!out.ok() || !in.ok()) return false;
  NoGil nogil;
  return rc::sync_scatter(c, in.get(), out.array(), r);
}

bool run_barrier(rc::Communicator& c, PyObject* const*) {
  NoGil nogil;
  return rc::sync_barrier(c);
}

struct SyncEntry {
  const char* name;  // the property's name, sync_<collective>
  const char* args;  // the positional arguments, for messages and the docstring
  int min_args, max_args;
  bool (*run)(rc::Communicator&, PyObject* const*);
};

constexpr int kMaxArgs = 4;
const SyncEntry kEntries[] = {
    {"sync_all_reduce", "(x, out, op)", 3, 3, &run_all_reduce},
    {"sync_broadcast", "(x, root)", 2, 2, &run_broadcast},
    {"sync_reduce_scatter", "(output, input, op)", 3, 3, &run_reduce_scatter},
    {"sync_all_gather", "(output, input)", 2, 2, &run_all_gather},
    {"sync_reduce", "(x, out, op, root)", 4, 4, &run_reduce},
    {"sync_all_to_all", "(output, input, output_splits=None, input_splits=None)", 2, 4, &run_all_to_all},
    {"sync_gather", "(output, input, root)", 3, 3, &run_gather},
    {"sync_scatter", "(output, input, root)", 3, 3, &run_scatter},
    {"sync_barrier", "()", 0, 0, &run_barrier},
};

// What a bound entry's capsule owns.
struct BoundEntry {
  std::shared_ptr<rc::Communicator> comm;
  const SyncEntry* entry;
};
constexpr const char* kBoundEntry = "ringcomm.sync_entry";

PyObject* call_entry(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* b = static_cast<BoundEntry*>(PyCapsule_GetPointer(self, kBoundEntry));
  if (b == nullptr) return nullptr;
  const SyncEntry& e = *b->entry;
  if (nargs < e.min_args || nargs > e.max_args) {
    if (e.min_args == e.max_args) {
      PyErr_Format(PyExc_TypeError, "%s%s takes %d positional arguments, %zd given", e.name, e.args, e.max_args, nargs);
    } else {
      PyErr_Format(PyExc_TypeError, "%s%s takes %d to %d positional arguments, %zd given", e.name, e.args,
                   e.min_args, e.max_args, nargs);
    }
    return nullptr;
  }
  PyObject* a[kMaxArgs];
  for (int i = 0; i < kMaxArgs; ++i) a[i] = i < nargs ? args[i] : Py_None;
  try {
    return PyBool_FromLong(e.run(*b->comm, a) ? 1 : 0);
  } catch (const rc::Error& err) {
    PyErr_SetString(error_class(err.code()).ptr(), err.what());
  } catch (py::error_already_set& err) {
    err.restore();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
  }
  return nullptr;
}

// One method definition per entry (the builtin's name and docstring); call_entry serves them all.
const std::array<PyMethodDef, std::size(kEntries)>& entry_defs() {
  static const auto defs = [] {
    std::array<PyMethodDef, std::size(kEntries)> d{};
    static std::array<std::string, std::size(kEntries)> docs;
    for (size_t i = 0; i < std::size(kEntries); ++i) {
      docs[i] = std::string(kEntries[i].name) + kEntries[i].args +
                " -> bool: True when the synchronous entry ran the call, False when it declined, having done nothing";
      d[i] = PyMethodDef{kEntries[i].name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_entry)),
                         METH_FASTCALL, docs[i].c_str()};
    }
    return d;
  }();
  return defs;
}

py::object bind_entry(std::shared_ptr<rc::Communicator> c, size_t i) {
  auto* b = new BoundEntry{std::move(c), &kEntries[i]};
  PyObject* cap = PyCapsule_New(b, kBoundEntry, [](PyObject* o) {
    delete static_cast<BoundEntry*>(PyCapsule_GetPointer(o, kBoundEntry));
  });
  if (cap == nullptr) {
    delete b;
    throw py::error_already_set();
  }
  PyObject* fn = PyCFunction_NewEx(const_cast<PyMethodDef*>(&entry_defs()[i]), cap, nullptr);
  Py_DECREF(cap);  // the function holds it
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace

void def_sync_methods(HostCommClass& cls) {
  for (size_t i = 0; i < std::size(kEntries); ++i) {
    const std::string doc = std::string("This communicator's synchronous entry, a builtin function ") + kEntries[i].name +
                            kEntries[i].args + " -> bool (True: ran the call; False: declined, nothing done)";
    cls.def_property_readonly(
        kEntries[i].name, [i](std::shared_ptr<rc::Communicator> c) { return bind_entry(std::move(c), i); },
        doc.c_str());
  }
  cls.def("_fast_handle",
          [](std::shared_ptr<rc::Communicator> c) { return reinterpret_cast<uintptr_t>(new FastHandle{std::move(c)}); },
          "A new handle of this communicator for RcFastApi (ringcomm/abi.h); the receiver releases it.");
}

void bind_sync(py::module_& m) {
  m.def("_fast_api", [] { return reinterpret_cast<uintptr_t>(&kFastApi); },
        "Address of the RcFastApi table (ringcomm/abi.h), valid while the process lives.");
}

}  // namespace rc_py
