// ringcomm._C_cuda: the CUDA communicator, a module of its own so that ringcomm._C
// imports where no CUDA runtime exists. Linked with the static CUDA runtime: importing it needs
// no libcudart and no driver; without a driver or GPU, runtime_status() says so and every CUDA
// call raises ringcomm.UnsupportedError ("CUDA unavailable: ...").
//
// Thin, like bindings/comm_py.cpp: buffers and streams arrive as integer addresses (the Python
// layer, ringcomm/cuda.py, owns validation and keeps arrays alive); calls that may wait release
// the GIL; C++ error classes map to ringcomm's Python exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "errors_py.h"
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>

#include "algo/ring_cuda.h"
#include "comm/communicator_cuda.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cuda.h"
#include "transport/cuda_ipc.h"

namespace py = pybind11;
using rc::CudaCommunicator;
using rc::DType;
using rc::ReduceOp;

#ifndef RINGCOMM_CUDA_ARCHS
#define RINGCOMM_CUDA_ARCHS "unknown"
#endif

namespace {

inline void* P(uintptr_t a) { return reinterpret_cast<void*>(a); }
inline cudaStream_t S(uintptr_t a) { return reinterpret_cast<cudaStream_t>(a); }
inline DType D(int d) { return static_cast<DType>(d); }
inline ReduceOp O(int o) { return static_cast<ReduceOp>(o); }
using GIL = py::call_guard<py::gil_scoped_release>;


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

void reduce_py(uintptr_t dst, uintptr_t a, uintptr_t b, int64_t n, int dt, int op, double scale, uintptr_t stream,
               int device, bool sync) {
  RC_CHECK(n >= 0, InvalidArgument, "_reduce: negative count");
  rc::check_reduce_supported(D(dt), O(op));  // the same table as the GPU switch (tests compare them)
  rc::CudaDeviceGuard g(device);
  rc::reduce_cuda(P(dst), P(a), P(b), static_cast<size_t>(n), D(dt), O(op), scale, S(stream), 0);
  if (sync) RC_CUDA(cudaStreamSynchronize(S(stream)), "");
}

// The CUDA kernel body run on the host (reduce_cuda_emulate) on numpy arrays: tests compare it
// bit for bit with the CPU kernels, on every dtype x op, alignment and thread count, without a GPU.
void reduce_emulated_py(py::array dst, py::array a, py::array b, int dt, int op, double scale, int64_t nthreads) {
  const size_t n = static_cast<size_t>(dst.size());
  const size_t es = rc::dtype_size(D(dt));
  for (const py::array* x : {&dst, &a, &b}) {
    RC_CHECK(static_cast<size_t>(x->size()) == n && static_cast<size_t>(x->itemsize()) == es &&
                 (x->flags() & py::array::c_style),
             InvalidArgument, "_reduce_emulated: arrays must be C-contiguous, of one length and the dtype's itemsize");
  }
  RC_CHECK(nthreads >= 1, InvalidArgument, "_reduce_emulated: nthreads must be >= 1");
  rc::reduce_cuda_emulate(dst.mutable_data(), a.data(), b.data(), n, D(dt), O(op), scale,
                          static_cast<size_t>(nthreads));
}

// Reduce-kernel bandwidth against a device-to-device copy, measured in the same call on the same
// buffers (CUDA events). Returns seconds per iteration for each. Runs without the GIL (touches no
// Python object); bench_reduce_py builds the result dict with it.
std::pair<double, double> bench_reduce(int device, int64_t nbytes, int dt, int op, int iters) {
  RC_CHECK(nbytes > 0 && iters > 0, InvalidArgument, "_bench_reduce: nbytes and iters must be > 0");
  rc::CudaDeviceGuard g(device);
  const size_t es = rc::dtype_size(D(dt));
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
    t_reduce = time([&] { rc::reduce_cuda(c, a, b, n, D(dt), O(op), 1.0, s, 0); });
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
  const int64_t es = static_cast<int64_t>(rc::dtype_size(D(dt)));
  py::dict out;
  out["elements"] = nbytes / es;
  out["bytes"] = nbytes / es * es;
  out["reduce_s"] = t.first;
  out["copy_s"] = t.second;
  return out;
}

// Runs the CUDA path's algorithms (algo/ring_cuda.cpp) over a host shared-memory transport with
// memcpy and the CPU kernels: their schedule, piece bounds, slot offsets and message pairing,
// testable between processes on machines without a GPU. Not a user API.
class HostSim {
 public:
  HostSim(int rank, int world, int64_t slot_bytes, int nslots, double timeout_s)
      : t_(rank, world, make_cfg(world, slot_bytes, nslots, timeout_s)), x_(&t_), rank_(rank), world_(world) {}
  std::string create() { return t_.create(); }
  void attach(const std::vector<std::string>& names) { t_.attach(names); }
  void close() { t_.close(); }
  int64_t piece_elems(int dt) { return ctx(D(dt), "piece_elems", false).piece_elems(); }

