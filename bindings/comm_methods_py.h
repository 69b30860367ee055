// The bindings both communicators share (ringcomm._C.Communicator over rc::Communicator,
// ringcomm._C_cuda.Communicator over rc::CudaCommunicator: one communicator core, comm/core.h),
// written once. Buffers arrive as integer addresses (the Python layer owns validation and keeps
// the arrays alive until the work completes); every call that may wait releases the GIL. The
// last argument of every collective and of send/recv says how it is launched; a Launches policy
// turns it into an rc::Launch, and says whether a collective hands its Work back to Python:
//   struct Launches { using Arg = ...; static rc::Launch coll(Arg); static rc::Launch p2p(Arg);
//                     static bool hands_back(Arg); };
// A collective that does not hand it back returns None: the call has completed (or raised) and
// the caller has no use for a handle, so no Python object is made for it.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/core.h"
#include "common/errors.h"

namespace rc_py {

namespace py = pybind11;

inline void* ptr_of(uintptr_t a) { return reinterpret_cast<void*>(a); }
inline rc::DType dtype_of(int d) { return static_cast<rc::DType>(d); }
inline rc::ReduceOp op_of(int o) { return static_cast<rc::ReduceOp>(o); }
using ReleaseGil = py::call_guard<py::gil_scoped_release>;

using WorkClass = py::class_<rc::Work, std::shared_ptr<rc::Work>>;

/// The one Work type (comm/work.h). module_local: ringcomm._C_cuda binds it again for itself, so
/// that it does not depend on ringcomm._C being imported first.
inline WorkClass bind_work(py::module_& m, bool module_local) {
  WorkClass w(m, "Work", py::module_local(module_local));
  w.def("wait", &rc::Work::wait, py::arg("timeout") = -1.0, ReleaseGil())
      .def("is_completed", &rc::Work::is_completed, ReleaseGil())
      .def("error_code", &rc::Work::error_code)
      .def("source", &rc::Work::source)
      .def("error_message", &rc::Work::error_message)
      .def_property_readonly("op", &rc::Work::op)
      .def_property_readonly("seq", &rc::Work::seq);
  return w;
}

/// `w`, or None (nullptr) when the launch `a` does not hand collectives' Work back.
template <class Launches>
std::shared_ptr<rc::Work> handed_back(typename Launches::Arg a, std::shared_ptr<rc::Work> w) {
  return Launches::hands_back(a) ? std::move(w) : nullptr;
}

/// The core's properties, collectives, point-to-point calls and close() on a communicator class.
template <class Launches, class Comm>
void def_core_methods(py::class_<Comm, std::shared_ptr<Comm>>& cls) {
  using A = typename Launches::Arg;
  cls.def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::world)
      .def_property_readonly("timeout", &Comm::timeout)
      .def_property_readonly("closed", &Comm::closed)
      .def("next_seq", &Comm::next_seq)
      .def("all_reduce", [](Comm& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, A a) {
             return handed_back<Launches>(a, c.all_reduce(ptr_of(in), ptr_of(out), n, dtype_of(d), op_of(o), Launches::coll(a)));
           }, ReleaseGil())
      .def("reduce_scatter", [](Comm& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, A a) {
             return handed_back<Launches>(a, c.reduce_scatter(ptr_of(in), ptr_of(out), n, dtype_of(d), op_of(o), Launches::coll(a)));
           }, ReleaseGil())
      .def("all_gather", [](Comm& c, uintptr_t in, uintptr_t out, int64_t nin, int64_t nout, int d, A a) {
             return handed_back<Launches>(a, c.all_gather(ptr_of(in), ptr_of(out), nin, nout, dtype_of(d), Launches::coll(a)));
           }, ReleaseGil())
      .def("broadcast", [](Comm& c, uintptr_t buf, int64_t n, int d, int root, A a) {
             return handed_back<Launches>(a, c.broadcast(ptr_of(buf), n, dtype_of(d), root, Launches::coll(a)));
           }, ReleaseGil())
      .def("reduce", [](Comm& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, int root, A a) {
             return handed_back<Launches>(a, c.reduce(ptr_of(in), ptr_of(out), n, dtype_of(d), op_of(o), root, Launches::coll(a)));
           }, ReleaseGil())
      .def("barrier", [](Comm& c, A a) { return handed_back<Launches>(a, c.barrier(Launches::coll(a))); }, ReleaseGil())
      .def("all_to_all", [](Comm& c, uintptr_t in, uintptr_t out, std::vector<int64_t> sc, std::vector<int64_t> rcn,
                            int d, A a) {
             return handed_back<Launches>(a, c.all_to_all(ptr_of(in), ptr_of(out), std::move(sc), std::move(rcn), dtype_of(d),
                                 Launches::coll(a)));
           }, ReleaseGil())
      .def("gather", [](Comm& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, A a) {
             return handed_back<Launches>(a, c.gather(ptr_of(in), ptr_of(out), n, dtype_of(d), root, Launches::coll(a)));
           }, ReleaseGil())
      .def("scatter", [](Comm& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, A a) {
             return handed_back<Launches>(a, c.scatter(ptr_of(in), ptr_of(out), n, dtype_of(d), root, Launches::coll(a)));
           }, ReleaseGil())
      .def("reject", [](Comm& c) { c.reject(); }, ReleaseGil())
      .def("send", [](Comm& c, uintptr_t buf, int64_t bytes, int dst, uint64_t tag, A a) {
             return c.send(ptr_of(buf), bytes, dst, tag, Launches::p2p(a));
           }, ReleaseGil())
      .def("recv", [](Comm& c, uintptr_t buf, int64_t bytes, int src, uint64_t tag, A a) {
             return c.recv(ptr_of(buf), bytes, src, tag, Launches::p2p(a));
           }, ReleaseGil())
      .def("close", &Comm::close, ReleaseGil());
}

/// errored(): (ErrorCode, message) of the first error that made the communicator unusable, or None.
template <class Comm>
void def_errored(py::class_<Comm, std::shared_ptr<Comm>>& cls) {
  cls.def("errored", [](Comm& c) -> py::object {
    std::exception_ptr e = c.errored();
    if (!e) return py::none();
    std::string msg;
    const rc::ErrorCode code = rc::error_code_of(e, &msg);
    return py::make_tuple(static_cast<int>(code), msg);
  });
}

}  // namespace rc_py
