// The CUDA communicator's own methods, bound alike by ringcomm._C_cuda (bindings/cuda_py.cpp) and
// the fake-runtime module ringcomm._C_cuda_fake (tests/fake_cuda/fake_py.cpp), and the device
// ring's plan as Python sees it (ringcomm._C_cuda_test's plan_device_ring too).
#pragma once
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator_cuda.h"
#include "common/cuda_check.h"

namespace rc_py {

/// A device ring's plan (transport/cuda_ipc.h's RingPlan) as a dict: setup, signalling ('' for both
/// when there is no device ring), blocks, nslots, slot_bytes, budget, why.
inline pybind11::dict ring_plan_dict(const rc::RingPlan& p) {
  using pybind11::arg;
  const bool none = p.setup == rc::RingSetup::kNone;
  return pybind11::dict(arg("setup") = none ? std::string() : std::string(rc::ring_setup_name(p.setup)),
                        arg("signalling") = none ? "" : p.spin ? "spin" : "flags", arg("blocks") = p.lanes,
                        arg("nslots") = p.nslots, arg("slot_bytes") = p.slot_bytes, arg("budget") = p.budget,
                        arg("why") = p.why);
}

/// The constructor, the setup steps (local_info() -> create(infos) -> connect(blobs)) and the device.
template <class Class>
void def_cuda_setup(Class& comm) {
  namespace py = pybind11;
  using rc::CudaCommunicator;
  comm.def(py::init<int, int, int, double>(), py::arg("rank"), py::arg("world_size"), py::arg("device"),
           py::arg("timeout") = 0.0)
      .def("local_info", [](CudaCommunicator& c) {
             std::string s;
             {
               py::gil_scoped_release nogil;
               s = c.local_info();
             }
             return py::bytes(s);
           })
      .def("create", [](CudaCommunicator& c, const std::vector<py::bytes>& infos) {
             std::vector<std::string> v(infos.begin(), infos.end());
             std::string s;
             {
               py::gil_scoped_release nogil;
               s = c.create(v);
             }
             return py::bytes(s);
           })
      .def("connect", [](CudaCommunicator& c, const std::vector<py::bytes>& blobs) {
             std::vector<std::string> v(blobs.begin(), blobs.end());
             py::gil_scoped_release nogil;
             c.connect(v);
           })
      .def_property_readonly("device", &CudaCommunicator::device);
}

template <class Class>
void def_cuda_methods(Class& comm) {
  namespace py = pybind11;
  comm.def("device_setup", [](const rc::CudaCommunicator& c) { return ring_plan_dict(c.device_setup()); }, "The device ring's setup (RINGCOMM_CUDA_P2P=device*): setup, signalling, the grid's blocks, slots, "
         "the SM budget and why ('' setup: no device ring).")
      .def("stream_capturing", [](const rc::CudaCommunicator& c, uintptr_t stream) {
        rc::CudaDeviceGuard g(c.device());
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        RC_CUDA(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &cs), " (stream_capturing)");
        return cs != cudaStreamCaptureStatusNone;
      }, py::arg("stream"), "Whether the stream is being captured into a CUDA graph (cudaStreamIsCapturing: "
                            "allowed during a capture, unlike a query).");
}

}  // namespace rc_py
