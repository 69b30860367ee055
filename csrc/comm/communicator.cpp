#include "comm/communicator.h"

#include <algorithm>
#include <chrono>

#include "comm/header_exchange.h"
#include "common/errors.h"
#include "common/log.h"
#include "kernels/reduce_cpu_isa.h"
#include "transport/shm_types.h"

namespace rc {

HostDevice::HostDevice(int rank, int world, double timeout_s, const Knobs& knobs)
    : rank_(rank), world_(world),
      transport_(rank, world, ((void)set_log_level(knobs.debug), ShmConfig::host_from_knobs(knobs, world, timeout_s))),
      scratch_(transport_.config().slot_bytes), coll_(&transport_, Lane::kColl, scratch_.data()),
      p2p_(&transport_, Lane::kP2P, nullptr), ll_(&transport_) {}

DeviceCaps HostDevice::caps_for(const ShmConfig& cfg) {
  DeviceCaps d;
  d.host_algorithms = true;
  d.header_slot = true;
  d.ll_bytes = cfg.ll_bytes;
  d.streaming_stores = true;
  d.pieces.ring = static_cast<int64_t>(cfg.slot_bytes);
  d.pieces.far = static_cast<int64_t>(cfg.far_slot_bytes > 0 ? std::min(cfg.far_slot_bytes, cfg.slot_bytes) : cfg.slot_bytes);
  d.pieces.far_depth = cfg.far_nslots > 0 ? static_cast<int64_t>(cfg.far_nslots) : d.pieces.far_depth;
  return d;
}

void HostDevice::set_store(Store s) { coll_.set_streaming(s == Store::kStreaming); }

std::shared_ptr<DeviceFence> HostDevice::execute(Coll coll, const CollHeader& h, void*, AlgoCtx& c,
                                                 FunctionRef<void(const AlgoCtx&)> body) {
  coll_.set_streaming(h.store == static_cast<uint8_t>(Store::kStreaming));
  c.ch = split_ ? static_cast<Channel*>(split_.get()) : &coll_;
  c.scratch = scratch_.data();
  c.staging = &staging_;
  c.ll = &ll_;
  c.cma = transport_.cma().ready() ? &transport_.cma() : nullptr;
  if (!log_enabled(LogLevel::kTrace)) {
    body(c);
    return nullptr;  // the host part is the whole collective
  }
  const auto t0 = std::chrono::steady_clock::now();
  body(c);
  RC_LOG(kTrace, rank_, world_,
         describe_header(h) << " seq " << c.seq << " "
         << (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()) << " us");
  return nullptr;
}

void HostDevice::set_cpus(int threads, size_t min_bytes, const std::string& where, int ranks_sharing,
                          int node_ranks) {
  RC_CHECK(threads >= 1, InvalidArgument, "ringcomm: CPU threads per rank must be >= 1, got " << threads);
  cpus_ = where;
  transport_.set_ranks_sharing(ranks_sharing, node_ranks);
  split_.reset();
  pool_.reset();
  if (threads == 1) return;
  pool_ = std::make_unique<CpuPool>(threads, static_cast<int>(transport_.config().spin_ns() / 1000));
  split_ = std::make_unique<SplitChannel>(&coll_, pool_.get(), min_bytes, scratch_.data());
}

void HostDevice::settle_pool_spin() {
  if (pool_) pool_->set_spin_us(static_cast<int>(transport_.config().spin_ns() / 1000));
}

Communicator::Communicator(int rank, int world, double timeout_s)
    : Communicator(rank, world, timeout_s, Knobs::read()) {}

Communicator::Communicator(int rank, int world, double timeout_s, const Knobs& knobs)
    : CommCore(rank, world, std::make_unique<HostDevice>(rank, world, timeout_s, knobs), knobs),
      host_(static_cast<HostDevice*>(&device_part())) {}

void HostDevice::log_connected(const std::string& selection) {
  const ShmConfig& sc = transport_.config();
  RC_LOG(kInfo, rank_, world_,
         "transport shm; " << transport_.describe_geometry() << "; " << transport_.describe_liveness() << "; "
         << transport_.cma().describe() << "; " << selection << "; reduce ISA " << describe_reduce_cpu_isa() << "; " << transport_.describe_wait()
         << "; timeout " << sc.timeout_s << " s" << (cpus_.empty() ? "" : "; cpus: ") << cpus_);
}

void Communicator::connect(const std::vector<std::string>& names) {
  RC_CHECK(!connected(), Error, "ringcomm: communicator already connected");
  host_->transport().attach(names);
  host_->settle_pool_spin();
  start();
  host_->log_connected(describe_selection(world(), selection_knobs(), device_part().caps()));
}

}  // namespace rc
