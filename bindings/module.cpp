// ringcomm._C: thin pybind11 bindings. Convert arguments, release the GIL around C++ work, map
// C++ error classes to ringcomm's Python exceptions. No policy lives here, and no test hook: what
// only the tests use is in ringcomm._C_test (bindings/test/).
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_config(py::module_& m);
void bind_comm(py::module_& m);
void bind_kernels(py::module_& m);
void bind_model(py::module_& m);

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringcomm C++ core: shared-memory ring collectives";
  bind_errors(m);
  bind_config(m);
  bind_comm(m);
  bind_kernels(m);
  bind_model(m);
}
