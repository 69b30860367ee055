// A writable, C-contiguous buffer-protocol array (numpy) as (pointer, count, dtype) in one
// request: the host communicator's synchronous fast path. Anything else (another layout, a
// read-only array, a format ringcomm does not reduce, a non-native byte order) is "not taken"
// and the caller goes the general way, whose adapter explains the refusal.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>

#include "common/dtype.h"

namespace rc_py {

/// Holds the buffer view while it lives: the memory stays valid (and the exporter's buffer
/// locked) until destruction, which needs the GIL.
class ArrayView {
 public:
  explicit ArrayView(PyObject* obj) {
    ok_ = PyObject_GetBuffer(obj, &view_, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) == 0;
    if (!ok_) {
      PyErr_Clear();
      return;
    }
    ok_ = dtype_of_format(view_.format, view_.itemsize, &dt_);
  }
  ~ArrayView() {
    if (view_.obj != nullptr) PyBuffer_Release(&view_);
  }
  ArrayView(const ArrayView&) = delete;
  ArrayView& operator=(const ArrayView&) = delete;

  bool ok() const { return ok_; }
  void* ptr() const { return view_.buf; }
  int64_t count() const { return static_cast<int64_t>(view_.len / view_.itemsize); }
  rc::DType dtype() const { return dt_; }

 private:
  // struct-module format codes of native (or, on this little-endian host, '<') order.
  static bool dtype_of_format(const char* f, Py_ssize_t itemsize, rc::DType* dt) {
    if (f == nullptr) return false;
    if (*f == '@' || *f == '=' || *f == '<') ++f;
    if (f[0] == '\0' || f[1] != '\0') return false;
    using rc::DType;
    switch (f[0]) {
      case 'f': *dt = DType::kFloat32; return itemsize == 4;
      case 'd': *dt = DType::kFloat64; return itemsize == 8;
      case 'e': *dt = DType::kFloat16; return itemsize == 2;
      case 'b': *dt = DType::kInt8; return itemsize == 1;
      case 'B': *dt = DType::kUInt8; return itemsize == 1;
      case '?': *dt = DType::kBool; return itemsize == 1;
      case 'i':
      case 'l':
      case 'q':
        if (itemsize == 4) *dt = DType::kInt32;
        else if (itemsize == 8) *dt = DType::kInt64;
        else return false;
        return true;
      default: return false;
    }
  }

  Py_buffer view_{};
  rc::DType dt_ = rc::DType::kFloat32;
  bool ok_ = false;
};

}  // namespace rc_py
