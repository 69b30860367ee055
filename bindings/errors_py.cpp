// rc::ErrorCode -> its Python class in ringcomm/core/errors.py, from the one table of error kinds
// (RC_ERROR_KINDS, common/errors.h; ringcomm/core/errors.py holds the same table the other way,
// BY_CODE, and tests/test_errors.py checks that they agree). Compiled into
// both extension modules (ringcomm._C registers the translator globally, ringcomm._C_cuda
// module-locally), so the mapping exists once.
#include "errors_py.h"

#include <array>

#include "common/errors.h"

namespace py = pybind11;

namespace {

// code -> Python class name in ringcomm.errors; indexed by the ErrorCode value (dense: errors.h).
constexpr std::array<const char*, rc::kNumErrorCodes> kClassNames = {
#define RC_PY_CLASS_NAME_(name, value, Kind, py_class) #py_class,
    RC_ERROR_KINDS(RC_PY_CLASS_NAME_)
#undef RC_PY_CLASS_NAME_
};

// Module-lifetime references (never destroyed: the interpreter owns the classes).
const std::array<py::object, rc::kNumErrorCodes>& classes() {
  static auto* c = [] {
    py::module_ errors = py::module_::import("ringcomm.errors");
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

py::dict error_codes() {
  py::dict d;
  for (int i = 0; i < rc::kNumErrorCodes; ++i) d[rc::error_code_name(static_cast<rc::ErrorCode>(i))] = i;
  return d;
}

void register_error_translator(bool module_local) {
  classes();  // import ringcomm.errors now, while the module initialises
  if (module_local) {
    py::register_local_exception_translator(translate);
  } else {
    py::register_exception_translator(translate);
  }
}

void bind_errors(py::module_& m) {
  register_error_translator(false);
  m.def("error_codes", &error_codes, "{ErrorCode name: value} of the C++ error kinds (csrc/common/errors.h)");
  m.def("error_class_names", [] {
    py::dict d;
    for (int i = 0; i < rc::kNumErrorCodes; ++i) d[py::int_(i)] = kClassNames[i];
    return d;
  }, "{ErrorCode value: ringcomm.errors class name}: the bindings' table");
  m.def("_raise_for_test", [](int code, const std::string& msg) {
    RC_CHECK(rc::valid_error_code(code), InvalidArgument, "ringcomm: no error code " << code);
    rc::throw_error(static_cast<rc::ErrorCode>(code), msg);
  }, py::arg("code"), py::arg("message") = "raised for a test",
     "Test hook: throw the C++ error class of `code` through the bindings' translator.");
  m.def("_check_op_for_test", [](const std::string& op, int64_t a, int64_t b) {
    if (op == "EQ") RC_CHECK_EQ(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "NE") RC_CHECK_NE(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "LT") RC_CHECK_LT(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "LE") RC_CHECK_LE(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "GT") RC_CHECK_GT(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "GE") RC_CHECK_GE(a, b, InvalidArgument, "ringcomm: test check");
    else RC_THROW(InvalidArgument, "ringcomm: no check " << op);
  }, "Test hook: RC_CHECK_<op>(a, b) (raises InvalidArgumentError naming both values when it fails).");
}
