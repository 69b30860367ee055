// ringcomm._C_test: the test build of ringcomm._C, plus the bindings only the tests use. Built
// beside ringcomm._C by the same CMake run; the library never imports it.
//
// It binds every binding of ringcomm._C (bindings/product_py.h) again, module_local, over the
// test build of the core (ringcomm_core_test: the same sources compiled with RINGCOMM_TEST_HOOKS,
// which adds the test knobs of common/test_knobs.def and the forged-header hook of
// comm/test_hooks.h, and nothing else). A process that imports it as ringcomm._C before
// ringcomm._C loads (tests/hooked_build.py) runs the whole library over that core. Each core
// keeps its own process-wide state (its pin registry), so a communicator of ringcomm._C never
// sees a hook or test knob of this module; the functions here that need the test build's core
// refuse ringcomm._C's communicators.
#include <pybind11/pybind11.h>

#include "bind_test.h"
#include "product_py.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_test, m) {
  m.doc() = "ringcomm test build: ringcomm._C over the core with test hooks, and internals the "
            "public API does not show (tests only)";
  bind_product(m, true);
  bind_test_comm(m);
  bind_test_errors(m);
  bind_test_kernels(m);
  bind_test_model(m);
  bind_test_algo_sim(m);
  bind_test_pin_registry(m);
}
