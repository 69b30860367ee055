// ringcomm._C_test: the bindings only the tests use, kept out of the production module
// (ringcomm._C). Built beside it by the same CMake run; the library never imports it.
//
// It links its own copy of the core (as ringcomm._C_cuda does): process-wide state of the core
// (the sync entry's counters, the process's pin registry) is ringcomm._C's alone, so nothing here
// reads it. A communicator passed in (ringcomm._C.Communicator) is the production module's
// object; this module reaches into it only through CommCoreTestAccess (comm_py.cpp), which
// touches its members under its mutex and calls none of its code.
#include <pybind11/pybind11.h>

#include "errors_py.h"
#include "bind_test.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_test, m) {
  m.doc() = "ringcomm test hooks: internals the public API does not show (tests only)";
  // The Communicator type the hooks take is registered by ringcomm._C.
  py::module_::import("ringcomm._C");
  register_error_translator(true);
  bind_test_comm(m);
  bind_test_errors(m);
  bind_test_kernels(m);
  bind_test_model(m);
  bind_test_algo_sim(m);
  bind_test_pin_registry(m);
}
