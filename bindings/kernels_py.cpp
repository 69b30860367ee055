// Test/utility bindings for the CPU reduce kernels (csrc/kernels/reduce_cpu.h).
// module.cpp calls bind_kernels(m); C++ exceptions are mapped to Python ones there, globally
// (rc::Unsupported -> a TypeError subclass, rc::InvalidArgument -> a ValueError subclass).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"
#include "kernels/reduce_cpu_isa.h"
#include "kernels/copy_cpu.h"
#include "kernels/cpu_pool.h"
#include "transport/cpu_pair_probe.h"

#include <memory>

namespace py = pybind11;

namespace {

// Arguments are taken as py::object and must already be numpy arrays: letting pybind11 convert
// (say) a list would make dst a temporary and silently drop the result.
py::array as_array(const py::object& obj, const char* name) {
  RC_CHECK(py::isinstance<py::array>(obj), InvalidArgument,
           "_reduce: " << name << " must be a numpy array, got " << std::string(py::str(py::type::of(obj))));
  return py::reinterpret_borrow<py::array>(obj);
}

// The kernels see raw bytes: the arrays must be C-contiguous, of the same length, and their
// itemsize must match the dtype code (bfloat16 travels as uint16 or ml_dtypes.bfloat16).
void check_array(const py::array& arr, const char* name, size_t n, size_t esz) {
  RC_CHECK(arr.flags() & py::array::c_style, InvalidArgument, "_reduce: " << name << " must be C-contiguous");
  RC_CHECK(static_cast<size_t>(arr.size()) == n, InvalidArgument,
           "_reduce: " << name << " has " << arr.size() << " elements, dst has " << n);
  RC_CHECK(static_cast<size_t>(arr.itemsize()) == esz, InvalidArgument,
           "_reduce: " << name << " has itemsize " << arr.itemsize() << ", dtype needs " << esz);
}

void reduce_py(const py::object& dst_obj, const py::object& a_obj, const py::object& b_obj,
               int64_t dtype_code, int64_t op_code, double scale, const std::string& isa_name) {
  RC_CHECK(dtype_code >= 0 && dtype_code < static_cast<int64_t>(rc::DType::kCount), InvalidArgument,
           "_reduce: unknown dtype code " << dtype_code);
  RC_CHECK(op_code >= 0 && op_code < static_cast<int64_t>(rc::ReduceOp::kCount), InvalidArgument,
           "_reduce: unknown reduce op code " << op_code);
  const auto dt = static_cast<rc::DType>(dtype_code);
  const auto op = static_cast<rc::ReduceOp>(op_code);
  rc::check_reduce_supported(dt, op);  // Unsupported before any shape complaint
  const rc::CpuIsa isa = rc::parse_cpu_isa(isa_name.c_str());
  py::array dst = as_array(dst_obj, "dst");
  const py::array a = as_array(a_obj, "a"), b = as_array(b_obj, "b");
  const size_t n = static_cast<size_t>(dst.size());
  const size_t esz = rc::dtype_size(dt);
  check_array(dst, "dst", n, esz);
  check_array(a, "a", n, esz);
  check_array(b, "b", n, esz);
  RC_CHECK(dst.writeable(), InvalidArgument, "_reduce: dst is read-only");
  void* d = dst.mutable_data();
  const void* pa = a.data();
  const void* pb = b.data();
  py::gil_scoped_release nogil;
  rc::reduce_cpu_with_isa(d, pa, pb, n, dt, op, scale, isa);
}

// The split kernels on a pool of `threads` made for the call (or kept between calls in `pool`):
// reduce (op >= 0) or copy (op < 0; stream: copy_to_peer's streaming stores) of src/a,b into dst.
struct PoolHolder {
  std::unique_ptr<rc::CpuPool> pool;
};

void split_py(PoolHolder& h, const py::object& dst_obj, const py::object& a_obj, const py::object& b_obj,
              int64_t dtype_code, int64_t op_code, double scale, size_t min_bytes, bool stream) {
  RC_CHECK(dtype_code >= 0 && dtype_code < static_cast<int64_t>(rc::DType::kCount), InvalidArgument,
           "_split: unknown dtype code " << dtype_code);
  const auto dt = static_cast<rc::DType>(dtype_code);
  py::array dst = as_array(dst_obj, "dst");
  const py::array a = as_array(a_obj, "a");
  const size_t n = static_cast<size_t>(dst.size());
  const size_t esz = rc::dtype_size(dt);
  check_array(dst, "dst", n, esz);
  check_array(a, "a", n, esz);
  RC_CHECK(dst.writeable(), InvalidArgument, "_split: dst is read-only");
  void* d = dst.mutable_data();
  const void* pa = a.data();
  if (op_code < 0) {
    py::gil_scoped_release nogil;
    rc::copy_split(h.pool.get(), min_bytes, d, pa, n * esz, stream);
    return;
  }
  RC_CHECK(op_code < static_cast<int64_t>(rc::ReduceOp::kCount), InvalidArgument, "_split: unknown op " << op_code);
  const auto op = static_cast<rc::ReduceOp>(op_code);
  const py::array b = as_array(b_obj, "b");
  check_array(b, "b", n, esz);
  const void* pb = b.data();
  py::gil_scoped_release nogil;
  rc::reduce_split(h.pool.get(), min_bytes, d, pa, pb, n, dt, op, scale);
}

}  // namespace

