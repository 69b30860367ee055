#include "comm/communicator_cuda.h"

#include <memory>

#include "common/errors.h"

namespace rc {

CudaCommunicator::CudaCommunicator(int rank, int world, int device, double timeout_s)
    : CudaCommunicator(rank, world, device, timeout_s, Knobs::read()) {}

CudaCommunicator::CudaCommunicator(int rank, int world, int device, double timeout_s, const Knobs& knobs)
    : CommCore(rank, world, std::make_unique<CudaDevice>(rank, world, device, timeout_s, knobs), knobs),
      cuda_(static_cast<CudaDevice*>(&device_part())) {
  cuda_->set_core(this);
}

void CudaCommunicator::connect(const std::vector<std::string>& blobs) {
  RC_CHECK(!connected(), Error, "ringcomm: the CUDA communicator is already connected");
  cuda_->connect(blobs);
  start();
}

}  // namespace rc
