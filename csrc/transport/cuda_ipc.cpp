// CUDA IPC transport: setup, slots and teardown (see cuda_ipc.h for the protocol and its
// invariants; cuda_ipc_plan.cpp for the knobs, wire format and channel planner).
#include "transport/cuda_ipc.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/cuda_check.h"
#include "common/errors.h"
#include "common/log.h"
#include "transport/cuda_ipc_wire.h"
#include "transport/futex.h"

namespace rc {

using namespace cuda_ipc_wire;

// ---------------- per-channel state ----------------

struct CudaIpcTransport::Chan {
  ChannelKind out = ChannelKind::kIpc;  // this rank -> peer
  ChannelKind in = ChannelKind::kIpc;   // peer -> this rank
  uint64_t sent = 0;                    // slots published to peer (mirrors the shm head)
  uint64_t received = 0;                // slots released from peer (mirrors the shm tail)
  std::vector<char*> out_dev;           // out, kHost*: device pointers of the peer's shm slots
  std::vector<char*> in_dev;            // in, kHost*: device pointers of our shm slots
  cudaEvent_t done = nullptr;           // this process's own event: recorded after a slot's work, polled
  WaitCtx out_w, in_w;                  // the current outgoing / incoming slot's operation (finish_*)
};

CudaIpcTransport::CudaIpcTransport(int rank, int world, int device, double timeout_s, const Knobs& knobs,
                                   const CudaRingLayout& ring)
    : rank_(rank), world_(world), device_(device), ring_layout_(ring),
      cfg_(CudaIpcConfig::from_knobs(knobs, world, timeout_s, ring)),
      peer_inbox_(world, nullptr), pins_(&PinRegistry::process()), pin_owner_(pins_->new_owner()) {
  RC_CHECK(world >= 1, InvalidArgument, "world size must be >= 1, got " << world);
  RC_CHECK(rank >= 0 && rank < world, InvalidArgument, "rank " << rank << " out of range [0, " << world << ")");
  RC_CHECK(device >= 0, InvalidArgument, "ringcomm: CUDA device " << device << " is invalid");
  chans_.resize(static_cast<size_t>(kNumLanes) * world);
  for (auto& c : chans_) c = std::make_unique<Chan>();
}

CudaIpcTransport::~CudaIpcTransport() {
  try {
    close(false);
  } catch (...) {
  }
}

CudaIpcTransport::Chan& CudaIpcTransport::chan(Lane lane, int peer) {
  return *chans_[static_cast<size_t>(lane) * world_ + peer];
}

size_t CudaIpcTransport::inbox_offset(Lane lane, int src, uint32_t slot) const {
  return ((static_cast<size_t>(lane) * world_ + src) * cfg_.nslots + slot) * cfg_.slot_bytes;
}

std::string CudaIpcTransport::local_info() const {
  CudaDeviceGuard g(device_);
  CudaPeerInfo p;
  p.pid = static_cast<int32_t>(getpid());
  p.device = device_;
  p.host = hostname();
  cudaDeviceProp prop;
  RC_CUDA(cudaGetDeviceProperties(&prop, device_), " (device " << device_ << ")");
  p.uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  int v = 0;
  p.ipc_events = cudaDeviceGetAttribute(&v, cudaDevAttrIpcEventSupport, device_) == cudaSuccess && v != 0;
  (void)cudaGetLastError();
  p.mode = cfg_.mode;
  p.slot_bytes = cfg_.slot_bytes;
  p.nslots = cfg_.nslots;
  int n = 0;
  RC_CUDA(cudaGetDeviceCount(&n), "");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp pi;
    RC_CUDA(cudaGetDeviceProperties(&pi, i), " (device " << i << ")");
    p.visible.emplace_back(pi.uuid.bytes, sizeof(pi.uuid.bytes));
    int can = 0;
    if (i != device_ && cudaDeviceCanAccessPeer(&can, device_, i) != cudaSuccess) can = 0;
    (void)cudaGetLastError();
    p.can_access.push_back(i == device_ ? 1 : static_cast<uint8_t>(can != 0));
  }
  // The device ring's setup (plan_device_ring): MPS (an older driver without the attribute: not
  // MPS), the SMs and how many ring blocks each keeps resident.
  v = 0;
  p.mps = cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, device_) == cudaSuccess && v != 0;
  (void)cudaGetLastError();
  RC_CUDA(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, device_), " (device " << device_ << ")");
  if (is_device_mode(cfg_.mode) && ring_layout_.blocks_per_sm != nullptr)
    p.ring_blocks_per_sm = ring_layout_.blocks_per_sm(device_);
  p.max_blocks = cfg_.max_blocks_set ? cfg_.max_blocks : 0;
  p.ring_lanes = cfg_.ring_lanes;
  p.ring_knobs_set = cfg_.ring_knobs_set;
  if (is_device_mode(cfg_.mode) && world_ > 1) {
    // What the other communicators' grids leave on this GPU, in this rank's domain (MPS clients
    // share one); create() reserves the agreed grid from it.
    const GpuLedgerLook l = GpuLedger(cfg_.ledger_dir, p.uuid).look(p.mps, pin_owner_);
    const int64_t resident = static_cast<int64_t>(p.sms) * p.ring_blocks_per_sm;
    p.ledger_free = static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(resident - l.held, 1 << 30)));
    p.ledger_holders = l.holders;
  }
  return encode_peer_info(p);
}

