// The CUDA communicator: the communicator core (comm/core.h) with the CUDA device part
// (comm/cuda_device.h): collectives on device buffers of one GPU, enqueued on the caller's
// stream. Same contract as the host communicator - every collective is numbered, checked by the
// same argument rules and header exchange, a data-phase failure breaks the communicator and
// aborts the peers, one Work type - with the differences the device part states.
// Collectives from several threads are safe; they run one at a time, in submission order (every
// rank must issue them in the same order, as always).
#pragma once
#include <string>
#include <vector>

#include "comm/core.h"
#include "comm/cuda_device.h"
#include "common/knobs.h"

namespace rc {

class CudaCommunicator final : public CommCore {
 public:
  /// device: the CUDA device ordinal every buffer of this communicator lives on. The knobs are
  /// read once, here (Knobs::read()), or given.
  CudaCommunicator(int rank, int world, int device, double timeout_s);
  CudaCommunicator(int rank, int world, int device, double timeout_s, const Knobs& knobs);

  /// Setup (the caller moves the bytes between ranks; see transport/cuda_ipc.h).
  std::string local_info() { return cuda_->transport().local_info(); }
  std::string create(const std::vector<std::string>& infos) { return cuda_->transport().create(infos); }
  void connect(const std::vector<std::string>& blobs);

  int device() const { return cuda_->device(); }
  std::string channels() const { return cuda_->transport().describe_channels(); }
  /// The internal stream send/recv run on, and whether its enqueued copies are all done.
  uintptr_t p2p_stream() const { return cuda_->p2p_stream_handle(); }
  bool p2p_idle() { return cuda_->p2p_idle(); }
  /// The device ring's setup, geometry and grid (RINGCOMM_CUDA_P2P=device*, once created; its
  /// setup is kNone otherwise).
  const RingPlan& device_setup() const { return cuda_->transport().config().ring; }
  /// The device ring (RINGCOMM_CUDA_P2P=device, once connected), else nullptr (tests).
  DeviceRing* device_ring() { return cuda_->ring(); }
  /// Headers this rank has posted on the control plane's board (tests: a fused call posts none).
  uint64_t headers_posted() const { return cuda_->transport().ctl().headers_posted(); }
  /// The transport's owner id in the process's PinRegistry (tests).
  uint64_t pin_owner() const { return cuda_->transport().pin_owner(); }

 private:
  CudaDevice* cuda_;  // owned by the core
};

}  // namespace rc
