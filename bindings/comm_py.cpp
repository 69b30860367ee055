// Communicator and Work bindings of ringcomm._C (what both communicators share:
// bindings/comm_methods_py.h), the pure ring schedule and the collective codes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>

#include "comm_methods_py.h"
#include "sync_py.h"

#include "algo/ring_schedule.h"
#include "comm/communicator.h"
#include "common/knobs.h"
#include "comm/selection.h"

namespace py = pybind11;
using rc::Communicator;

namespace {

// The host communicator's launch argument: async_op (collectives and send/recv alike).
struct HostLaunches {
  using Arg = bool;
  static rc::Launch coll(bool async) { return rc::Launch{async, nullptr}; }
  static rc::Launch p2p(bool async) { return rc::Launch{async, nullptr}; }
  static bool hands_back(bool async) { return async; }  // a synchronous call has completed
};

// One dict per record: seq, collective, algorithm, protocol, store, bytes, ok, and each phase's ns (None: did not happen).
py::list trace_list(const std::vector<rc::TraceRecord>& recs) {
  py::list out;
  for (const rc::TraceRecord& r : recs) {
    py::dict d;
    d["seq"] = r.seq;
    d["collective"] = rc::coll_name(static_cast<rc::Coll>(r.coll));
    d["algorithm"] = r.algo;
    d["protocol"] = r.proto;
    d["store"] = r.store;
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

void bind_comm(py::module_& m, bool module_local) {
  rc_py::bind_work(m, module_local);

  py::class_<Communicator, std::shared_ptr<Communicator>> comm(m, "Communicator", py::module_local(module_local));
  comm.def(py::init<int, int, double>(), py::arg("rank"), py::arg("world_size"), py::arg("timeout") = 0.0)
      .def(py::init<int, int, double, const rc::Knobs&>(), py::arg("rank"), py::arg("world_size"),
           py::arg("timeout"), py::arg("knobs"))
      .def("create", &Communicator::create, rc_py::ReleaseGil())
      .def("connect", &Communicator::connect, rc_py::ReleaseGil())
      .def_property_readonly("closed_reason", &Communicator::closed_reason)
      .def_property_readonly("profile_hash", [](const Communicator& c) {
             char s[20];
             std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(c.cost_profile().hash));
             return std::string(s);
           }, "The hash of the cost model's profile this rank loaded (compared across ranks at init).")
      .def_property_readonly("profile_source", [](const Communicator& c) { return c.cost_profile().source; })
      .def("trace", [](const Communicator& c) { return trace_list(c.trace()); },
           "The last RINGCOMM_TRACE collectives' phase timestamps (CLOCK_MONOTONIC ns), oldest first.")
      .def("describe_wait", &Communicator::describe_wait,
           "The wait policy in words: mode, spin and yield budgets, ranks against CPUs.")
      .def("wait_stats",
           [](const Communicator& c) {
             const auto st = c.wait_stats();
             return py::dict(py::arg("slept") = st.slept, py::arg("yields_lost") = st.yields_lost,
                             py::arg("colocated") = st.colocated, py::arg("descheduled") = st.descheduled,
                             py::arg("unpinned_spins") = st.unpinned_spins, py::arg("load_over") = st.load_over,
                             py::arg("unpinned_backoffs") = st.unpinned_backoffs);
           },
           "Counters of this rank's waits' slow paths: futex sleeps, sched_yields that lost the CPU, "
           "waits that found their peer on their own CPU, long spins that lost the CPU, unpinned ranks' "
           "long spins, load checks that found the node oversubscribed, unpinned waits that skipped the long "
           "spin after one lost its CPU.")
      .def("store_stats",
           [](const Communicator& c) -> py::object {
             const rc::StoreAdapt* a = c.store_adapt();
             if (a == nullptr) return py::none();
             const auto st = a->stats();
             return py::dict(py::arg("current") = rc::store_name(a->current()), py::arg("eligible") = st.eligible,
                             py::arg("explorations") = st.explorations, py::arg("switches") = st.switches);
           },
           "RINGCOMM_STREAM=adapt's state: the store in use, the calls it decided, the calls run under "
           "the other store to measure it, and the switches; None where the policy does not run.")
      .def("abort", &Communicator::abort, py::arg("reason") = "", rc_py::ReleaseGil())
      .def("set_timeout", &Communicator::set_timeout, py::arg("seconds"))
      .def("set_cpus", &Communicator::set_cpus, py::arg("threads"), py::arg("min_bytes"), py::arg("where") = "", py::arg("ranks_sharing") = 0,
           py::arg("node_ranks") = 0,
           "Before connect(): split copies and reductions of >= min_bytes over `threads` threads (1: none); "
           "`where` (the rank's placement) ends the INFO line; `ranks_sharing` (the local ranks on this "
           "rank's CPUs, where ringcomm pinned them) and `node_ranks` (the ranks on this node, of every "
           "group) inform the wait policy (0: not known).")
      .def_property_readonly("cpu_threads", &Communicator::cpu_threads)
      .def_property_readonly("pool_spin_us", &Communicator::pool_spin_us,
                             "The split copies' pool's idle spin (us), -1 without a pool.");
  rc_py::def_errored(comm);
  rc_py::def_core_methods<HostLaunches>(comm);
  rc_py::def_sync_methods(comm);
  rc_py::bind_sync(m);

  // Address of a C-contiguous buffer-protocol object (numpy arrays): (address, nbytes), or None
  // when the object is not C-contiguous or (writable=True) is read-only. Cheaper than
  // ndarray.ctypes.data; the caller keeps the object alive.
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

  m.def("chunk_bounds", [](int64_t count, int n) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int k = 0; k < n; ++k) v.emplace_back(rc::ring::chunk_offset(count, n, k), rc::ring::chunk_count(count, n, k));
    return v;
  });
  py::dict coll_codes;
#define RC_COLL_CODE_(name, code, str, reduces) coll_codes[str] = code;
  RC_COLLECTIVES(RC_COLL_CODE_)
#undef RC_COLL_CODE_
  m.attr("COLL_CODES") = coll_codes;

