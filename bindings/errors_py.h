// The C++ -> Python error mapping (bindings/errors_py.cpp), shared by both extension modules.
#pragma once
#include <pybind11/pybind11.h>

/// Map rc::Error and subclasses to ringcomm.errors classes; module_local for ringcomm._C_cuda.
void register_error_translator(bool module_local);
