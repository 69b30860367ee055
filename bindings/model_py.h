// The cost model's Python forms (bindings/model_py.cpp), shared with the test module.
#pragma once
#include <pybind11/pybind11.h>

#include "comm/cost_model.h"

namespace rc_py {

/// params: a dict of every profile parameter (ringcomm._C.PROFILE_PARAMS); None:
/// RINGCOMM_PROFILE's profile (or the defaults).
rc::CostProfile from_params(const pybind11::object& params);

}  // namespace rc_py
