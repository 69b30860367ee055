// ringcomm._C_cuda_test: what only the tests use of the CUDA build (beside ringcomm._C_cuda, built
// with it): the CUDA reduce kernels' table, the kernel on device pointers and its body run on the
// host, and the channel plan (transport/cuda_ipc.h) from device descriptions. Linked with the
// static CUDA runtime like ringcomm._C_cuda, so it imports without libcudart or a driver.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm_methods_py.h"
#include "cuda_methods_py.h"
#include "errors_py.h"

#include "common/cuda_check.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"
#include "device/ring_cuda.h"
#include "kernels/reduce_cuda.h"
#include "transport/cuda_ipc.h"

namespace py = pybind11;
using rc::DType;
using rc::ReduceOp;

namespace {

using rc_py::dtype_of;
using rc_py::op_of;
using rc_py::ptr_of;
inline cudaStream_t S(uintptr_t a) { return reinterpret_cast<cudaStream_t>(a); }

void reduce_py(uintptr_t dst, uintptr_t a, uintptr_t b, int64_t n, int dt, int op, double scale, uintptr_t stream,
               int device, bool sync) {
  RC_CHECK(n >= 0, InvalidArgument, "reduce: negative count");
  rc::check_reduce_supported(dtype_of(dt), op_of(op));  // the same table as the GPU switch (tests compare them)
  rc::CudaDeviceGuard g(device);
  rc::reduce_cuda(ptr_of(dst), ptr_of(a), ptr_of(b), static_cast<size_t>(n), dtype_of(dt), op_of(op), scale,
                  S(stream), 0);
  if (sync) RC_CUDA(cudaStreamSynchronize(S(stream)), "");
}

// The CUDA kernel body run on the host (reduce_cuda_emulate) on numpy arrays: tests compare it
// bit for bit with the CPU kernels, on every dtype x op, alignment and thread count, without a GPU.
void reduce_emulated_py(py::array dst, py::array a, py::array b, int dt, int op, double scale, int64_t nthreads) {
  const size_t n = static_cast<size_t>(dst.size());
  const size_t es = rc::dtype_size(dtype_of(dt));
  for (const py::array* x : {&dst, &a, &b}) {
    RC_CHECK(static_cast<size_t>(x->size()) == n && static_cast<size_t>(x->itemsize()) == es &&
                 (x->flags() & py::array::c_style),
             InvalidArgument, "reduce_emulated: arrays must be C-contiguous, of one length and the dtype's itemsize");
  }
  RC_CHECK(nthreads >= 1, InvalidArgument, "reduce_emulated: nthreads must be >= 1");
  rc::reduce_cuda_emulate(dst.mutable_data(), a.data(), b.data(), n, dtype_of(dt), op_of(op), scale,
                          static_cast<size_t>(nthreads));
}

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
  p.mps = d.contains("mps") && d["mps"].cast<bool>();
  p.sms = d.contains("sms") ? d["sms"].cast<int32_t>() : 132;
  p.ring_blocks_per_sm = d.contains("blocks_per_sm") ? d["blocks_per_sm"].cast<int32_t>() : 2;
  p.max_blocks = d.contains("max_blocks") ? d["max_blocks"].cast<int32_t>() : 0;
  p.ring_lanes = d.contains("ring_lanes") ? d["ring_lanes"].cast<int32_t>() : 4;
  p.ring_knobs_set = d.contains("knobs_set") ? d["knobs_set"].cast<uint32_t>() : 0;
  p.ledger_free = d.contains("ledger_free") ? d["ledger_free"].cast<int32_t>() : -1;
  p.ledger_holders = d.contains("ledger_holders") ? d["ledger_holders"].cast<std::string>() : "";
  return p;
}

}  // namespace

PYBIND11_MODULE(_C_cuda_test, m) {
  m.doc() = "ringcomm CUDA test hooks: the reduce kernels and the channel plan (tests only)";
  register_error_translator(true);
  m.def("reduce_supported", [](int dt, int op) {
    if (dt < 0 || dt >= static_cast<int>(DType::kCount) || op < 0 || op >= static_cast<int>(ReduceOp::kCount)) return false;
    return rc::reduce_cuda_supported(dtype_of(dt), op_of(op));
  }, py::arg("dtype"), py::arg("op"), "True when the CUDA switch has a kernel for the (dtype, op) codes (no GPU needed).");
  m.def("reduce", &reduce_py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"),
        py::arg("op"), py::arg("scale") = 1.0, py::arg("stream") = 0, py::arg("device") = 0, py::arg("sync") = true,
        rc_py::ReleaseGil(), "dst = a (op) b on device pointers with the CUDA reduce kernels.");
  m.def("reduce_emulated", &reduce_emulated_py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("dtype"),
        py::arg("op"), py::arg("scale") = 1.0, py::arg("nthreads") = 64,
        "The CUDA reduce kernel's body run on the host over numpy arrays (no GPU needed).");
  m.def("plan_channels", [](const std::vector<py::dict>& infos, int mode) {
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
  m.def("ring_kernel_count", [] { return rc::ring_kernels().size(); },
        "How many ring kernels the device ring loads at init (device/ring_cuda.h's ring_kernels(); no GPU needed).");
  m.def("plan_device_ring", [](const std::vector<py::dict>& infos, int mode) {
    std::vector<rc::CudaPeerInfo> w;
    for (auto& d : infos) w.push_back(rc::decode_peer_info(rc::encode_peer_info(info_from_dict(d))));
    return rc_py::ring_plan_dict(rc::plan_device_ring(w, mode));
  }, py::arg("infos"), py::arg("mode") = 4,
     "The device ring's setup, signalling, grid (blocks), slots and SM budget from device descriptions (no GPU needed).");
}
