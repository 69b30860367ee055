// The host communicator: the communicator core (comm/core.h) over host shared memory. Its
// device part (HostDevice) holds the shm transport, the collective and point-to-point lanes'
// ShmChannels and the LL protocol over its outbox; it reports what it can run (DeviceCaps:
// every algorithm and protocol, streaming stores) and applies the store policy each call's
// header carries. Collectives run on the host and are complete when their host part is.
// With more than one CPU thread per rank (set_cpu_threads, chosen by the Python front from the
// rank's CPUs: src/ringcomm/core/cpus.py) the collective lane is a SplitChannel over the ShmChannel:
// large copies and reductions run on the device's CpuPool.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/core.h"
#include "comm/device.h"
#include "comm/selection.h"
#include "common/errors.h"
#include "common/knobs.h"
#include "kernels/cpu_pool.h"
#include "proto/ll.h"
#include "transport/shm.h"
#include "transport/shm_channel.h"
#include "transport/shm_config.h"
#include "transport/shm_control.h"
#include "transport/split_channel.h"

namespace rc {

class HostDevice final : public CommDevice {
 public:
  HostDevice(int rank, int world, double timeout_s, const Knobs& knobs);
  ShmTransport& transport() { return transport_; }
  /// The INFO line a connected communicator logs (transport, slots, selection, ISA, waits).
  void log_connected(const std::string& selection);

  const char* name() const override { return "communicator"; }
  ShmControl& control() override { return transport_; }
  const MemoryCheck* memory() const override { return nullptr; }
  DeviceCaps caps() const override {
    DeviceCaps d = caps_for(transport_.config());
    d.cma = transport_.cma().ready();  // false until connected
    return d;
  }
  /// A host device's capabilities under transport configuration `cfg`.
  static DeviceCaps caps_for(const ShmConfig& cfg);
  Channel* header_slot_channel() override { return &coll_; }
  void abort(uint32_t kind, const std::string& msg) override { transport_.abort(kind, msg); }
  std::shared_ptr<DeviceFence> execute(Coll coll, const CollHeader& h, void* stream, AlgoCtx& c,
                                       FunctionRef<void(const AlgoCtx&)> body) override;
  void set_store(Store s) override;
  Channel& p2p_channel() override { return p2p_; }
  void close(bool broken) override {
    split_.reset();
    pool_.reset();
    transport_.close();
  }
  /// Split copies and reductions of at least min_bytes over `threads` threads (1: none); `where`
  /// (the rank's CPUs, from the Python front) ends the INFO line. Called before connect().
  /// ranks_sharing: the local ranks on this rank's CPUs where the front pinned them, node_ranks:
  /// the ranks on this node of every group (0: unknown), for the wait policy.
  void set_cpus(int threads, size_t min_bytes, const std::string& where, int ranks_sharing = 0, int node_ranks = 0);
  int cpu_threads() const { return pool_ ? pool_->threads() : 1; }
  /// The pool's idle spin (µs), or -1 without a pool.
  int pool_spin_us() const { return pool_ ? pool_->spin_us() : -1; }
  /// The pool idles as long as the waits spin, which attach() settles from the ranks' masks
  /// (the pool itself is built by set_cpus, before any peer waits on this rank).
  void settle_pool_spin();

 private:
  int rank_, world_;
  ShmTransport transport_;
  std::vector<char> staging_;  // AlgoCtx::staging: grown by the algorithms that stage whole steps
  std::vector<char> scratch_;  // one slot of private memory (direct all-reduce, streamed fused reductions)
  ShmChannel coll_;            // the collective lane; used by the executing thread only
  ShmChannel p2p_;             // the point-to-point lane; used by the p2p thread only
  LLProtocol ll_;              // over this rank's outbox; used by the executing thread only
  std::unique_ptr<CpuPool> pool_;         // null: one thread; run by the executing thread only
  std::unique_ptr<SplitChannel> split_;   // over coll_ and pool_, when pool_ exists
  std::string cpus_;                      // the INFO line's placement (set_cpus)
};

class Communicator final : public CommCore {
 public:
  /// timeout_s <= 0 takes RINGCOMM_TIMEOUT (default 300 s). The knobs are read once, here
  /// (Knobs::read()), or given; every layer takes its values from them.
  Communicator(int rank, int world, double timeout_s);
  Communicator(int rank, int world, double timeout_s, const Knobs& knobs);

  /// Rendezvous, step 1: create this rank's shared memory; publish the returned name.
  std::string create() { return host_->transport().create(); }
  /// Rendezvous, step 2: names of every rank's segment in rank order. Starts the threads.
  void connect(const std::vector<std::string>& names);
  /// The shm transport's wait counters (see ShmControl::WaitStats).
  ShmControl::WaitStats wait_stats() const { return host_->transport().wait_stats(); }
  /// The shm transport's wait policy in words (ShmControl::describe_wait).
  std::string describe_wait() const { return host_->transport().describe_wait(); }
  /// See HostDevice::set_cpus.
  void set_cpus(int threads, size_t min_bytes, const std::string& where, int ranks_sharing = 0, int node_ranks = 0) {
    RC_CHECK(!connected(), Error, "ringcomm: set_cpus after connect");
    host_->set_cpus(threads, min_bytes, where, ranks_sharing, node_ranks);
  }
  int cpu_threads() const { return host_->cpu_threads(); }
  int pool_spin_us() const { return host_->pool_spin_us(); }

 private:
  HostDevice* host_;  // owned by the core
};

}  // namespace rc