std::string CudaIpcTransport::create(const std::vector<std::string>& infos) {
  RC_CHECK(!ctl_, Error, "ringcomm: CUDA transport already created");
  RC_CHECK(static_cast<int>(infos.size()) == world_, InvalidArgument,
           "ringcomm: create needs " << world_ << " device infos, got " << infos.size());
  std::vector<CudaPeerInfo> all;
  for (const auto& b : infos) all.push_back(decode_peer_info(b));
  const CudaPeerInfo& me = all[rank_];
  for (int p = 0; p < world_; ++p) {
    const CudaPeerInfo& o = all[p];
    RC_CHECK(o.host == me.host, Unsupported,
             "ringcomm: the CUDA communicator needs every rank on one host; rank " << p << " runs on " << o.host
                                                                                  << ", rank " << rank_ << " on " << me.host);
    RC_CHECK(o.slot_bytes == me.slot_bytes && o.nslots == me.nslots, Mismatch,
             "ringcomm: rank " << p << " uses " << o.nslots << " CUDA slots of " << o.slot_bytes << " bytes, rank "
                               << rank_ << " uses " << me.nslots << " of " << me.slot_bytes
                               << " (set RINGCOMM_CUDA_SLOT_BYTES / RINGCOMM_CUDA_NSLOTS equally on every rank)");
    RC_CHECK(o.mode == me.mode, Mismatch,
             "ringcomm: rank " << p << " has RINGCOMM_CUDA_P2P=" << mode_name(o.mode) << ", rank " << rank_ << " has "
                               << mode_name(me.mode) << " (set it equally on every rank)");
    pids_.push_back(o.pid);
  }
  kinds_ = plan_channels(all, cfg_.mode);
  if (is_device_mode(cfg_.mode) && world_ > 1) {
    // This rank's signal page, then [lane][slot] slots of stride ring_slot_stride: in its inbox,
    // after the channels' slots (exported and opened with them, once, at setup).
    cfg_.ring = plan_device_ring(all, cfg_.mode);
    cfg_.ring_lanes = cfg_.ring.lanes;
    // Reserve the grid in the GPU's ledger. Another communicator may have reserved since
    // local_info(): then this rank reserves nothing, and attach() refuses on every rank (the blob
    // says so).
    ledger_ = std::make_unique<GpuLedger>(cfg_.ledger_dir, me.uuid);
    GpuLedgerLook l;
    ledger_ok_ = ledger_->reserve(pin_owner_, me.mps, cfg_.ring.lanes, rank_, world_,
                                  static_cast<int64_t>(me.sms) * me.ring_blocks_per_sm, &l);
    if (!ledger_ok_) ledger_holders_ = l.holders;
    cfg_.ring_slot_stride = ring_layout_.slot_stride(cfg_.ring.slot_bytes);
    cfg_.ring_bytes =
        ring_layout_.region_bytes(cfg_.ring.slot_bytes, cfg_.ring.nslots, static_cast<size_t>(cfg_.ring.lanes));
  }
  if (cfg_.max_blocks == 0) {  // the reduce grid cap: 4 blocks per SM (RINGCOMM_CUDA_MAX_BLOCKS overrides)
    int sms = 0;
    RC_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), " (device " << device_ << ")");
    cfg_.max_blocks = 4 * std::max(1, sms);
  }
  bool any_staged = false, ipc_in = false;
  for (int a = 0; a < world_; ++a)
    for (int b = 0; b < world_; ++b)
      if (a != b) {
        any_staged |= kind(a, b) != ChannelKind::kIpc;
        ipc_in |= b == rank_ && kind(a, b) == ChannelKind::kIpc;
      }

  // Control plane. Its slots carry the data only for staged channels; otherwise they are one
  // cache line (the meta is all that travels). Every rank computes the same any_staged.
  ShmConfig sc = cfg_.shm;
  sc.slot_bytes = any_staged ? cfg_.slot_bytes : 64;
  sc.nslots = cfg_.nslots;
  ctl_ = std::make_unique<ShmTransport>(rank_, world_, sc);
  ctl_name_ = ctl_->create();

  CudaDeviceGuard g(device_);
  Writer w;
  w.put(kBlobMagic);
  w.put(kWireVersion);
  w.put<int32_t>(rank_);
  w.put<int32_t>(world_);
  w.str(ctl_name_);
  cudaIpcMemHandle_t mh;
  std::memset(&mh, 0, sizeof(mh));
  if (ipc_in && world_ > 1) {
    inbox_bytes_ = channel_bytes() + cfg_.ring_bytes;
    void* p = nullptr;
    RC_CUDA(cudaMalloc(&p, inbox_bytes_), " allocating the " << inbox_bytes_ << "-byte CUDA IPC inbox on device " << device_
                                                              << " (RINGCOMM_CUDA_SLOT_BYTES x RINGCOMM_CUDA_NSLOTS x 2 x world)");
    inbox_ = static_cast<char*>(p);
    RC_CUDA(cudaIpcGetMemHandle(&mh, inbox_), " exporting the CUDA IPC inbox (RINGCOMM_CUDA_P2P=host avoids CUDA IPC memory)");
    if (cfg_.ring_bytes > 0) {
      // The device ring's words start at 0 and only increase: zeroed once, before any peer can
      // map the inbox (its handle leaves this process in the blob returned below). A private
      // stream: the legacy default stream is never used.
      cudaStream_t z = nullptr;
      RC_CUDA(cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking), "");
      cudaError_t e = cudaMemsetAsync(inbox_ + channel_bytes(), 0, cfg_.ring_bytes, z);
      if (e == cudaSuccess) e = cudaStreamSynchronize(z);
      (void)cudaStreamDestroy(z);
      RC_CUDA(e, " zeroing the device ring's region");
    }
  }
  w.put<uint8_t>(inbox_ ? 1 : 0);
  w.bytes(&mh, sizeof(mh));
  w.put<uint8_t>(ledger_ok_ ? 1 : 0);
  w.str(ledger_holders_);
  for (int l = 0; l < kNumLanes; ++l) {
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      Chan& c = chan(static_cast<Lane>(l), peer);
      c.out = kind(rank_, peer);
      c.in = kind(peer, rank_);
      c.out_dev.assign(cfg_.nslots, nullptr);
      c.in_dev.assign(cfg_.nslots, nullptr);
      RC_CUDA(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming), "");
    }
  }
  return w.take();
}

