// Communicator and Work bindings. Buffers arrive as integer addresses (the Python layer owns
// validation and keeps the arrays alive until the work completes); every call that may wait
// releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "algo/ring_schedule.h"
#include "comm/communicator.h"
#include "comm/header_exchange.h"
#include "comm/store_policy.h"

namespace py = pybind11;
using rc::Communicator;
using rc::DType;
using rc::ReduceOp;

namespace {

inline void* P(uintptr_t a) { return reinterpret_cast<void*>(a); }
inline DType D(int d) { return static_cast<DType>(d); }
inline ReduceOp O(int o) { return static_cast<ReduceOp>(o); }
using GIL = py::call_guard<py::gil_scoped_release>;
inline rc::Launch A(bool async) { return rc::Launch{async, nullptr}; }

// One dict per record: seq, collective, algorithm, bytes, ok, and each phase's ns (None: did not happen).
py::list trace_list(const std::vector<rc::TraceRecord>& recs) {
  py::list out;
  for (const rc::TraceRecord& r : recs) {
    py::dict d;
    d["seq"] = r.seq;
    d["collective"] = rc::coll_name(static_cast<rc::Coll>(r.coll));
    d["algorithm"] = r.algo;
    d["bytes"] = r.bytes;
    d["ok"] = r.ok;
    for (int p = 0; p < rc::kTracePhases; ++p) {
      d[rc::trace_phase_name(p)] = r.t[p] != 0 ? py::object(py::int_(r.t[p])) : py::object(py::none());
    }
    out.append(std::move(d));
  }
  return out;
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<rc::Work, std::shared_ptr<rc::Work>>(m, "Work")
      .def("wait", &rc::Work::wait, py::arg("timeout") = -1.0, GIL())
      .def("is_completed", &rc::Work::is_completed, GIL())
      .def("error_code", &rc::Work::error_code)
      .def("error_message", &rc::Work::error_message)
      .def_property_readonly("op", &rc::Work::op)
      .def_property_readonly("seq", &rc::Work::seq);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init<int, int, double>(), py::arg("rank"), py::arg("world_size"), py::arg("timeout") = 0.0)
      .def("create", &Communicator::create, GIL())
      .def("connect", &Communicator::connect, GIL())
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("world_size", &Communicator::world)
      .def_property_readonly("timeout", &Communicator::timeout)
      .def_property_readonly("closed", &Communicator::closed)
      .def_property_readonly("closed_reason", &Communicator::closed_reason)
      .def("next_seq", &Communicator::next_seq)
      .def("_set_last_seq_for_test", &Communicator::set_last_seq_for_test)
      .def("_forge_next_header_for_test", &Communicator::forge_next_header_for_test, py::arg("count"),
           py::arg("count2"))
      .def("all_reduce", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, bool a) {
             return c.all_reduce(P(in), P(out), n, D(d), O(o), A(a));
           }, GIL())
      .def("reduce_scatter", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, bool a) {
             return c.reduce_scatter(P(in), P(out), n, D(d), O(o), A(a));
           }, GIL())
      .def("all_gather", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t nin, int64_t nout, int d, bool a) {
             return c.all_gather(P(in), P(out), nin, nout, D(d), A(a));
           }, GIL())
      .def("broadcast", [](Communicator& c, uintptr_t buf, int64_t n, int d, int root, bool a) {
             return c.broadcast(P(buf), n, D(d), root, A(a));
           }, GIL())
      .def("reduce", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, int root, bool a) {
             return c.reduce(P(in), P(out), n, D(d), O(o), root, A(a));
           }, GIL())
      .def("barrier", [](Communicator& c, bool a) { return c.barrier(A(a)); }, GIL())
      .def("all_to_all", [](Communicator& c, uintptr_t in, uintptr_t out, std::vector<int64_t> sc,
                            std::vector<int64_t> rcn, int d, bool a) {
             return c.all_to_all(P(in), P(out), std::move(sc), std::move(rcn), D(d), A(a));
           }, GIL())
      .def("gather", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, bool a) {
             return c.gather(P(in), P(out), n, D(d), root, A(a));
           }, GIL())
      .def("scatter", [](Communicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, bool a) {
             return c.scatter(P(in), P(out), n, D(d), root, A(a));
           }, GIL())
      .def("reject", [](Communicator& c, int coll) { c.reject(static_cast<rc::Coll>(coll)); }, GIL())
      .def("send", [](Communicator& c, uintptr_t buf, int64_t bytes, int dst, uint64_t tag, bool a) {
             return c.send(P(buf), bytes, dst, tag, A(a));
           }, GIL())
      .def("recv", [](Communicator& c, uintptr_t buf, int64_t bytes, int src, uint64_t tag, bool a) {
             return c.recv(P(buf), bytes, src, tag, A(a));
           }, GIL())
      .def("close", &Communicator::close, GIL())
      .def("trace", [](const Communicator& c) { return trace_list(c.trace()); },
           "The last RINGCOMM_TRACE collectives' phase timestamps (CLOCK_MONOTONIC ns), oldest first.")
      .def("abort", &Communicator::abort, py::arg("reason") = "", GIL())
      .def("set_timeout", &Communicator::set_timeout, py::arg("seconds"))
      .def("errored", [](Communicator& c) -> py::object {
             // (ErrorCode, message) of the first error that made the communicator unusable, or None.
             std::exception_ptr e = c.errored();
             if (!e) return py::none();
             std::string msg;
             const rc::ErrorCode code = rc::error_code_of(e, &msg);
             return py::make_tuple(static_cast<int>(code), msg);
           });

  // Address of a C-contiguous buffer-protocol object (numpy arrays): (address, nbytes), or None
  // when the object is not C-contiguous or (writable=True) is read-only. Cheaper than
  // ndarray.ctypes.data; the caller keeps the object alive.
  // Test-only: the header board's 32-bit word for collective `seq` (its entry is word & 1).
  m.def("_board_seq_of", &rc::board_seq_of, py::arg("seq"));
  m.def("buffer_address", [](py::handle obj, bool writable) -> py::object {
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
      PyErr_Clear();
      return py::none();
    }
    py::tuple t = py::make_tuple(reinterpret_cast<uintptr_t>(view.buf), static_cast<int64_t>(view.len));
    PyBuffer_Release(&view);
    return std::move(t);
  });

  // The pure ring schedule, for tests and for other transports' cross-checks.
  m.def("ring_schedule", [](int n, int r, int shift) {
    py::dict d;
    py::list rs_s, rs_r, ag_s, ag_r;
    for (int s = 0; s < n - 1; ++s) {
      rs_s.append(rc::ring::rs_send(r, s, n, shift));
      rs_r.append(rc::ring::rs_recv(r, s, n, shift));
      ag_s.append(rc::ring::ag_send(r, s, n, shift));
      ag_r.append(rc::ring::ag_recv(r, s, n, shift));
    }
    d["rs_send"] = rs_s;
    d["rs_recv"] = rs_r;
    d["ag_send"] = ag_s;
    d["ag_recv"] = ag_r;
    d["owner"] = rc::ring::owner(r, n, shift);
    d["right"] = rc::ring::right(r, n);
    d["left"] = rc::ring::left(r, n);
    return d;
  }, py::arg("world_size"), py::arg("rank"), py::arg("shift") = 0);
  m.def("chunk_bounds", [](int64_t count, int n) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int k = 0; k < n; ++k) v.emplace_back(rc::ring::chunk_offset(count, n, k), rc::ring::chunk_count(count, n, k));
    return v;
  });
  m.def("ar_chunk_bounds", [](int64_t count, int n, int64_t esize) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int k = 0; k < n; ++k)
      v.emplace_back(rc::ring::ar_chunk_offset(count, n, esize, k), rc::ring::ar_chunk_count(count, n, esize, k));
    return v;
  }, py::arg("count"), py::arg("world_size"), py::arg("esize"),
     "all_reduce's chunks (offset, count) per rank: gloo's ring segmentation (ring_schedule.h).");
  m.attr("COLL_CODES") = py::dict(
      py::arg("all_reduce") = 1, py::arg("reduce_scatter") = 2, py::arg("all_gather") = 3, py::arg("broadcast") = 4,
      py::arg("reduce") = 5, py::arg("barrier") = 6, py::arg("all_to_all") = 7, py::arg("gather") = 8,
      py::arg("scatter") = 9);

  // Tests only: the policy that picks cached or streaming stores per size class.
  py::class_<rc::StorePolicy>(m, "_StorePolicy")
      .def(py::init<>())
      .def("choose", [](rc::StorePolicy& p, uint64_t bytes, int kind) {
        const rc::StorePolicy::Choice c = p.choose(bytes, kind);
        return py::make_tuple(c.stream, c.cls);
      }, py::arg("bytes"), py::arg("kind") = 0, "(stream, class or -1 when not measured)")
      .def("record", [](rc::StorePolicy& p, bool stream, int cls, uint64_t bytes, int64_t ns) {
        rc::StorePolicy::Choice c;
        c.stream = stream;
        c.cls = cls;
        p.record(c, bytes, ns);
      }, py::arg("stream"), py::arg("cls"), py::arg("bytes"), py::arg("ns"));
}
