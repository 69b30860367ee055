// ringcomm._C_test: the cost model's modelled seconds and halving_doubling's per-rank work
// (comm/cost_model.h), with profiles parsed as ringcomm._C parses them (bindings/model_py.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "algo/context.h"
#include "comm/cost_model.h"
#include "comm/selection.h"
#include "common/errors.h"
#include "model_py.h"

namespace py = pybind11;

namespace {

// The enumerator of E whose code name_of names `name` (name_of: selection.h's algo_name_of or
// proto_name_of, "?" for a code without one); InvalidArgument "unknown <what>" for any other name.
template <class E>
E by_name(const std::string& name, const char* (*name_of)(uint8_t), const char* what) {
  if (name != "?")
    for (unsigned code = 0; code <= UINT8_MAX; ++code)
      if (name == name_of(static_cast<uint8_t>(code))) return static_cast<E>(code);
  RC_THROW(InvalidArgument, "ringcomm: unknown " << what << " '" << name << "'");
}

py::dict work_dict(const rc::HalvingDoublingWork& w) {
  return py::dict(py::arg("steps") = w.steps, py::arg("sent") = w.sent, py::arg("received") = w.received,
                  py::arg("combined") = w.combined);
}

}  // namespace

void bind_test_model(py::module_& m) {
  m.def("model_seconds",
        [](const std::string& algo, const std::string& proto, int64_t bytes, int world, const py::object& params,
           int64_t ring_piece, int64_t far_piece, int64_t far_depth) {
          return rc::model_seconds(rc_py::from_params(params), by_name<rc::Algo>(algo, rc::algo_name_of, "algorithm"),
                                   by_name<rc::Proto>(proto, rc::proto_name_of, "protocol"), bytes, world,
                                   rc::PieceSizes{ring_piece, far_piece, far_depth});
        },
        py::arg("algo"), py::arg("proto"), py::arg("bytes"), py::arg("world_size"), py::arg("params") = py::none(),
        py::arg("ring_piece") = rc::PieceSizes{}.ring, py::arg("far_piece") = rc::PieceSizes{}.far,
        py::arg("far_depth") = rc::PieceSizes{}.far_depth);
  m.def("hd_work", [](int rank, int world) { return work_dict(rc::halving_doubling_work(rank, world)); },
        py::arg("rank"), py::arg("world_size"), "halving_doubling's plan counted for one rank (chunk units)");
  m.def("hd_work_rank0", [](int world) { return work_dict(rc::halving_doubling_work_of_rank0(world)); },
        py::arg("world_size"), "the cost model's closed form of hd_work(0, world_size)");
}