void CudaIpcTransport::attach(const std::vector<std::string>& blobs) {
  RC_CHECK(ctl_ != nullptr, Error, "ringcomm: create() must be called before attach()");
  RC_CHECK(static_cast<int>(blobs.size()) == world_, InvalidArgument,
           "ringcomm: attach needs " << world_ << " handle blobs, got " << blobs.size());
  struct Peer {
    std::string name;
    bool has_inbox = false;
    cudaIpcMemHandle_t mh;
  };
  std::vector<Peer> peers(world_);
  for (int p = 0; p < world_; ++p) {
    Reader r(blobs[p], "handle blob");
    RC_CHECK(r.get<uint32_t>() == kBlobMagic && r.get<uint32_t>() == kWireVersion, Mismatch,
             "ringcomm: rank " << p << "'s CUDA handles come from another ringcomm version");
    const int32_t pr = r.get<int32_t>(), pw = r.get<int32_t>();
    RC_CHECK(pr == p && pw == world_, Mismatch,
             "ringcomm: handle blob " << p << " is rank " << pr << " of " << pw << " (world " << world_ << ")");
    Peer& x = peers[p];
    x.name = r.str();
    x.has_inbox = r.get<uint8_t>() != 0;
    r.bytes(&x.mh, sizeof(x.mh));
    const bool reserved = r.get<uint8_t>() != 0;
    const std::string holders = r.str();
    if (!reserved) {
      // Every rank refuses alike; this rank's own entry goes (nothing of the ring has run).
      if (ledger_) ledger_->release(pin_owner_);
      ledger_.reset();
      RC_THROW(InvalidArgument, "ringcomm: RINGCOMM_CUDA_P2P=" << mode_name(cfg_.mode) << ": rank " << p
                   << " could not reserve the ring's " << cfg_.ring.lanes << " block(s) in its GPU's ledger "
                   << "(RINGCOMM_CUDA_LEDGER_DIR): another communicator initialised at once took them; "
                   << "its holders now: " << holders << "; a spinning grid waiting on one that is not resident "
                   << "never ends: retry, or close one of those communicators");
    }
  }
  std::vector<std::string> names;
  for (auto& x : peers) names.push_back(x.name);
  ctl_->attach(names);

  CudaDeviceGuard g(device_);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    if (kind(rank_, p) == ChannelKind::kIpc) {
      RC_CHECK(peers[p].has_inbox, Mismatch, "ringcomm: rank " << p << " exported no CUDA inbox but the channel plan needs one");
      void* ptr = nullptr;
      RC_CUDA(cudaIpcOpenMemHandle(&ptr, peers[p].mh, cudaIpcMemLazyEnablePeerAccess),
              " opening rank " << p << "'s CUDA IPC inbox on rank " << rank_
                               << " (RINGCOMM_CUDA_P2P=host stages through host memory instead)");
      // Every rank's inbox has this rank's geometry (create() checked the slot knobs agree).
      const size_t peer_bytes = channel_bytes() + cfg_.ring_bytes;
      try {
        pins_->claim(pin_owner_, ptr, peer_bytes, PinKind::kIpcMapped);
      } catch (...) {
        (void)cudaIpcCloseMemHandle(ptr);
        throw;
      }
      peer_inbox_[p] = static_cast<char*>(ptr);
    }
  }
  attached_ = true;
}

