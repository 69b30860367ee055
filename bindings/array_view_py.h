// A writable, C-contiguous numpy array of native byte order as (pointer, count, dtype), read
// straight from the array object's fields (pybind11's numpy proxies: a few loads, where the
// buffer protocol would build a format string and a Py_buffer): the host communicator's
// synchronous fast path. Anything else (another type or layout, a read-only array, a dtype
// ringcomm does not reduce, a non-native byte order) is "not taken" and the caller goes the
// general way, whose adapter explains the refusal.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "common/dtype.h"

namespace rc_py {

/// Holds a reference to the array while it lives (destroy it with the GIL held). The GIL may be
/// released in between: the caller's own reference keeps the array alive, and numpy refuses to
/// resize an array whose reference count shows other holders.
class ArrayView {
 public:
  explicit ArrayView(PyObject* obj) {
    namespace py = pybind11;
    if (!py::array::check_(obj)) return;
    arr_ = py::reinterpret_borrow<py::array>(obj);
    constexpr int kNeed = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    if ((arr_.flags() & kNeed) != kNeed) return;
    const py::dtype d = arr_.dtype();
    if (d.byteorder() == '>' || !dtype_of_num(d.num(), d.itemsize(), &dt_)) return;
    ptr_ = arr_.mutable_data();
    count_ = static_cast<int64_t>(arr_.size());
    ok_ = true;
  }
  ArrayView(const ArrayView&) = delete;
  ArrayView& operator=(const ArrayView&) = delete;

  bool ok() const { return ok_; }
  void* ptr() const { return ptr_; }
  int64_t count() const { return count_; }
  rc::DType dtype() const { return dt_; }

 private:
  // numpy type numbers (stable across numpy 1.x and 2.x; NPY_HALF is 23) with their item size:
  // C int/long/long long all map to int32 or int64 by size.
  static bool dtype_of_num(int num, ssize_t itemsize, rc::DType* dt) {
    using rc::DType;
    using api = pybind11::detail::npy_api;
    constexpr int kNpyHalf = 23;
    switch (num) {
      case api::NPY_FLOAT_: *dt = DType::kFloat32; return itemsize == 4;
      case api::NPY_DOUBLE_: *dt = DType::kFloat64; return itemsize == 8;
      case kNpyHalf: *dt = DType::kFloat16; return itemsize == 2;
      case api::NPY_BYTE_: *dt = DType::kInt8; return itemsize == 1;
      case api::NPY_UBYTE_: *dt = DType::kUInt8; return itemsize == 1;
      case api::NPY_BOOL_: *dt = DType::kBool; return itemsize == 1;
      case api::NPY_INT_:
      case api::NPY_LONG_:
      case api::NPY_LONGLONG_:
        if (itemsize == 4) *dt = DType::kInt32;
        else if (itemsize == 8) *dt = DType::kInt64;
        else return false;
        return true;
      default: return false;
    }
  }

  pybind11::array arr_;
  void* ptr_ = nullptr;
  int64_t count_ = 0;
  rc::DType dt_ = rc::DType::kFloat32;
  bool ok_ = false;
};

}  // namespace rc_py
