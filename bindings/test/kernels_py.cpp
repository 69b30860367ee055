// ringcomm._C_test: the CPU kernels' dispatch (kernels/reduce_cpu*.h) and the pool's placement
// and split (kernels/cpu_pool.h).
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/errors.h"
#include "kernels/cpu_pool.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cpu_isa.h"

namespace py = pybind11;

void bind_test_kernels(py::module_& m) {
  m.def("reduce_isa", [](int64_t dtype_code) {
    RC_CHECK(dtype_code >= 0 && dtype_code < static_cast<int64_t>(rc::DType::kCount), InvalidArgument,
             "reduce_isa: unknown dtype code " << dtype_code);
    return std::string(rc::cpu_isa_name(rc::reduce_cpu_isa(static_cast<rc::DType>(dtype_code))));
  }, py::arg("dtype"), "Name of the kernel copy isa='auto' runs for this dtype code (RINGCOMM_CPU_ISA, read once).");
  m.def("reduce_supported", [](int64_t dtype_code, int64_t op_code) {
    if (dtype_code < 0 || dtype_code >= static_cast<int64_t>(rc::DType::kCount)) return false;
    if (op_code < 0 || op_code >= static_cast<int64_t>(rc::ReduceOp::kCount)) return false;
    return rc::reduce_supported(static_cast<rc::DType>(dtype_code), static_cast<rc::ReduceOp>(op_code));
  }, py::arg("dtype"), py::arg("op"), "True when the (dtype code, op code) pair is a supported reduction.");
  m.def("step_off_cpu", [](int cpu) { rc::step_off_cpu(cpu); }, py::arg("cpu"),
        "rc::step_off_cpu on the calling thread (kernels/cpu_pool.h).");
  m.def("split_range", [](size_t n, size_t esize, int parts, int k) {
    size_t b, e;
    rc::split_range(n, esize, parts, k, &b, &e);
    return py::make_tuple(b, e);
  }, py::arg("n"), py::arg("esize"), py::arg("parts"), py::arg("k"));
}
