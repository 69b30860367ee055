// ringcomm._C_test: the communicator's numbering (CommCoreTestAccess) and forged header
// (comm/test_hooks.h), the test knobs (common/test_knobs.def), the pure ring
// schedule, the header board's word, the segment's size, the slots' walk, and the ABI tables as
// compiled.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "algo/ring_schedule.h"
#include "comm/communicator.h"
#include "comm/core.h"
#include "comm/test_hooks.h"
#include "test/core_access.h"
#include "common/errors.h"
#include "common/knobs.h"
#include "common/test_knobs.h"
#include "ringcomm/abi.h"
#include "transport/cpu_facts.h"
#include "transport/shm_config.h"
#include "transport/shm_slots.h"
#include "transport/shm_types.h"

namespace py = pybind11;

void bind_test_comm(py::module_& m) {
  m.def("slot_walk", &rc::slot_walk, py::arg("lap"), py::arg("bytes"), py::arg("span"),
        "The push channels' walk (transport/shm_slots.h): a piece's offset past the placement's.");
  m.def("set_last_seq", [](rc::Communicator& c, uint64_t last) { rc::CommCoreTestAccess::set_last_seq(c, last); },
        py::arg("comm"), py::arg("last"));
  // The next collective's header (a rejection excepted) carries these counts instead of the
  // checked ones: a forged peer header, which the public API cannot produce. Only this module's
  // core checks for it, so the communicator must be this module's (tests/hooked_build.py).
  m.def("forge_next_header", [](py::object comm, int64_t count, int64_t count2) {
    const py::object own = py::module_::import("ringcomm._C_test").attr("Communicator");
    RC_CHECK(py::isinstance(comm, own), InvalidArgument,
             "forge_next_header: the communicator is not ringcomm._C_test's (its core has no hook): "
             "load the test build as ringcomm._C first (tests/hooked_build.py)");
    rc::CommCore& c = comm.cast<rc::Communicator&>();
    rc::test_hooks::set_next_header(&c, [count, count2](rc::CollHeader& h) {
      h.count = count;
      h.count2 = count2;
    });
  }, py::arg("comm"), py::arg("count"), py::arg("count2"));
  // The test knobs (common/test_knobs.def) as the registry lists knobs: {name, field, type,
  // default, doc}.
  m.def("test_knobs", [] {
    py::list out;
    for (const auto& k : rc::test_knob_table()) {
      py::dict d;
      d["name"] = k.name;
      d["field"] = k.field;
      d["type"] = rc::knob_type_name(k.type);
      d["default"] = k.default_value;
      d["doc"] = k.doc;
      out.append(d);
    }
    return out;
  });

  // The header board's 32-bit word for collective `seq` (its entry is word & 1).
  m.def("board_seq_of", &rc::board_seq_of, py::arg("seq"));
  // Bytes of one rank's shared-memory segment for world_size ranks with the current knobs (the
  // host communicator's geometry); computes only, creates nothing.
  m.def("shm_segment_bytes", [](int world_size) {
    return rc::footprint_bytes(world_size, rc::ShmConfig::host_from_knobs(rc::Knobs::read(), world_size, 0));
  }, py::arg("world_size"));

  // The pure ring schedule (algo/ring_schedule.h) of rank r.
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
  m.def("ar_chunk_bounds", [](int64_t count, int n, int64_t esize) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int k = 0; k < n; ++k)
      v.emplace_back(rc::ring::ar_chunk_offset(count, n, esize, k), rc::ring::ar_chunk_count(count, n, esize, k));
    return v;
  }, py::arg("count"), py::arg("world_size"), py::arg("esize"),
     "all_reduce's chunks (offset, count) per rank: gloo's ring segmentation (ring_schedule.h).");

  // The wait policy's CPU facts (transport/cpu_facts.h) read from files under injected roots,
  // and the decisions on them.
  m.def("cpu_facts", [](const std::string& proc, const std::string& sys, const std::string& cgroup, int mask_cpus) {
    const rc::CpuFactSources src{proc, sys, cgroup};
    const rc::CpuFacts f = rc::read_cpu_facts(src, mask_cpus);
    py::dict d;
    d["mask_cpus"] = f.mask_cpus;
    d["online"] = f.online;
    d["quota_cpus"] = f.quota_cpus;
    d["usable"] = rc::usable_cpus(f);
    const rc::NodeLoad load = rc::read_load(src);
    d["runnable"] = load.running;
    d["load_avg1"] = load.avg1;
    return d;
  }, py::arg("proc"), py::arg("sys"), py::arg("cgroup"), py::arg("mask_cpus"));
  m.def("usable_cpus", [](int mask_cpus, int online, double quota_cpus) {
    rc::CpuFacts f;
    f.mask_cpus = mask_cpus;
    f.online = online;
    f.quota_cpus = quota_cpus;
    return rc::usable_cpus(f);
  }, py::arg("mask_cpus"), py::arg("online"), py::arg("quota_cpus"));
  m.def("unpinned_own_cpus", &rc::unpinned_own_cpus, py::arg("ranks"), py::arg("usable"), py::arg("spare"));
  m.def("load_oversubscribed", [](int runnable, double avg1, int usable, int slack, double avg_slack) {
    return rc::load_oversubscribed(rc::NodeLoad{runnable, avg1}, usable, slack, avg_slack);
  }, py::arg("runnable"), py::arg("avg1"), py::arg("usable"), py::arg("slack"), py::arg("avg_slack"));
  m.def("abi_tables", [] {
    // The lists of ringcomm/abi.h as the C++ is compiled with them (tests compare ringcomm.core.tables,
    // which parses the header, against these).
    py::list dtypes, ops;
#define RC_ABI_DTYPE_ROW_(name, code, bytes, str, kind, dl) dtypes.append(py::make_tuple(str, code, bytes, kind, dl));
    RC_DTYPES(RC_ABI_DTYPE_ROW_)
#undef RC_ABI_DTYPE_ROW_
#define RC_ABI_OP_ROW_(name, code, str, kinds) ops.append(py::make_tuple(str, code, kinds));
    RC_REDUCE_OPS(RC_ABI_OP_ROW_)
#undef RC_ABI_OP_ROW_
    py::dict d;
    d["dtypes"] = dtypes;
    d["ops"] = ops;
    d["fast_api_version"] = RC_FAST_API_VERSION;
    return d;
  });
}