size_t CudaIpcTransport::channel_bytes() const {
  return static_cast<size_t>(kNumLanes) * world_ * cfg_.nslots * cfg_.slot_bytes;
}

char* CudaIpcTransport::ring_region(int r) const {
  RC_CHECK(cfg_.ring_bytes > 0 && r >= 0 && r < world_, Error,
           "ringcomm: no device ring region for rank " << r << " (RINGCOMM_CUDA_P2P=device selects it)");
  char* base = r == rank_ ? inbox_ : peer_inbox_[r];
  RC_CHECK(base != nullptr, Error, "ringcomm: rank " << r << "'s CUDA inbox is not mapped on rank " << rank_);
  return base + channel_bytes();
}

std::string CudaIpcTransport::describe_channels() const {
  std::ostringstream o;
  for (int a = 0; a < world_; ++a) {
    for (int b = 0; b < world_; ++b) {
      if (a == b || kinds_.empty()) continue;
      o << a << "->" << b << ":" << channel_kind_name(kind(a, b)) << " ";
    }
  }
  return o.str();
}

// ---------------- data-plane pointers ----------------

// Pin and map one host shared-memory slot (lazily, once per slot per process): the GPU writes
// (sender) or reads (receiver) it through the returned device pointer. The range is claimed in
// the PinRegistry first: pages pinned by anyone else (another transport, a retired one, or code
// outside ringcomm) are refused, never reused.
char* CudaIpcTransport::map_host_slot(char* host) {
  if (pins_->claim(pin_owner_, host, cfg_.slot_bytes, PinKind::kHostRegistered) == PinRegistry::Claim::kFresh) {
    const cudaError_t e = cudaHostRegister(host, cfg_.slot_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      (void)cudaGetLastError();
      pins_->reject_foreign(pin_owner_, host, cfg_.slot_bytes);
    }
    if (e != cudaSuccess) pins_->drop(pin_owner_, host);
    RC_CUDA(e, " pinning a " << cfg_.slot_bytes << "-byte host staging slot");
  }
  void* d = nullptr;
  RC_CUDA(cudaHostGetDevicePointer(&d, host, 0), " mapping a host staging slot");
  return static_cast<char*>(d);
}

