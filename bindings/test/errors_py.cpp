// ringcomm._C_test: the error kinds and the check macros (common/errors.h) seen from Python.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "common/errors.h"

namespace py = pybind11;

void bind_test_errors(py::module_& m) {
  m.def("error_codes", [] {
    py::dict d;
    for (int i = 0; i < rc::kNumErrorCodes; ++i) d[rc::error_code_name(static_cast<rc::ErrorCode>(i))] = i;
    return d;
  }, "{ErrorCode name: value} of the C++ error kinds (csrc/common/errors.h)");
  m.def("raise_error", [](int code, const std::string& msg) {
    RC_CHECK(rc::valid_error_code(code), InvalidArgument, "ringcomm: no error code " << code);
    rc::throw_error(static_cast<rc::ErrorCode>(code), msg);
  }, py::arg("code"), py::arg("message") = "raised for a test",
     "Throw the C++ error class of `code` through the bindings' translator.");
  m.def("check_op", [](const std::string& op, int64_t a, int64_t b) {
    if (op == "EQ") RC_CHECK_EQ(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "NE") RC_CHECK_NE(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "LT") RC_CHECK_LT(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "LE") RC_CHECK_LE(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "GT") RC_CHECK_GT(a, b, InvalidArgument, "ringcomm: test check");
    else if (op == "GE") RC_CHECK_GE(a, b, InvalidArgument, "ringcomm: test check");
    else RC_THROW(InvalidArgument, "ringcomm: no check " << op);
  }, "RC_CHECK_<op>(a, b) (raises InvalidArgumentError naming both values when it fails).");
}
