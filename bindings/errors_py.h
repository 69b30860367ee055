// The C++ -> Python error mapping (bindings/errors_py.cpp), shared by every extension module.
#pragma once
#include <pybind11/pybind11.h>

#include "common/errors.h"

/// Map rc::Error (by its code) to ringcomm.core.errors classes; module_local for ringcomm._C_cuda and _C_test.
void register_error_translator(bool module_local);
/// The ringcomm.core.errors class of `code` (RingcommError for an unknown code).
pybind11::handle error_class(rc::ErrorCode code);
