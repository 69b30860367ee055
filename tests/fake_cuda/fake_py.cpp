// ringcomm._C_cuda_fake: the production CUDA communicator (comm/communicator_cuda.h and everything
// under it) linked against the fake CUDA runtime (fake_cudart.h) instead of libcudart, with the
// fake's controls and call log. Test-only; built beside ringcomm._C_cuda_test.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "comm_methods_py.h"
#include "cuda_methods_py.h"
#include "errors_py.h"
#include "fake_cudart.h"
#include "test/core_access.h"

#include "comm/communicator_cuda.h"
#include "device/ring_cuda.h"
#include "transport/gpu_ledger.h"

namespace py = pybind11;
using rc::CudaCommunicator;
using rc_py::ptr_of;

namespace {

// As ringcomm._C_cuda: a collective's launch argument is the caller's stream.
struct StreamLaunches {
  using Arg = uintptr_t;
  static rc::Launch coll(uintptr_t s) { return rc::Launch{false, ptr_of(s)}; }
  static rc::Launch p2p(uintptr_t s) { return rc::Launch{true, ptr_of(s)}; }
  static bool hands_back(uintptr_t) { return true; }
};

uintptr_t u(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A field as Python sees it: a pointer as its address, an enum as its number.
template <class T>
py::object field_value(const T& v) {
  if constexpr (std::is_pointer_v<T>) return py::int_(u(v));
  else if constexpr (std::is_enum_v<T>) return py::int_(static_cast<int64_t>(v));
  else return py::cast(v);
}

template <class S, class M>
std::pair<const char*, M S::*> field(const char* key, M S::*member) { return {key, member}; }

// d[key] = s.*member for each (key, member) of the table.
template <class S, class... M>
void put_fields(py::dict& d, const S& s, std::pair<const char*, M S::*>... table) {
  ((d[table.first] = field_value(s.*(table.second))), ...);
}

py::dict launch_dict(const fake_cuda::Launch& l) {
  using L = fake_cuda::Launch;
  using A = rc::dev::RingArgs;
  py::dict d;
  put_fields(d, l, field("kernel", &L::kernel), field("stream", &L::stream), field("replay", &L::replay),
             field("dtype", &L::dtype), field("op", &L::op));
  if (l.kernel == "ring")
    put_fields(d, l.ring, field("coll", &A::coll), field("rank", &A::rank), field("world", &A::world),
               field("nlanes", &A::nlanes), field("nslots", &A::nslots), field("count", &A::count),
               field("root", &A::root), field("header_dtype", &A::dtype), field("header_op", &A::op),
               field("slot_stride", &A::slot_stride), field("in", &A::in), field("out", &A::out),
               field("self", &A::self), field("right", &A::right), field("left", &A::left),
               field("recv_slots", &A::recv_slots), field("send_slots", &A::send_slots),
               field("state", &A::state), field("status", &A::status), field("abort", &A::abort),
               field("timeout_ns", &A::timeout_ns));
  return d;
}

}  // namespace

PYBIND11_MODULE(_C_cuda_fake, m) {
  m.doc() = "the production CUDA communicator over a fake CUDA runtime that records its calls (tests only)";
  register_error_translator(true);
  rc_py::bind_work(m, true);
  // module_local: ringcomm._C_cuda binds the same C++ class (both may be imported in one process).
  py::class_<CudaCommunicator, std::shared_ptr<CudaCommunicator>> comm(m, "Communicator", py::module_local());
  rc_py::def_cuda_setup(comm);
  rc_py::def_errored(comm);
  comm.def("headers_posted", &CudaCommunicator::headers_posted)
      // Number the next collective (and the board's next exchange) last + 1: before any call.
      .def("set_last_seq", [](CudaCommunicator& c, uint64_t last) { rc::CommCoreTestAccess::set_last_seq(c, last); })
      .def("ring_registered", [](CudaCommunicator& c) {
             rc::DeviceRing* r = c.device_ring();
             return r ? r->registered() : std::vector<std::pair<uintptr_t, uintptr_t>>{};
           });
  rc_py::def_core_methods<StreamLaunches>(comm);
  rc_py::def_cuda_methods(comm);

  m.def("calls", [] {
    py::list out;
    using C = fake_cuda::Call;
    for (const auto& c : fake_cuda::calls()) {
      py::dict d;
      put_fields(d, c, field("name", &C::name), field("stream", &C::stream), field("capturing", &C::capturing),
                 field("replay", &C::replay), field("graph", &C::graph), field("arg", &C::arg));
      out.append(d);
    }
    return out;
  });
  m.def("launches", [] {
    py::list out;
    for (const auto& l : fake_cuda::launches()) out.append(launch_dict(l));
    return out;
  });
  m.def("clear", &fake_cuda::clear);
  m.def("ring_kernels", [] {
    std::vector<uintptr_t> v;
    for (const void* k : rc::ring_kernels()) v.push_back(u(k));
    return v;
  });
  m.def("new_stream", [] { return u(fake_cuda::new_stream()); });
  m.def("stream_id", [](uintptr_t s) { return fake_cuda::stream_id(ptr_of(s)); });
  m.def("device_alloc", [](uint64_t n) { return u(fake_cuda::device_alloc(n)); });
  m.def("begin_capture", [](uintptr_t s) { fake_cuda::begin_capture(ptr_of(s)); });
  m.def("end_capture", [](uintptr_t s) { return fake_cuda::end_capture(ptr_of(s)); });
  m.def("replay", &fake_cuda::replay);
  m.def("read_u32", [](uintptr_t a) {
    uint32_t v;
    std::memcpy(&v, ptr_of(a), 4);
    return v;
  });
  // What a failing lane of the kernel writes (device/ring_proto.h's fail()): the fields, then reason.
  m.def("write_status", [](uintptr_t a, uint32_t reason, int rank, int peer, int step, int lane, uint64_t seq,
                           uint64_t expected, uint64_t seen, uint32_t field) {
    auto* s = static_cast<rc::dev::Status*>(ptr_of(a));
    s->claim = 1;
    s->rank = rank;
    s->peer = peer;
    s->step = step;
    s->lane = lane;
    s->field = field;
    s->seq = seq;
    s->expected = expected;
    s->seen = seen;
    rc::dev::SysU32(s->reason).store(reason, cuda::std::memory_order_release);
  });
  // The production GPU ledger (transport/gpu_ledger.h), driven directly.
  m.def("ledger_reserve", [](const std::string& dir, const std::string& uuid, uint64_t owner, bool mps, int blocks,
                             int64_t capacity) {
    rc::GpuLedgerLook l;
    bool ok = false;
    {
      py::gil_scoped_release nogil;
      ok = rc::GpuLedger(dir, uuid).reserve(owner, mps, blocks, 0, 1, capacity, &l);
    }
    return py::make_tuple(ok, l.held, l.holders);
  });
  m.def("ledger_release", [](const std::string& dir, const std::string& uuid, uint64_t owner) {
    rc::GpuLedger(dir, uuid).release(owner);
  });
  m.def("ledger_look", [](const std::string& dir, const std::string& uuid, bool mps, uint64_t owner) {
    const rc::GpuLedgerLook l = rc::GpuLedger(dir, uuid).look(mps, owner);
    return py::make_tuple(l.held, l.holders);
  });
  m.def("ledger_path", [](const std::string& dir, const std::string& uuid) { return rc::GpuLedger(dir, uuid).path(); });
}
