// CUDA runtime errors as typed ringcomm errors. A failing CUDA call throws rc::Error
// (rc::Unsupported when there is no usable device or driver) naming the call, the CUDA error and
// file:line; nothing calls exit(). Included only by the CUDA module's sources.
#pragma once
#include <cuda_runtime_api.h>

#include "common/errors.h"

namespace rc {

inline bool cuda_error_means_unavailable(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInitializationError ||
         e == cudaErrorDevicesUnavailable || e == cudaErrorCompatNotSupportedOnDevice ||
         e == cudaErrorSystemDriverMismatch || e == cudaErrorStubLibrary;
}

}  // namespace rc

// RC_CUDA(call, context-stream-expression): run a CUDA runtime call; on failure clear the
// (non-sticky) error state and throw with the call's text, the CUDA error and the context.
#define RC_CUDA(call, ctx_expr)                                                                        \
  do {                                                                                                 \
    cudaError_t rc_cuda_err_ = (call);                                                                 \
    if (rc_cuda_err_ != cudaSuccess) {                                                                 \
      (void)cudaGetLastError();                                                                        \
      if (::rc::cuda_error_means_unavailable(rc_cuda_err_)) {                                          \
        RC_THROW(Unsupported, "ringcomm: CUDA unavailable: " #call " failed with "                    \
                                  << cudaGetErrorName(rc_cuda_err_) << " (" << cudaGetErrorString(rc_cuda_err_) \
                                  << ")" << ctx_expr);                                                 \
      }                                                                                                \
      RC_THROW(Error, "ringcomm: " #call " failed with " << cudaGetErrorName(rc_cuda_err_) << " ("     \
                                                          << cudaGetErrorString(rc_cuda_err_) << ")" << ctx_expr); \
    }                                                                                                  \
  } while (0)

namespace rc {

/// Makes `device` current for the scope (the caller's thread may use another device).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device_) RC_CUDA(cudaSetDevice(device_), " (device " << device_ << ")");
  }
  ~CudaDeviceGuard() {
    if (prev_ >= 0 && prev_ != device_) (void)cudaSetDevice(prev_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

}  // namespace rc
