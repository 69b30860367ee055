// rc::ErrorCode -> its Python class in ringcomm/core/errors.py, from the one table of error kinds
// (RC_ERROR_KINDS, common/errors.h; ringcomm/core/errors.py holds the same table the other way,
// BY_CODE, and tests/test_errors.py checks that they agree). Compiled into
// every extension module (ringcomm._C registers the translator globally, ringcomm._C_cuda and
// ringcomm._C_test module-locally), so the mapping exists once.
#include "errors_py.h"

#include <array>

#include "common/errors.h"

namespace py = pybind11;

namespace {

// code -> Python class name in ringcomm.core.errors; indexed by the ErrorCode value (dense: errors.h).
constexpr std::array<const char*, rc::kNumErrorCodes> kClassNames = {
#define RC_PY_CLASS_NAME_(name, value, Kind, py_class) #py_class,
    RC_ERROR_KINDS(RC_PY_CLASS_NAME_)
#undef RC_PY_CLASS_NAME_
};

// Module-lifetime references (never destroyed: the interpreter owns the classes).
const std::array<py::object, rc::kNumErrorCodes>& classes() {
  static auto* c = [] {
    py::module_ errors = py::module_::import("ringcomm.core.errors");
    auto* a = new std::array<py::object, rc::kNumErrorCodes>();
    for (int i = 0; i < rc::kNumErrorCodes; ++i) (*a)[i] = errors.attr(kClassNames[i]);
    return a;
  }();
  return *c;
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const rc::Error& e) {
    PyErr_SetString(error_class(e.code()).ptr(), e.what());
  }
}

}  // namespace

py::handle error_class(rc::ErrorCode code) {
  const int i = static_cast<int>(code);
  return classes()[rc::valid_error_code(i) ? i : 0];
}

void register_error_translator(bool module_local) {
  classes();  // import ringcomm.core.errors now, while the module initialises
  if (module_local) {
    py::register_local_exception_translator(translate);
  } else {
    py::register_exception_translator(translate);
  }
}

void bind_errors(py::module_& m, bool module_local) {
  register_error_translator(module_local);
  m.def("error_class_names", [] {
    py::dict d;
    for (int i = 0; i < rc::kNumErrorCodes; ++i) d[py::int_(i)] = kClassNames[i];
    return d;
  }, "{ErrorCode value: ringcomm.core.errors class name}: the bindings' table");
}
