"""What reading one torch CPU tensor costs from a C extension that does not link torch, the two
ways ringcomm._C could do it, timed in C++ (no Python loop in between): its DLPack capsule
(torch.utils.dlpack.to_dlpack, the pointer, shape, strides and dtype read from the
DLManagedTensor, the capsule dropped), or six attribute reads (dtype looked up in a dict, layout,
is_cpu, is_contiguous(), data_ptr(), numel()). Compiles a small pybind11 module with g++ in a
temporary directory:

    python benchmarks/probes/torch_read_cost.py
"""
import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile

SOURCE = r"""
#include <pybind11/pybind11.h>
#include <chrono>
namespace py = pybind11;
struct DLTensor_ { void* data; int32_t dev_type, dev_id; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                   int64_t* shape; int64_t* strides; uint64_t byte_offset; };
using Clock = std::chrono::steady_clock;
double us(Clock::time_point t0, int n) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n; }
double via_dlpack(py::handle x, py::handle to_dlpack, int n) {
  int64_t acc = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    PyObject* cap = PyObject_CallOneArg(to_dlpack.ptr(), x.ptr());
    auto* t = static_cast<DLTensor_*>(PyCapsule_GetPointer(cap, "dltensor"));
    acc += t->ndim + t->code + t->shape[0] + (t->strides ? t->strides[0] : 0) + (int64_t)t->data;
    Py_DECREF(cap);
  }
  double r = us(t0, n);
  return acc == 42 ? r + 1e-12 : r;
}
double via_attrs(py::handle x, py::handle codes, py::handle strided, int n) {
  py::str dtype("dtype"), layout("layout"), is_cpu("is_cpu"), contig("is_contiguous"), ptr("data_ptr"), numel("numel");
  int64_t acc = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    PyObject* d = PyObject_GetAttr(x.ptr(), dtype.ptr());
    acc += PyDict_GetItem(codes.ptr(), d) != nullptr;
    Py_DECREF(d);
    PyObject* l = PyObject_GetAttr(x.ptr(), layout.ptr()); acc += l == strided.ptr(); Py_DECREF(l);
    PyObject* c = PyObject_GetAttr(x.ptr(), is_cpu.ptr()); acc += c == Py_True; Py_DECREF(c);
    PyObject* k = PyObject_CallMethodNoArgs(x.ptr(), contig.ptr()); acc += k == Py_True; Py_DECREF(k);
    PyObject* p = PyObject_CallMethodNoArgs(x.ptr(), ptr.ptr()); acc += PyLong_AsLongLong(p); Py_DECREF(p);
    PyObject* m = PyObject_CallMethodNoArgs(x.ptr(), numel.ptr()); acc += PyLong_AsLongLong(m); Py_DECREF(m);
  }
  double r = us(t0, n);
  return acc == 42 ? r + 1e-12 : r;
}
PYBIND11_MODULE(torch_read_cost, m) { m.def("via_dlpack", &via_dlpack); m.def("via_attrs", &via_attrs); }
"""


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__.split("\n\n")[0])


def main(argv=None):
    build_parser().parse_args(argv)
    import pybind11
    import torch
    import torch.utils.dlpack
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "m.cpp")
        with open(src, "w") as f:
            f.write(SOURCE)
        out = os.path.join(d, "torch_read_cost" + sysconfig.get_config_var("EXT_SUFFIX"))
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-I", pybind11.get_include(),
                        "-I", sysconfig.get_paths()["include"], src, "-o", out], check=True)
        sys.path.insert(0, d)
        import torch_read_cost as m
        x = torch.ones(256)
        codes = {torch.float32: 0}
        for _ in range(3):
            dl = min(m.via_dlpack(x, torch.utils.dlpack.to_dlpack, 200000) for _ in range(5))
            at = min(m.via_attrs(x, codes, torch.strided, 200000) for _ in range(5))
            print(f"DLPack capsule {dl:.3f} us   six attribute reads {at:.3f} us   (min of 5 x 200000)")


if __name__ == "__main__":
    main()