  void all_reduce(uintptr_t in, uintptr_t out, int64_t count, int dt, int op) {
    rc::slot_ring_all_reduce(ctx(D(dt), "all_reduce"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)),
                             count, O(op));
  }
  void reduce_scatter(uintptr_t in, uintptr_t out, int64_t count, int dt, int op) {
    rc::slot_ring_reduce_scatter(ctx(D(dt), "reduce_scatter"), static_cast<const char*>(P(in)),
                                 static_cast<char*>(P(out)), count, O(op));
  }
  void all_gather(uintptr_t in, uintptr_t out, std::vector<int64_t> counts, int dt) {
    rc::slot_ring_all_gather(ctx(D(dt), "all_gather"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)),
                             counts);
  }
  void broadcast(uintptr_t buf, int64_t count, int dt, int root) {
    rc::slot_chain_broadcast(ctx(D(dt), "broadcast"), static_cast<char*>(P(buf)), count, root);
  }
  void reduce(uintptr_t in, uintptr_t out, int64_t count, int dt, int op, int root) {
    rc::slot_chain_reduce(ctx(D(dt), "reduce"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)), count,
                          O(op), root);
  }
  void all_to_all(uintptr_t in, uintptr_t out, std::vector<int64_t> sc, std::vector<int64_t> rcn, int dt) {
    std::vector<int64_t> so(world_, 0), ro(world_, 0);
    for (int p = 1; p < world_; ++p) {
      so[p] = so[p - 1] + sc[p - 1];
      ro[p] = ro[p - 1] + rcn[p - 1];
    }
    rc::slot_direct_all_to_all(ctx(D(dt), "all_to_all"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)),
                               sc, so, rcn, ro);
  }
  void gather(uintptr_t in, uintptr_t out, int64_t count, int dt, int root) {
    rc::slot_direct_gather(ctx(D(dt), "gather"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)), count,
                           root);
  }
  void scatter(uintptr_t in, uintptr_t out, int64_t count, int dt, int root) {
    rc::slot_direct_scatter(ctx(D(dt), "scatter"), static_cast<const char*>(P(in)), static_cast<char*>(P(out)), count,
                            root);
  }

 private:
  static rc::ShmConfig make_cfg(int world, int64_t slot_bytes, int nslots, double timeout_s) {
    rc::ShmConfig c = rc::ShmConfig::from_env(world, timeout_s);
    RC_CHECK(slot_bytes >= 64 && nslots >= 2, InvalidArgument, "HostSim: slot_bytes >= 64 and nslots >= 2");
    c.slot_bytes = static_cast<size_t>((slot_bytes + 63) / 64 * 64);
    c.nslots = static_cast<uint32_t>(nslots);
    return c;
  }
  rc::SlotAlgoCtx ctx(DType dt, const char* op, bool next = true) {
    rc::SlotAlgoCtx c;
    c.x = &x_;
    c.rank = rank_;
    c.world = world_;
    c.seq = next ? ++seq_ : seq_;
    c.op = op;
    c.dtype = dt;
    c.esize = rc::dtype_size(dt);
    return c;
  }
  rc::ShmTransport t_;
  rc::HostSlotExec x_;
  int rank_, world_;
  uint64_t seq_ = 0;
};

