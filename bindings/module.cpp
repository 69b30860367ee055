// ringcomm._C: thin pybind11 bindings. Convert arguments, release the GIL around C++ work, map
// C++ error classes to ringcomm's Python exceptions. No policy lives here, and no test hook: the
// core linked here is compiled without RINGCOMM_TEST_HOOKS, and what only the tests use is in
// ringcomm._C_test (bindings/test/).
#include <pybind11/pybind11.h>

#include "product_py.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringcomm C++ core: shared-memory ring collectives";
  bind_product(m, false);
}