  // Tests and tools: the selection (comm/selection.h) a communicator of `world_size` ranks makes
  // for `collective` of `bytes` under the current knobs; device "host" or "cuda" (its caps).
  m.def("_select", [](const std::string& collective, int64_t bytes, int world_size, const std::string& device, bool cma) {
    rc::Coll coll = rc::Coll::kRejected;
#define RC_COLL_BY_NAME_(name, code, str, reduces) \
    if (collective == str) coll = rc::Coll::k##name;
    RC_COLLECTIVES(RC_COLL_BY_NAME_)
#undef RC_COLL_BY_NAME_
    RC_CHECK(coll != rc::Coll::kRejected, InvalidArgument, "ringcomm: unknown collective '" << collective << "'");
    RC_CHECK(device == "host" || device == "cuda", InvalidArgument, "ringcomm: device must be host or cuda");
    const rc::Knobs knobs = rc::Knobs::read();
    rc::DeviceCaps caps = device == "host"
        ? rc::HostDevice::caps_for(rc::ShmConfig::host_from_knobs(knobs, world_size, 1.0)) : rc::DeviceCaps{};
    caps.cma = device == "host" && cma;
    const rc::Selection s = rc::select(coll, bytes, world_size, rc::SelectionKnobs::from_knobs(knobs), caps);
    return py::make_tuple(rc::algo_name(s.algo), rc::proto_name(s.proto), rc::store_name(s.store));
  }, py::arg("collective"), py::arg("bytes"), py::arg("world_size"), py::arg("device") = "host", py::arg("cma") = false,
     "(algorithm, protocol, store) names the selection picks (csrc/comm/selection.h); cma: the host device's "
     "ranks may read each other's memory (its probe at connect, transport/shm_cma.h)");
}
