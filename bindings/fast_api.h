// The C ABI through which another extension module (the torch c10d Backend trampoline,
// src/ringcomm/torch/trampoline.cpp, built just in time against torch) runs a host
// communicator's synchronous all_reduce or broadcast without Python in between (for
// dist.all_reduce, and for the host API's torch tensors, whose attributes it reads in C++). Plain C types only: the two
// modules share no C++ type. trampoline.cpp declares the same struct; `version` and `size` are
// checked there before any field is used, so a mismatched build falls back to the Python path.
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" {

struct RcFastApi {
  uint32_t version;  // kRcFastApiVersion
  uint32_t size;     // sizeof(RcFastApi)
  /// Drops one handle (a reference to a communicator, from Communicator._fast_handle()).
  void (*release)(void* handle);
  /// A synchronous all_reduce of `count` elements of dtype code `dtype` (common/dtype.h) with
  /// reduce op code `op` from `in` into `out` (the same buffer: in place; else disjoint), on the
  /// communicator behind `handle`; callable from any thread without the GIL. Returns 0 when it
  /// completed; else 1 + the ErrorCode (common/errors.h), with the message (NUL-terminated,
  /// truncated to msg_len - 1 bytes) in msg.
  int (*all_reduce)(void* handle, const void* in, void* out, int64_t count, int dtype, int op, char* msg,
                    size_t msg_len);
  /// A synchronous broadcast of `count` elements from rank `root` at `buf`; the same contract.
  int (*broadcast)(void* handle, void* buf, int64_t count, int dtype, int root, char* msg, size_t msg_len);
};

constexpr uint32_t kRcFastApiVersion = 2;
}
