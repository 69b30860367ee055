#include "comm/communicator.h"

#include <chrono>

#include "common/env.h"
#include "common/errors.h"

namespace rc {

namespace {

// The bytes a collective moves, for the store policy: the collectives whose element count the
// header exchange checks equal on every rank (so every rank classifies them alike); 0 otherwise.
uint64_t policy_bytes(Coll coll, const CollHeader& h) {
  switch (coll) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kReduce:
      return h.count > 0 ? static_cast<uint64_t>(h.count) * dtype_size(static_cast<DType>(h.dtype)) : 0;
    default:
      return 0;
  }
}

}  // namespace

HostDevice::HostDevice(int rank, int world, double timeout_s)
    : world_(world), transport_(rank, world, ShmConfig::from_env(world, timeout_s)),
      scratch_(transport_.config().slot_bytes), coll_(&transport_, Lane::kColl, scratch_.data()),
      p2p_(&transport_, Lane::kP2P, nullptr) {
  const std::string algo = env_str("RINGCOMM_ALGO", "auto");
  if (algo == "ring") algo_ = Algo::kRing;
  else if (algo == "direct") algo_ = Algo::kDirect;
  else if (algo == "auto") algo_ = Algo::kAuto;
  else RC_THROW(InvalidArgument, "RINGCOMM_ALGO='" << algo << "': use ring, direct or auto");
  direct_max_bytes_ = env_int("RINGCOMM_DIRECT_MAX_BYTES", 64 * 1024);
}

bool HostDevice::use_direct(int64_t bytes) const {
  return algo_ == Algo::kDirect || (algo_ == Algo::kAuto && bytes * (world_ - 1) <= direct_max_bytes_);
}

std::shared_ptr<DeviceFence> HostDevice::execute(Coll coll, const CollHeader& h, void*, AlgoCtx& c,
                                                 const std::function<void(const AlgoCtx&)>& body) {
  const uint64_t bytes = policy_bytes(coll, h);
  const StorePolicy::Choice choice = store_policy_.choose(bytes, static_cast<int>(coll));
  coll_.set_streaming(choice.stream);
  c.ch = &coll_;
  c.scratch = scratch_.data();
  const auto t0 = std::chrono::steady_clock::now();
  body(c);
  if (choice.cls >= 0) {
    const auto dt = std::chrono::steady_clock::now() - t0;
    store_policy_.record(choice, bytes, std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
  }
  return nullptr;  // the host part is the whole collective
}

Communicator::Communicator(int rank, int world, double timeout_s)
    : CommCore(rank, world, std::make_unique<HostDevice>(rank, world, timeout_s)),
      host_(static_cast<HostDevice*>(&device_part())) {}

void Communicator::connect(const std::vector<std::string>& names) {
  RC_CHECK(!connected(), Error, "ringcomm: communicator already connected");
  host_->transport().attach(names);
  start();
}

}  // namespace rc
