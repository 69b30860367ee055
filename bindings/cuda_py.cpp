// ringcomm._C_cuda: the CUDA communicator, a module of its own so that ringcomm._C
// imports where no CUDA runtime exists. Linked with the static CUDA runtime: importing it needs
// no libcudart and no driver; without a driver or GPU, runtime_status() says so and every CUDA
// call raises ringcomm.UnsupportedError ("CUDA unavailable: ...").
//
// Thin, like bindings/comm_py.cpp (the methods both communicators share are bound once, in
// bindings/comm_methods_py.h): buffers and streams arrive as integer addresses (the Python
// layer, ringcomm/cuda.py, owns validation and keeps arrays alive); calls that may wait release
// the GIL; C++ error classes map to ringcomm's Python exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include "comm_methods_py.h"
#include "cuda_methods_py.h"
#include "errors_py.h"
#include "pin_range_py.h"

#include <chrono>
#include <cstring>

#include "comm/communicator_cuda.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "kernels/reduce_cuda.h"
#include "transport/cuda_ipc.h"
#include "transport/pin_registry.h"

namespace py = pybind11;
using rc::CudaCommunicator;
using rc::DType;
using rc::ReduceOp;

#ifndef RINGCOMM_CUDA_ARCHS
#define RINGCOMM_CUDA_ARCHS "unknown"
#endif

namespace {

using rc_py::dtype_of;
using rc_py::op_of;
using rc_py::ptr_of;
inline cudaStream_t S(uintptr_t a) { return reinterpret_cast<cudaStream_t>(a); }

// The CUDA communicator's launch argument: the stream. Collectives are enqueued before the call
// returns (host part synchronous); send/recv return at once.
struct StreamLaunches {
  using Arg = uintptr_t;
  static rc::Launch coll(uintptr_t s) { return rc::Launch{false, ptr_of(s)}; }
  static rc::Launch p2p(uintptr_t s) { return rc::Launch{true, ptr_of(s)}; }
  static bool hands_back(uintptr_t) { return true; }  // the Work is the stream's fence
};

// Never throws: whether a CUDA device can be used here, and why not.
py::dict runtime_status() {
  py::dict d;
  int n = 0, rt = 0, drv = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaRuntimeGetVersion(&rt);
  (void)cudaDriverGetVersion(&drv);
  d["available"] = (e == cudaSuccess && n > 0);
  d["device_count"] = (e == cudaSuccess) ? n : 0;
  d["error"] = (e == cudaSuccess) ? std::string(n > 0 ? "" : "no CUDA device is visible")
                                  : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  d["runtime_version"] = rt;
  d["driver_version"] = drv;
  (void)cudaGetLastError();
  return d;
}

// Reduce-kernel bandwidth against a device-to-device copy, measured in the same call on the same
// buffers (CUDA events). Returns seconds per iteration for each. Runs without the GIL (touches no
// Python object); bench_reduce_py builds the result dict with it.
std::pair<double, double> bench_reduce(int device, int64_t nbytes, int dt, int op, int iters) {
  RC_CHECK(nbytes > 0 && iters > 0, InvalidArgument, "_bench_reduce: nbytes and iters must be > 0");
  rc::CudaDeviceGuard g(device);
  const size_t es = rc::dtype_size(dtype_of(dt));
  const size_t n = static_cast<size_t>(nbytes) / es;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double t_reduce = 0, t_copy = 0;
  auto cleanup = [&] {
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (c) cudaFree(c);
    if (s) cudaStreamDestroy(s);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    (void)cudaGetLastError();
  };
  try {
    RC_CUDA(cudaMalloc(&a, n * es), "");
    RC_CUDA(cudaMalloc(&b, n * es), "");
    RC_CUDA(cudaMalloc(&c, n * es), "");
    RC_CUDA(cudaMemset(a, 0, n * es), "");
    RC_CUDA(cudaMemset(b, 0, n * es), "");
    RC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "");
    RC_CUDA(cudaEventCreate(&e0), "");
    RC_CUDA(cudaEventCreate(&e1), "");
    auto time = [&](auto&& fn) {
      fn();  // warm-up
      RC_CUDA(cudaStreamSynchronize(s), "");
      RC_CUDA(cudaEventRecord(e0, s), "");
      for (int i = 0; i < iters; ++i) fn();
      RC_CUDA(cudaEventRecord(e1, s), "");
      RC_CUDA(cudaEventSynchronize(e1), "");
      float ms = 0;
      RC_CUDA(cudaEventElapsedTime(&ms, e0, e1), "");
      return static_cast<double>(ms) / 1e3 / iters;
    };
    t_reduce = time([&] { rc::reduce_cuda(c, a, b, n, dtype_of(dt), op_of(op), 1.0, s, 0); });
    t_copy = time([&] { RC_CUDA(cudaMemcpyAsync(c, a, n * es, cudaMemcpyDeviceToDevice, s), ""); });
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return {t_reduce, t_copy};
}

py::dict bench_reduce_py(int device, int64_t nbytes, int dt, int op, int iters) {
  std::pair<double, double> t;
  {
    py::gil_scoped_release nogil;
    t = bench_reduce(device, nbytes, dt, op, iters);
  }
  const int64_t es = static_cast<int64_t>(rc::dtype_size(dtype_of(dt)));
  py::dict out;
  out["elements"] = nbytes / es;
  out["bytes"] = nbytes / es * es;
  out["reduce_s"] = t.first;
  out["copy_s"] = t.second;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "ringcomm CUDA communicator: CUDA IPC transport, ring collectives on GPU buffers, CUDA reduce kernels";
  register_error_translator(true);
  m.attr("COMPILED_ARCHS") = RINGCOMM_CUDA_ARCHS;
  m.def("runtime_status", &runtime_status, "Whether CUDA is usable here: available, device_count, error, versions.");
  m.def("_bench_reduce", &bench_reduce_py, py::arg("device"), py::arg("nbytes"), py::arg("dtype") = 0,
        py::arg("op") = 0, py::arg("iters") = 20,
        "Seconds per call of the reduce kernel and of a D2D cudaMemcpy on the same nbytes buffers.");
  rc_py::bind_work(m, true).def("stream_wait", [](rc::Work& w, uintptr_t s) { w.stream_wait(ptr_of(s)); },
                                rc_py::ReleaseGil());

  py::class_<CudaCommunicator, std::shared_ptr<CudaCommunicator>> comm(m, "Communicator");
  rc_py::def_cuda_setup(comm);
  comm.def("channels", &CudaCommunicator::channels)
      .def_property_readonly("p2p_stream", &CudaCommunicator::p2p_stream)
      .def("p2p_idle", &CudaCommunicator::p2p_idle, rc_py::ReleaseGil())
      .def_property_readonly("pin_owner", &CudaCommunicator::pin_owner);
  m.def("_stream_idle", [](uintptr_t stream, int device) {
    rc::CudaDeviceGuard g(device);
    const cudaError_t e = cudaStreamQuery(S(stream));
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;  // not ready, or a failed stream: nothing proves its work is over
  }, py::arg("stream"), py::arg("device"), rc_py::ReleaseGil(),
     "True when every piece of work enqueued on the stream so far has finished (cudaStreamQuery).");
  // The process's pinned / IPC-mapped ranges (transport/pin_registry.h): tests check that a
  // non-drained close retires its ranges and that later communicators never overlap them.
  m.def("_pinned_ranges", [] { return rc_py::pin_range_list(rc::PinRegistry::process().ranges()); });
  rc_py::def_core_methods<StreamLaunches>(comm);
  rc_py::def_cuda_methods(comm);
}