rc::CudaPeerInfo info_from_dict(const py::dict& d) {
  rc::CudaPeerInfo p;
  p.pid = d.contains("pid") ? d["pid"].cast<int32_t>() : 1;
  p.device = d.contains("device") ? d["device"].cast<int32_t>() : 0;
  p.host = d.contains("host") ? d["host"].cast<std::string>() : "host";
  p.uuid = d["uuid"].cast<std::string>();
  p.ipc_events = d.contains("ipc_events") ? d["ipc_events"].cast<bool>() : true;
  p.mode = d.contains("mode") ? d["mode"].cast<int32_t>() : 0;
  p.slot_bytes = d.contains("slot_bytes") ? d["slot_bytes"].cast<uint64_t>() : (2u << 20);
  p.nslots = d.contains("nslots") ? d["nslots"].cast<uint32_t>() : 4;
  if (d.contains("visible")) p.visible = d["visible"].cast<std::vector<std::string>>();
  if (d.contains("can_access")) p.can_access = d["can_access"].cast<std::vector<uint8_t>>();
  return p;
}

}  // namespace

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "ringcomm CUDA communicator: CUDA IPC transport, ring collectives on GPU buffers, CUDA reduce kernels";
  register_error_translator(true);
  m.attr("COMPILED_ARCHS") = RINGCOMM_CUDA_ARCHS;
  m.def("runtime_status", &runtime_status, "Whether CUDA is usable here: available, device_count, error, versions.");
  m.def("reduce_supported", [](int dt, int op) {
    if (dt < 0 || dt >= static_cast<int>(DType::kCount) || op < 0 || op >= static_cast<int>(ReduceOp::kCount)) return false;
    return rc::reduce_cuda_supported(D(dt), O(op));
  }, py::arg("dtype"), py::arg("op"), "True when the CUDA switch has a kernel for the (dtype, op) codes (no GPU needed).");
  m.def("_reduce", &reduce_py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"),
        py::arg("op"), py::arg("scale") = 1.0, py::arg("stream") = 0, py::arg("device") = 0, py::arg("sync") = true,
        GIL(), "dst = a (op) b on device pointers with the CUDA reduce kernels (tests/benchmarks).");
  m.def("_reduce_emulated", &reduce_emulated_py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("dtype"),
        py::arg("op"), py::arg("scale") = 1.0, py::arg("nthreads") = 64,
        "The CUDA reduce kernel's body run on the host over numpy arrays (tests; no GPU needed).");
  m.def("_bench_reduce", &bench_reduce_py, py::arg("device"), py::arg("nbytes"), py::arg("dtype") = 0,
        py::arg("op") = 0, py::arg("iters") = 20,
        "Seconds per call of the reduce kernel and of a D2D cudaMemcpy on the same nbytes buffers.");
  m.def("_plan_channels", [](const std::vector<py::dict>& infos, int mode) {
    std::vector<rc::CudaPeerInfo> v;
    for (auto& d : infos) v.push_back(info_from_dict(d));
    // Through the wire format, as the real setup does.
    std::vector<rc::CudaPeerInfo> w;
    for (auto& p : v) w.push_back(rc::decode_peer_info(rc::encode_peer_info(p)));
    std::vector<std::string> out;
    for (auto k : rc::plan_channels(w, mode)) out.push_back(rc::channel_kind_name(k));
    return out;
  }, py::arg("infos"), py::arg("mode") = 0,
     "Channel kinds ('ipc'/'host'/'hostsync') for every (src, dst), row-major, from device descriptions (no GPU needed).");

  py::class_<HostSim>(m, "_HostSim")
      .def(py::init<int, int, int64_t, int, double>(), py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"),
           py::arg("nslots"), py::arg("timeout") = 60.0)
      .def("create", &HostSim::create, GIL())
      .def("attach", &HostSim::attach, GIL())
      .def("close", &HostSim::close, GIL())
      .def("piece_elems", &HostSim::piece_elems)
      .def("all_reduce", &HostSim::all_reduce, GIL())
      .def("reduce_scatter", &HostSim::reduce_scatter, GIL())
      .def("all_gather", &HostSim::all_gather, GIL())
      .def("broadcast", &HostSim::broadcast, GIL())
      .def("reduce", &HostSim::reduce, GIL())
      .def("all_to_all", &HostSim::all_to_all, GIL())
      .def("gather", &HostSim::gather, GIL())
      .def("scatter", &HostSim::scatter, GIL());

  py::class_<rc::CudaWork, std::shared_ptr<rc::CudaWork>>(m, "Work")
      .def("wait", &rc::CudaWork::wait, py::arg("timeout") = -1.0, GIL())
      .def("is_completed", &rc::CudaWork::is_completed, GIL())
      .def("stream_wait", [](rc::CudaWork& w, uintptr_t s) { w.stream_wait(S(s)); }, GIL())
      .def("error_code", &rc::CudaWork::error_code)
      .def("error_message", &rc::CudaWork::error_message)
      .def_property_readonly("op", &rc::CudaWork::op)
      .def_property_readonly("seq", &rc::CudaWork::seq);

  py::class_<CudaCommunicator, std::shared_ptr<CudaCommunicator>>(m, "Communicator")
      .def(py::init<int, int, int, double>(), py::arg("rank"), py::arg("world_size"), py::arg("device"),
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
             std::vector<std::string> v;
             for (auto& b : infos) v.push_back(b);
             std::string s;
             {
               py::gil_scoped_release nogil;
               s = c.create(v);
             }
             return py::bytes(s);
           })
      .def("connect", [](CudaCommunicator& c, const std::vector<py::bytes>& blobs) {
             std::vector<std::string> v;
             for (auto& b : blobs) v.push_back(b);
             py::gil_scoped_release nogil;
             c.connect(v);
           })
      .def_property_readonly("rank", &CudaCommunicator::rank)
      .def_property_readonly("world_size", &CudaCommunicator::world)
      .def_property_readonly("device", &CudaCommunicator::device)
      .def_property_readonly("timeout", &CudaCommunicator::timeout)
      .def_property_readonly("closed", &CudaCommunicator::closed)
      .def("channels", &CudaCommunicator::channels)
      .def("next_seq", &CudaCommunicator::next_seq)
      .def("all_reduce", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, uintptr_t s) {
             return c.all_reduce(P(in), P(out), n, D(d), O(o), S(s));
           }, GIL())
      .def("reduce_scatter", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, uintptr_t s) {
             return c.reduce_scatter(P(in), P(out), n, D(d), O(o), S(s));
           }, GIL())
      .def("all_gather", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t nin, int64_t nout, int d,
                            uintptr_t s) { return c.all_gather(P(in), P(out), nin, nout, D(d), S(s)); }, GIL())
      .def("broadcast", [](CudaCommunicator& c, uintptr_t buf, int64_t n, int d, int root, uintptr_t s) {
             return c.broadcast(P(buf), n, D(d), root, S(s));
           }, GIL())
      .def("reduce", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int o, int root,
                        uintptr_t s) { return c.reduce(P(in), P(out), n, D(d), O(o), root, S(s)); }, GIL())
      .def("barrier", [](CudaCommunicator& c, uintptr_t s) { return c.barrier(S(s)); }, GIL())
      .def("all_to_all", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, std::vector<int64_t> sc,
                            std::vector<int64_t> rcn, int d, uintptr_t s) {
             return c.all_to_all(P(in), P(out), std::move(sc), std::move(rcn), D(d), S(s));
           }, GIL())
      .def("gather", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, uintptr_t s) {
             return c.gather(P(in), P(out), n, D(d), root, S(s));
           }, GIL())
      .def("scatter", [](CudaCommunicator& c, uintptr_t in, uintptr_t out, int64_t n, int d, int root, uintptr_t s) {
             return c.scatter(P(in), P(out), n, D(d), root, S(s));
           }, GIL())
      .def("reject", [](CudaCommunicator& c, int coll) { c.reject(static_cast<rc::Coll>(coll)); }, GIL())
      .def("send", [](CudaCommunicator& c, uintptr_t buf, int64_t bytes, int dst, uint64_t tag, uintptr_t s) {
             return c.send(P(buf), bytes, dst, tag, S(s));
           }, GIL())
      .def("recv", [](CudaCommunicator& c, uintptr_t buf, int64_t bytes, int src, uint64_t tag, uintptr_t s) {
             return c.recv(P(buf), bytes, src, tag, S(s));
           }, GIL())
      .def("close", &CudaCommunicator::close, GIL());
}
