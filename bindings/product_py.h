// The bindings of ringcomm._C, one function per file of bindings/. ringcomm._C binds them over
// the production core; ringcomm._C_test binds the same objects over the test build of the core
// (RINGCOMM_TEST_HOOKS: CMakeLists.txt), module_local so that both modules' classes can live in
// one process. A function of _C_test that takes a class bound here accepts either module's object.
#pragma once
#include <pybind11/pybind11.h>

void bind_errors(pybind11::module_& m, bool module_local);
void bind_config(pybind11::module_& m, bool module_local);
void bind_comm(pybind11::module_& m, bool module_local);
void bind_kernels(pybind11::module_& m, bool module_local);
void bind_model(pybind11::module_& m);

/// Every binding of ringcomm._C into `m`.
inline void bind_product(pybind11::module_& m, bool module_local) {
  bind_errors(m, module_local);
  bind_config(m, module_local);
  bind_comm(m, module_local);
  bind_kernels(m, module_local);
  bind_model(m);
}