void bind_kernels(py::module_& m, bool module_local) {
  py::class_<PoolHolder>(m, "_CpuPool",
                         "Test/benchmark handle: the CpuPool (kernels/cpu_pool.h) of `threads` threads that "
                         "a host communicator uses for large copies and reductions.",
                         py::module_local(module_local))
      .def(py::init([](int threads, int spin_us) {
             RC_CHECK(threads >= 1, InvalidArgument, "_CpuPool: threads must be >= 1, got " << threads);
             auto h = std::make_unique<PoolHolder>();
             if (threads > 1) h->pool = std::make_unique<rc::CpuPool>(threads, spin_us);
             return h;
           }), py::arg("threads"), py::arg("spin_us") = 50)
      .def_property_readonly("threads", [](const PoolHolder& h) { return h.pool ? h.pool->threads() : 1; })
      .def("reduce", [](PoolHolder& h, const py::object& dst, const py::object& a, const py::object& b,
                        int64_t dtype, int64_t op, double scale, size_t min_bytes) {
             RC_CHECK(op >= 0, InvalidArgument, "_CpuPool.reduce: unknown op " << op);
             split_py(h, dst, a, b, dtype, op, scale, min_bytes, false);
           }, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("dtype"), py::arg("op"), py::arg("scale") = 1.0,
           py::arg("min_bytes") = 0,
           "dst = a (op) b split over the pool's threads when the bytes are >= min_bytes (GIL released).")
      .def("copy", [](PoolHolder& h, const py::object& dst, const py::object& src, int64_t dtype, bool stream,
                      size_t min_bytes) { split_py(h, dst, src, py::none(), dtype, -1, 1.0, min_bytes, stream); },
           py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("stream") = false, py::arg("min_bytes") = 0,
           "dst = src split likewise (stream: non-temporal stores, as into a peer's slot).");
  m.def("_reduce", &reduce_py, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("dtype"), py::arg("op"),
        py::arg("scale") = 1.0, py::arg("isa") = "auto",
        "dst[:] = a (op) b elementwise with the CPU reduce kernels (tests/benchmarks).\n"
        "dtype/op are rc::DType / rc::ReduceOp codes; scale applies to AVG only; isa is 'auto' (the\n"
        "RINGCOMM_CPU_ISA choice for dtype), 'generic', 'avx2' or 'avx512'. Runs with the GIL released.");

  // Tests only: the copy into a peer's slot (cached or streaming stores).
  m.def("_copy_to_peer", [](py::buffer dst, py::buffer src, bool stream) {
    py::buffer_info d = dst.request(true), s = src.request();
    RC_CHECK(d.size * d.itemsize == s.size * s.itemsize, InvalidArgument, "_copy_to_peer: sizes differ");
    rc::copy_to_peer(d.ptr, s.ptr, static_cast<size_t>(s.size * s.itemsize), stream);
  }, py::arg("dst"), py::arg("src"), py::arg("stream"));

  // Benchmarks: the cross-CPU hand-off figures (transport/cpu_pair_probe.h).
  m.def("_cpu_pair", [](int cpu_a, int cpu_b, size_t handoff_bytes, double seconds) {
    rc::CpuPairProbe p;
    {
      py::gil_scoped_release nogil;
      p = rc::probe_cpu_pair(cpu_a, cpu_b, handoff_bytes, seconds);
    }
    py::dict d;
    d["round_trip_ns"] = p.round_trip_ns;
    d["handoff_gbps"] = p.handoff_Bps / 1e9;
    return d;
  }, py::arg("cpu_a"), py::arg("cpu_b"), py::arg("handoff_bytes") = 256 << 10, py::arg("seconds") = 0.2,
        "Two threads pinned to cpu_a and cpu_b (GIL released): the median round trip of a cache line between\n"
        "them (ns) and the rate of handing handoff_bytes through two slots (copy in, copy out; GB/s = 1e9 B/s).");
}
