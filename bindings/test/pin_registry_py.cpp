// Test binding of the pinned-range ownership bookkeeping (transport/pin_registry.h):
// ringcomm._C_test.PinRegistry, a private registry (never the process's) driven with integer
// addresses, so that tests/test_cuda_bookkeeping.py checks the CUDA transport's close policy on
// the host, without a GPU.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "common/errors.h"
#include "pin_range_py.h"
#include "transport/pin_registry.h"

namespace py = pybind11;

namespace {

rc::PinKind kind_of(const std::string& k) {
  if (k == "host") return rc::PinKind::kHostRegistered;
  if (k == "ipc") return rc::PinKind::kIpcMapped;
  RC_THROW(InvalidArgument, "PinRegistry: kind must be 'host' or 'ipc', got '" << k << "'");
}

const void* addr_of(uintptr_t a) { return reinterpret_cast<const void*>(a); }

}  // namespace

void bind_test_pin_registry(py::module_& m) {
  py::class_<rc::PinRegistry>(m, "PinRegistry",
                              "Pinned / IPC-mapped range ownership (csrc/transport/pin_registry.h).")
      .def(py::init<>())
      .def("new_owner", &rc::PinRegistry::new_owner)
      .def("claim", [](rc::PinRegistry& r, uint64_t owner, uintptr_t addr, size_t bytes, const std::string& kind) {
             return r.claim(owner, addr_of(addr), bytes, kind_of(kind)) == rc::PinRegistry::Claim::kFresh
                        ? "fresh" : "held";
           }, py::arg("owner"), py::arg("addr"), py::arg("bytes"), py::arg("kind") = "host")
      .def("drop", [](rc::PinRegistry& r, uint64_t owner, uintptr_t addr) { r.drop(owner, addr_of(addr)); })
      .def("reject_foreign", [](rc::PinRegistry& r, uint64_t owner, uintptr_t addr, size_t bytes) {
             r.reject_foreign(owner, addr_of(addr), bytes);
           })
      .def("release", [](rc::PinRegistry& r, uint64_t owner) { return rc_py::pin_range_list(r.release(owner)); })
      .def("retire", &rc::PinRegistry::retire)
      .def("settle", [](rc::PinRegistry& r, uint64_t owner, bool drained) {
             return rc_py::pin_range_list(r.settle(owner, drained));
           }, py::arg("owner"), py::arg("drained"))
      .def("ranges", [](const rc::PinRegistry& r) { return rc_py::pin_range_list(r.ranges()); })
      .def("retired_bytes", &rc::PinRegistry::retired_bytes);
}