char* CudaIpcTransport::finish_send(int peer, Lane lane, const WaitCtx& w, char* host) {
  Chan& c = chan(lane, peer);
  c.out_w = w;
  c.out_w.peer = peer;
  // The receiver released this slot only after its GPU finished reading it (end_slot_work).
  const uint32_t k = static_cast<uint32_t>(c.sent % cfg_.nslots);
  if (c.out == ChannelKind::kIpc) return peer_inbox_[peer] + inbox_offset(lane, rank_, k);
  if (c.out_dev[k] == nullptr) c.out_dev[k] = map_host_slot(host);
  return c.out_dev[k];
}

char* CudaIpcTransport::send_slot(int peer, Lane lane, const WaitCtx& w, cudaStream_t s) {
  char* host = ctl_->send_slot(peer, lane, w);
  CudaDeviceGuard g(device_);
  return finish_send(peer, lane, w, host);
}

namespace {
// The context of a point-to-point slot (the non-blocking slot calls are the p2p engine's).
WaitCtx p2p_ctx(int peer, const char* op) {
  WaitCtx w;
  w.op = op;
  w.peer = peer;
  return w;
}
}  // namespace

char* CudaIpcTransport::try_send_slot(int peer, Lane lane, cudaStream_t s) {
  char* host = ctl_->try_send_slot(peer, lane);
  if (host == nullptr) return nullptr;
  CudaDeviceGuard g(device_);
  return finish_send(peer, lane, p2p_ctx(peer, "send"), host);
}

void CudaIpcTransport::end_slot_work(Chan& c, int peer, bool outgoing, cudaStream_t s) {
  // The GPU's writes must be done before the slot is published, and its reads before the slot is
  // released: the host waits (bounded) for this process's own record. No stream and no host poll
  // ever depends on an event of another process.
  const int src = outgoing ? rank_ : peer, dst = outgoing ? peer : rank_;
  RC_CUDA(cudaEventRecord(c.done, s), " (rank " << src << " -> " << dst << ")");
  WaitCtx w = outgoing ? c.out_w : c.in_w;  // the operation and peer of the slot (finish_send / finish_recv)
  w.what = "a slot hand-off (this rank's GPU work on it)";
  wait_event(c.done, w);
}

void CudaIpcTransport::send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag, cudaStream_t s) {
  Chan& c = chan(lane, peer);
  CudaDeviceGuard g(device_);
  end_slot_work(c, peer, true, s);
  ctl_->send_post(peer, lane, bytes, total, tag);
  ++c.sent;
}

const char* CudaIpcTransport::finish_recv(int peer, Lane lane, const WaitCtx& w, const char* host) {
  Chan& c = chan(lane, peer);
  c.in_w = w;
  c.in_w.peer = peer;
  // The sender published this slot only after its GPU finished writing it (end_slot_work).
  const uint32_t k = static_cast<uint32_t>(c.received % cfg_.nslots);
  if (c.in == ChannelKind::kIpc) return inbox_ + inbox_offset(lane, peer, k);
  if (c.in_dev[k] == nullptr) c.in_dev[k] = map_host_slot(const_cast<char*>(host));
  return c.in_dev[k];
}

const char* CudaIpcTransport::recv_slot(int peer, Lane lane, const WaitCtx& w, cudaStream_t s, const SlotMeta** meta) {
  const char* host = ctl_->recv_slot(peer, lane, w, meta);
  CudaDeviceGuard g(device_);
  return finish_recv(peer, lane, w, host);
}

const char* CudaIpcTransport::try_recv_slot(int peer, Lane lane, cudaStream_t s, const SlotMeta** meta) {
  const char* host = ctl_->try_recv_slot(peer, lane, meta);
  if (host == nullptr) return nullptr;
  CudaDeviceGuard g(device_);
  return finish_recv(peer, lane, p2p_ctx(peer, "recv"), host);
}

