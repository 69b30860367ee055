// The parts of ringcomm._C_test, one function per file of bindings/test/, each adding its
// functions and classes to the module (bindings/test/module.cpp calls them in order).
#pragma once
#include <pybind11/pybind11.h>

void bind_test_comm(pybind11::module_& m);
void bind_test_errors(pybind11::module_& m);
void bind_test_kernels(pybind11::module_& m);
void bind_test_model(pybind11::module_& m);
void bind_test_algo_sim(pybind11::module_& m);
void bind_test_pin_registry(pybind11::module_& m);
