// The cost model (comm/cost_model.h) for ringcomm.apps.tune and the tools: profiles as dicts and the
// modelled choice. The test module adds the modelled seconds and halving_doubling's per-rank work
// (bindings/test/model_py.cpp), with profiles parsed here (model_py.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>

#include "algo/context.h"
#include "comm/cost_model.h"
#include "comm/selection.h"
#include "common/errors.h"
#include "common/knobs.h"
#include "model_py.h"

namespace py = pybind11;

namespace {

const char* const kParams[] = {"alpha_s", "alpha_shared_s", "slot_s", "copy_Bps", "reduce_Bps", "ll_Bps", "cpus"};

double* field(rc::CostProfile& p, const std::string& name) {
  if (name == "alpha_s") return &p.alpha_s;
  if (name == "alpha_shared_s") return &p.alpha_shared_s;
  if (name == "slot_s") return &p.slot_s;
  if (name == "copy_Bps") return &p.copy_Bps;
  if (name == "reduce_Bps") return &p.reduce_Bps;
  if (name == "ll_Bps") return &p.ll_Bps;
  if (name == "cpus") return &p.cpus;
  RC_THROW(InvalidArgument, "ringcomm: '" << name << "' is not a profile parameter");
}

std::string hex(uint64_t h) {
  char s[20];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(h));
  return s;
}

py::dict to_dict(const rc::CostProfile& p) {
  py::dict params;
  rc::CostProfile q = p;
  for (const char* k : kParams) params[k] = *field(q, k);
  py::dict d;
  d["params"] = params;
  d["hash"] = hex(p.hash);
  d["source"] = p.source;
  return d;
}

}  // namespace

namespace rc_py {

rc::CostProfile from_params(const py::object& params) {
  if (params.is_none()) return rc::profile_at(rc::read_knob<rc::KnobId::profile>());
  rc::CostProfile p;
  py::dict d = params.cast<py::dict>();
  for (const char* k : kParams) {
    RC_CHECK(d.contains(k), InvalidArgument, "ringcomm: profile params lack '" << k << "'");
    *field(p, k) = d[k].cast<double>();
  }
  p.hash = rc::profile_hash(p);
  p.source = "params";
  return p;
}

}  // namespace rc_py

using rc_py::from_params;

void bind_model(py::module_& m) {
  m.attr("PROFILE_VERSION") = rc::kProfileVersion;
  py::tuple names(std::size(kParams));
  for (size_t i = 0; i < std::size(kParams); ++i) names[i] = kParams[i];
  m.attr("PROFILE_PARAMS") = names;
  m.def("_profile", [](const py::object& params) { return to_dict(from_params(params)); }, py::arg("params") = py::none(),
        "The profile (params, hash, source) of `params`, or RINGCOMM_PROFILE's (the defaults when unset).");
  m.def("_default_profile", [] { return to_dict(rc::default_profile()); });
  m.def("_load_profile", [](const std::string& path) { return to_dict(rc::load_profile(path)); }, py::arg("path"));
  m.def("_model_choose",
        [](int64_t bytes, int world, int64_t ll_bytes, bool header_in_slot, const py::object& params,
           int64_t ring_piece, int64_t far_piece, int64_t far_depth) {
          const rc::ModelChoice c = rc::model_choose(from_params(params), bytes, world,
                                                     rc::PieceSizes{ring_piece, far_piece, far_depth}, ll_bytes,
                                                     header_in_slot);
          return py::make_tuple(rc::algo_name(c.algo), rc::proto_name(c.proto));
        },
        py::arg("bytes"), py::arg("world_size"), py::arg("ll_bytes"), py::arg("header_in_slot") = true,
        py::arg("params") = py::none(), py::arg("ring_piece") = rc::PieceSizes{}.ring,
        py::arg("far_piece") = rc::PieceSizes{}.far, py::arg("far_depth") = rc::PieceSizes{}.far_depth,
        "(algorithm, protocol) the cost model picks (comm/cost_model.h)");
}