void CudaIpcTransport::recv_done(int peer, Lane lane, cudaStream_t s) {
  Chan& c = chan(lane, peer);
  CudaDeviceGuard g(device_);
  end_slot_work(c, peer, false, s);
  ctl_->recv_done(peer, lane);
  ++c.received;
}

// ---------------- bounded host waits on the GPU ----------------

void CudaIpcTransport::wait_event(cudaEvent_t ev, const WaitCtx& w, double timeout_s, bool check_peers) {
  const bool own_timeout = timeout_s < 0;
  const double limit_s = own_timeout ? cfg_.shm.timeout_s : timeout_s;
  const int64_t t0 = now_ns();
  const int64_t deadline = deadline_after(t0, limit_s);
  int64_t next_liveness = t0 + cfg_.shm.liveness_ns;
  int64_t sleep_ns = 2000;
  // Built only for an error message: the wait itself runs at every slot hand-off.
  auto slot_peer = [&w] {
    return w.peer >= 0 ? " (its work on a slot exchanged with rank " + std::to_string(w.peer) + ")" : std::string();
  };
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      RC_CUDA(e, " while " << w.op << " (seq " << w.seq << ") on rank " << rank_ << " waited for the GPU" << slot_peer());
    }
    const int64_t now = now_ns();
    if (now - t0 < cfg_.shm.spin_ns()) {
      cpu_relax();
      continue;
    }
    if (check_peers && ctl_ && !closed_ && now >= next_liveness) {  // after close the segments are unmapped
      next_liveness = now + cfg_.shm.liveness_ns;
      ctl_->check_peers(w, true);
    }
    if (now >= deadline) {
      if (cudaEventQuery(ev) == cudaSuccess) return;
      (void)cudaGetLastError();
      if (!own_timeout) {
        RC_THROW(TimeoutError, "ringcomm: wait() on " << w.op << " (seq " << w.seq << "): Timed out after " << limit_s
                                                      << " s; the operation is still running");
      }
      RC_THROW(TimeoutError, "ringcomm: " << w.op << " (seq " << w.seq << ") on rank " << rank_
                                          << ": the GPU work did not complete within " << limit_s << " s" << slot_peer()
                                          << " (RINGCOMM_TIMEOUT / timeout=)");
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(sleep_ns));
    sleep_ns = std::min<int64_t>(sleep_ns * 2, 1000000);
  }
}

// ---------------- teardown ----------------

bool CudaIpcTransport::peer_process_dead(int peer) const {
  if (peer >= static_cast<int>(pids_.size()) || pids_[peer] <= 0) return false;
  const pid_t pid = pids_[peer];
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* rp = std::strrchr(buf, ')');
  return rp != nullptr && rp[1] != '\0' && rp[2] != '\0' && (rp[2] == 'Z' || rp[2] == 'X');
}

// Every rank, once it has closed what it imported, sends "bye" on each collective channel and
// then waits (bounded: RINGCOMM_CUDA_CLOSE_WAIT seconds) for every peer's bye. Channels are FIFO,
// so a bye arrives after every message of the collectives the peer completed. CUDA requires an
// importer to close a handle before the exporter frees it: a rank frees its inbox only when
// every peer said bye (or exited: its imports died with its context).
void CudaIpcTransport::exchange_byes(bool* all_done) {
  *all_done = false;
  const double wait_s = cfg_.close_wait_s;
  const int64_t deadline = deadline_after(now_ns(), wait_s);
  std::vector<int> to_send, to_recv;
  for (int p = 0; p < world_; ++p)
    if (p != rank_) {
      to_send.push_back(p);
      to_recv.push_back(p);
    }
  bool ok = true;
  int64_t sleep_ns = 1000;
  while ((!to_send.empty() || !to_recv.empty()) && now_ns() < deadline) {
    bool moved = false;
    for (size_t i = 0; i < to_send.size();) {
      const int p = to_send[i];
      if (peer_process_dead(p) || ctl_->try_send_slot(p, Lane::kColl) != nullptr) {
        if (!peer_process_dead(p)) ctl_->send_post(p, Lane::kColl, 0, 0, kByeTag);
        to_send.erase(to_send.begin() + static_cast<long>(i));
        moved = true;
      } else {
        ++i;
      }
    }
    for (size_t i = 0; i < to_recv.size();) {
      const int p = to_recv[i];
      const SlotMeta* m = nullptr;
      if (ctl_->try_recv_slot(p, Lane::kColl, &m) != nullptr) {
        if (m->tag != kByeTag) ok = false;  // an unconsumed message: that rank was mid-collective
        ctl_->recv_done(p, Lane::kColl);
        to_recv.erase(to_recv.begin() + static_cast<long>(i));
        moved = true;
      } else if (peer_process_dead(p)) {
        to_recv.erase(to_recv.begin() + static_cast<long>(i));
        moved = true;
      } else {
        ++i;
      }
    }
    if (moved) continue;
    std::this_thread::sleep_for(std::chrono::nanoseconds(sleep_ns));
    sleep_ns = std::min<int64_t>(sleep_ns * 2, 2000000);
  }
  *all_done = ok && to_recv.empty();
}

