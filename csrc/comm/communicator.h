// The host communicator: the communicator core (comm/core.h) over host shared memory. Its
// device part (HostDevice) holds the shm transport, the collective and point-to-point lanes'
// ShmChannels, the all-reduce algorithm choice and the store policy; collectives run on the
// host and are complete when their host part is.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/core.h"
#include "comm/store_policy.h"
#include "transport/shm.h"
#include "transport/shm_channel.h"

namespace rc {

class HostDevice final : public CommDevice {
 public:
  HostDevice(int rank, int world, double timeout_s);
  ShmTransport& transport() { return transport_; }
  /// The INFO line a connected communicator logs (transport, slots, algorithm, store policy, ISA).
  void log_connected();

  const char* name() const override { return "communicator"; }
  ShmTransport& control() override { return transport_; }
  const MemoryCheck* memory() const override { return nullptr; }
  int64_t all_reduce_algo(int64_t bytes) const override;
  bool use_ll(Coll coll, int64_t bytes) const override;
  Channel* header_slot_channel() override { return &coll_; }
  void abort(uint32_t kind, const std::string& msg) override { transport_.abort(kind, msg); }
  std::shared_ptr<DeviceFence> execute(Coll coll, const CollHeader& h, void* stream, AlgoCtx& c,
                                       const std::function<void(const AlgoCtx&)>& body) override;
  Channel& p2p_channel() override { return p2p_; }
  void close(bool broken) override { transport_.close(); }

 private:
  int rank_, world_;
  ShmTransport transport_;
  // All-reduce algorithm choice: RINGCOMM_ALGO = ring | direct | two_shot | auto (default). auto
  // takes the LL outbox (algo/ll.cpp, use_ll) for messages of at most RINGCOMM_LL_MAX_BYTES, the
  // direct exchange (one hand-off) while its extra copies are cheap - message bytes times
  // (world-1) at most RINGCOMM_DIRECT_MAX_BYTES -, then, with RINGCOMM_TWO_SHOT_MIN_WORLD ranks or
  // more, the two-shot (two hand-offs instead of 2(N-1)) while the message is at most
  // RINGCOMM_TWO_SHOT_MAX_BYTES, and the bandwidth-optimal ring above that (all_reduce_algo).
  enum class Algo { kRing, kDirect, kTwoShot, kAuto } algo_ = Algo::kAuto;
  int64_t direct_max_bytes_ = 0;
  int64_t two_shot_max_bytes_ = 0;
  int64_t two_shot_min_world_ = 0;
  std::vector<char> scratch_;  // one slot of private memory (direct all-reduce, streamed fused reductions)
  ShmChannel coll_;            // the collective lane; used by the executing thread only
  ShmChannel p2p_;             // the point-to-point lane; used by the p2p thread only
  // How this rank writes into peers' slots (cached or streaming stores), measured per size class;
  // used by the executing thread only (collectives run one at a time).
  StorePolicy store_policy_;
};

class Communicator final : public CommCore {
 public:
  /// timeout_s <= 0 takes RINGCOMM_TIMEOUT (default 300 s).
  Communicator(int rank, int world, double timeout_s);

  /// Rendezvous, step 1: create this rank's shared memory; publish the returned name.
  std::string create() { return host_->transport().create(); }
  /// Rendezvous, step 2: names of every rank's segment in rank order. Starts the threads.
  void connect(const std::vector<std::string>& names);
  /// The shm transport's wait counters (see ShmTransport::WaitStats).
  ShmTransport::WaitStats wait_stats() const { return host_->transport().wait_stats(); }

 private:
  HostDevice* host_;  // owned by the core
};

}  // namespace rc