void CudaIpcTransport::close(bool drained) {
  if (closed_) return;
  closed_ = true;
  // Closed for the peers now, not after the goodbyes: a peer waiting on this rank (a header, a
  // slot) raises PeerFailure at once and closes in turn, which sends the bye that the wait below
  // needs; otherwise both would wait, this rank for its bye and the peer for this rank.
  if (ctl_) ctl_->mark_closed();
  // Device resources are released only when no GPU work of ours can still touch them (drained)
  // and, for exported ones, when every importer has let go (byes). Otherwise they are left
  // allocated on purpose: freeing memory a stuck stream or a peer may still access is undefined
  // behaviour, a leak until process exit is not. cudaFree also synchronises the device.
  const bool safe = drained && attached_;
  bool keep_mappings = false;
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  (void)cudaSetDevice(device_);
  // The events are this process's own and never exported: destroying one with a record still
  // pending releases it once the record completes.
  for (auto& c : chans_) {
    if (c->done) (void)cudaEventDestroy(c->done);
    c->done = nullptr;
  }
  if (safe) {
    // What this process pinned or opened is used by this process's GPU only, and that is
    // drained: it goes whatever the peers do (their own registrations pin the pages they use).
    for (const PinRange& r : pins_->settle(pin_owner_, true)) {
      void* p = reinterpret_cast<void*>(r.begin);
      if (r.kind == PinKind::kHostRegistered) (void)cudaHostUnregister(p);
      else (void)cudaIpcCloseMemHandle(p);
    }
    for (int p = 0; p < world_; ++p) peer_inbox_[p] = nullptr;
    bool byes = false;
    try {
      if (world_ > 1) exchange_byes(&byes);
      else byes = true;
    } catch (...) {
      byes = false;
    }
    if (byes) {
      if (inbox_ != nullptr) (void)cudaFree(inbox_);
      inbox_ = nullptr;
    }
  } else {
    // Copies may still run: the registrations and opened inboxes are retired (recorded until
    // exit, never handed out again) and the control segments stay mapped, so that no later mmap
    // (a later communicator's segment) can land on pages CUDA still has registered.
    const size_t n = pins_->retire(pin_owner_);
    keep_mappings = n > 0;
    if (n > 0) {
      RC_LOG(kWarn, rank_, world_,
             "CUDA close did not drain the GPU work: " << n << " pinned / IPC-mapped ranges and the control "
             "segments stay until exit (" << pins_->retired_bytes() << " B retired in this process)");
    }
  }
  (void)cudaGetLastError();
  if (prev >= 0 && prev != device_) (void)cudaSetDevice(prev);
  if (ctl_) ctl_->close(keep_mappings);
  // The ledger's entry goes when no grid of this rank can still be resident: drained, or never
  // attached (no launch). Otherwise it stays until this process exits (dead holders are dropped).
  if (ledger_ && (safe || !attached_)) {
    try {
      ledger_->release(pin_owner_);
    } catch (const std::exception& e) {
      RC_LOG(kWarn, rank_, world_, "the GPU ledger's entry was not released: " << e.what());
    }
    ledger_.reset();
  }
}

void CudaIpcTransport::abort(uint32_t kind, const std::string& msg) {
  if (ctl_) ctl_->abort(kind, msg);
}

}  // namespace rc
