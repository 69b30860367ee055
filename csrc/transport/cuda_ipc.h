// CUDA IPC transport: processes on one host, each driving one GPU (several processes may share a
// GPU), exchange bytes through fixed-size receive slots, with flow control.
//
// Two planes.
//  - Control plane: a host shared-memory ShmTransport (transport/shm.h) carries in its slots, per
//    channel and per slot, the slot's meta (bytes, total, tag) and the head/tail counters, and
//    its own control plane (ShmControl, transport/shm_control.h: what ctl() returns) gives this
//    transport its bounded waits (spin, futex, deadline, peer liveness, abort flags) and the
//    header board. Host-side, a channel behaves exactly like a shm channel: send_slot() waits for
//    a free slot, send_post() publishes it, recv_slot() waits for a filled one, recv_done()
//    releases it. Before publishing or releasing a slot the host waits (bounded) for its own
//    GPU's work on that slot (below); it never waits on a peer's GPU.
//  - Data plane: the slot's bytes live in one of two places, per channel (src -> dst), chosen
//    at setup identically by every rank from the device information all ranks exchanged:
//      kIpc      the receiver's device memory (one cudaMalloc "inbox" exported with
//                cudaIpcGetMemHandle, opened by the sender with cudaIpcOpenMemHandle). Used when
//                both processes drive the same GPU, or GPUs that can access each other (P2P).
//      kHost     the receiver's host shared-memory slot (the ShmTransport slot itself), pinned and
//                mapped with cudaHostRegister in both processes: staged through host memory where
//                peer access is impossible.
//      kHostSync the same placement as kHost, planned for devices without IPC event support
//                (ordering uses no IPC event on any channel, so both behave alike).
//    Ordering is host-synchronous on every channel, with events of this process only:
//      sender   send_slot:  host waits for the slot to be free (tail): the receiver released it
//                           only after its GPU finished reading it, so the slot may be written;
//               send_post:  records its own event after the writes enqueued on the stream, polls
//                           it (bounded) until the GPU is done, then publishes the slot (head,
//                           release).
//      receiver recv_slot:  host waits for the slot (head, acquire): its bytes are complete;
//               recv_done:  records its own event after the reads, polls it until the GPU is
//                           done, then releases the slot (tail, release).
//    Each poll (wait_event) spins, then sleeps, and checks this communicator's timeout, the
//    peers' liveness and abort flags: a dead peer raises PeerFailure naming the operation, the
//    rank and the peer.
//    Why no IPC event: a host poll (or a stream wait) on a peer's imported event binds this
//    process to work the peer enqueued, and is not guaranteed to complete while the peer waits
//    on the host (docs/cuda.md); polling one's own event submits one's own work.
//    Deadlock freedom: a stream's work depends on nothing outside its own process, so every
//    recorded event completes in bounded GPU time; every host wait is the shm ring's, whose
//    deadlock freedom is argued in algo/ring.cpp. A dead peer can never leave a stream of ours
//    blocked (a later cudaStreamSynchronize / torch.cuda.synchronize returns).
//    Memory: host staging slots are pinned with cudaHostRegister and peer inboxes opened with
//    cudaIpcOpenMemHandle only after a claim in the process's PinRegistry
//    (transport/pin_registry.h). close(drained) unregisters / closes them; a close that could not
//    drain retires them: they stay registered, opened and mapped (the control segments too) until
//    exit, and no later communicator can be handed their addresses.

// Slot size and count: RINGCOMM_CUDA_SLOT_BYTES (default 2 MiB, a multiple of 4096) and
// RINGCOMM_CUDA_NSLOTS (default 4, >= 2). Device memory per rank: 2 lanes x world x nslots x
// slot_bytes when any channel into it is kIpc. RINGCOMM_CUDA_P2P = auto | ipc | host | hostsync
// forces a channel kind (host / hostsync exercise the staged paths on a single GPU); device
// (and device-flags / device-spin) forces kIpc and appends the device ring's region (signal page
// and slots, comm/cuda_ring.h) to
// every inbox, so that it is exported, opened and zeroed once, with the inbox.
//
// Setup (three steps, the Python side moves the bytes through the rendezvous store):
//   info = local_info()            this rank's device, visible devices, P2P and IPC capabilities
//   blob = create(all infos)       decides every channel's kind; allocates the inbox and the
//                                  channels' own events,
//                                  creates the control segment; returns the handles
//   attach(all blobs)              maps the control segments, opens peers' inboxes
// Teardown (close): see cuda_ipc.cpp — importers close peers' inboxes before the
// exporter frees them (CUDA requires it), with a bounded "bye" exchange on the control plane.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/knobs.h"
#include "transport/gpu_ledger.h"
#include "transport/pin_registry.h"
#include "transport/shm.h"
#include "transport/shm_config.h"
#include "transport/shm_control.h"
#include "transport/shm_types.h"

namespace rc {

enum class ChannelKind : uint8_t { kIpc = 0, kHost = 1, kHostSync = 2 };
const char* channel_kind_name(ChannelKind k);

/// The device ring's region in each rank's inbox, as the device ring (csrc/device/) lays it out:
/// the transport allocates, exports and zeroes it, and never reads it.
struct CudaRingLayout {
  int max_lanes = 0;                                           // lanes the ring's signal page holds
  size_t (*slot_stride)(size_t slot_bytes) = nullptr;          // one slot, its header included
  size_t (*region_bytes)(size_t slot_bytes, size_t nslots, size_t lanes) = nullptr;  // page + slots
  /// Blocks of the ring kernel (any instantiation) one SM of `device` keeps resident at once.
  int (*blocks_per_sm)(int device) = nullptr;
};

/// Where the device ring's grids run (RINGCOMM_CUDA_P2P=device*), detected at create() from every
/// rank's device info, identically on every rank.
enum class RingSetup : uint8_t {
  kNone = 0,        // not a device mode
  kSeparate = 1,    // every rank on a GPU of its own (P2P between them): grids run at once
  kMps = 2,         // a GPU shared by several ranks under MPS: their grids run at once
  kTimeSliced = 3,  // a GPU shared by several ranks without MPS: their contexts take turns
};
const char* ring_setup_name(RingSetup s);

/// The device ring's geometry and grid, decided at create() (plan_device_ring).
struct RingPlan {
  RingSetup setup = RingSetup::kNone;
  bool spin = false;      // the time-sliced signalling's defaults: few, large slots
  int lanes = 0;          // the ring kernel's grid (blocks) on every rank
  uint32_t nslots = 0;    // slots per lane
  size_t slot_bytes = 0;  // payload bytes per slot
  int budget = 0;         // the smallest rank's SM budget (blocks)
  std::string why;        // the setup and its reasons, for the log and describe
};

struct CudaIpcConfig {
  size_t slot_bytes = 0;     // RINGCOMM_CUDA_SLOT_BYTES
  uint32_t nslots = 0;       // RINGCOMM_CUDA_NSLOTS
  int mode = 0;              // RINGCOMM_CUDA_P2P: 0 auto, 1 ipc, 2 host, 3 hostsync, >= 4 device*
  int max_blocks = 0;        // RINGCOMM_CUDA_MAX_BLOCKS: reduce grid cap (0: 4 x SMs)
  bool max_blocks_set = false;  // ... set by the user (then also the ring kernel's SM budget)
  double close_wait_s = 30;  // RINGCOMM_CUDA_CLOSE_WAIT: bound on close()'s GPU drain and goodbyes
  int ring_lanes = 0;        // RINGCOMM_CUDA_RING_LANES; after create(): the ring's grid (ring.lanes)
  uint32_t ring_knobs_set = 0;  // bits: 1 RINGCOMM_CUDA_RING_LANES, 2 _NSLOTS, 4 _SLOT_BYTES set
  int64_t watchdog_us = 0;   // RINGCOMM_CUDA_WATCHDOG_US
  std::string ledger_dir;    // RINGCOMM_CUDA_LEDGER_DIR (transport/gpu_ledger.h)
  // Device modes, after create(): the ring's plan and its region (ring_bytes 0: no device ring).
  RingPlan ring;
  size_t ring_bytes = 0;
  size_t ring_slot_stride = 0;
  ShmConfig shm;             // timeout, spin, liveness (from the shm knobs)
  /// From the knobs `k` (their range checks throw InvalidArgument). `ring` lays out the
  /// device ring's region in mode device (the layer above owns that layout).
  static CudaIpcConfig from_knobs(const Knobs& k, int world, double timeout_s, const CudaRingLayout& ring);
};

/// Device placement for one process: a pure description, decoded from the exchanged bytes.
struct CudaPeerInfo {
  int32_t pid = 0;
  int32_t device = 0;                 // ordinal in that process
  std::string host;                   // hostname
  std::string uuid;                   // 16 bytes
  bool ipc_events = false;            // cudaDevAttrIpcEventSupport
  int32_t mode = 0;                   // its RINGCOMM_CUDA_P2P
  uint64_t slot_bytes = 0;
  uint32_t nslots = 0;
  std::vector<std::string> visible;   // uuids of the devices it sees
  std::vector<uint8_t> can_access;    // can_access[i]: its device can access visible[i] (P2P)
  bool mps = false;                   // cudaDevAttrMpsEnabled: its contexts are MPS clients
  int32_t sms = 0;                    // cudaDevAttrMultiProcessorCount
  int32_t ring_blocks_per_sm = 0;     // device modes: resident ring-kernel blocks per SM
  int32_t max_blocks = 0;             // its RINGCOMM_CUDA_MAX_BLOCKS when set, else 0
  int32_t ring_lanes = 0;             // its RINGCOMM_CUDA_RING_LANES
  uint32_t ring_knobs_set = 0;        // CudaIpcConfig::ring_knobs_set
  int32_t ledger_free = -1;           // device modes: ring blocks its GPU's ledger leaves in its
                                      // domain (transport/gpu_ledger.h); -1: no ledger
  std::string ledger_holders;         // the entries holding the rest, for messages
};

/// Channel kinds for every ordered pair, computed identically on every rank (pure; unit-tested
/// through the bindings without a GPU). kinds[src * world + dst].
std::vector<ChannelKind> plan_channels(const std::vector<CudaPeerInfo>& infos, int mode);
/// The device ring's setup, geometry and grid for a device `mode`, computed identically on every
/// rank (pure). Ranks on one GPU (same uuid) share it; its grids run at once when it is theirs
/// alone or under MPS. Each rank's SM budget is its RINGCOMM_CUDA_MAX_BLOCKS, else its GPU's
/// resident ring blocks (sms x ring_blocks_per_sm) divided by the ranks whose grids run there at
/// once, and at most what its GPU's ledger leaves (ledger_free, other communicators' grids on that
/// GPU) divided alike; the grid is the smallest budget capped at the lanes asked for. Throws
/// InvalidArgument when the grids could not all be resident (a spinning grid waiting on a grid
/// that is not resident never ends; naming the ledger's holders when they are why), Mismatch
/// when the ranks' ring knobs differ.
RingPlan plan_device_ring(const std::vector<CudaPeerInfo>& infos, int mode);

std::string encode_peer_info(const CudaPeerInfo& p);
CudaPeerInfo decode_peer_info(const std::string& bytes);

class CudaIpcTransport {
 public:
  CudaIpcTransport(int rank, int world, int device, double timeout_s, const Knobs& knobs,
                   const CudaRingLayout& ring);
  ~CudaIpcTransport();
  CudaIpcTransport(const CudaIpcTransport&) = delete;
  CudaIpcTransport& operator=(const CudaIpcTransport&) = delete;

  std::string local_info() const;
  std::string create(const std::vector<std::string>& infos);
  void attach(const std::vector<std::string>& blobs);
  /// Release everything that is safe to release (see cuda_ipc.cpp); `drained`: no GPU work of
  /// this transport may still be running (else device resources are deliberately leaked).
  void close(bool drained);
  void abort(uint32_t kind, const std::string& msg);

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  const CudaIpcConfig& config() const { return cfg_; }
  /// The host control plane (the channels' host slots are this transport's own).
  ShmControl& ctl() {
    RC_CHECK(ctl_ != nullptr, Error, "ringcomm: the CUDA transport is not created yet (create() first)");
    return *ctl_;
  }
  bool created() const { return ctl_ != nullptr; }
  ChannelKind kind(int src, int dst) const { return kinds_[static_cast<size_t>(src) * world_ + dst]; }
  /// Human-readable channel table (for logs and tests).
  std::string describe_channels() const;

  // ---- channels. Host waits are bounded (ShmTransport); GPU ordering is enqueued on `s`. ----
  /// Wait for a free slot to `peer`; returns a device-usable pointer to its slot_bytes bytes.
  char* send_slot(int peer, Lane lane, const WaitCtx& w, cudaStream_t s);
  /// Non-blocking variant: nullptr when no slot is free.
  char* try_send_slot(int peer, Lane lane, cudaStream_t s);
  /// Publish the slot obtained by (try_)send_slot after the writes enqueued on `s`.
  void send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag, cudaStream_t s);
  /// Wait for the next filled slot from `peer`; returns its device-usable data pointer and meta.
  const char* recv_slot(int peer, Lane lane, const WaitCtx& w, cudaStream_t s, const SlotMeta** meta);
  const char* try_recv_slot(int peer, Lane lane, cudaStream_t s, const SlotMeta** meta);
  /// Release the slot after the reads enqueued on `s`.
  void recv_done(int peer, Lane lane, cudaStream_t s);

  /// Poll a local event until it completes, checking peers (unless !check_peers: work that
  /// depends on no peer, such as close()'s drain); bounded by timeout_s (< 0: the transport's
  /// timeout). Throws TimeoutError / PeerFailure / Error (a CUDA failure) with `w`'s context.
  void wait_event(cudaEvent_t ev, const WaitCtx& w, double timeout_s = -1.0, bool check_peers = true);
  /// Mode device: rank `r`'s device-ring region (device/ring_proto.h's ring_region_bytes), zeroed
  /// at create(): this rank's own, or the one in r's inbox opened at attach(). Throws when `r`'s
  /// inbox is not mapped here.
  char* ring_region(int r) const;
  /// This transport's owner id in the PinRegistry (tests, logs).
  uint64_t pin_owner() const { return pin_owner_; }

 private:
  struct Chan;  // per (lane, peer) state, in cuda_ipc.cpp
  Chan& chan(Lane lane, int peer);
  char* finish_send(int peer, Lane lane, const WaitCtx& w, char* host_ptr);
  const char* finish_recv(int peer, Lane lane, const WaitCtx& w, const char* host_ptr);
  /// The end of this rank's GPU work (enqueued on s) on its current slot with `peer`: the writes
  /// before send_post (outgoing) or the reads before recv_done. Records the channel's own event
  /// on s and waits on the host until the work is done; errors name the operation that took the
  /// slot (finish_send / finish_recv) and the peer.
  void end_slot_work(Chan& c, int peer, bool outgoing, cudaStream_t s);
  char* map_host_slot(char* host_ptr);
  size_t inbox_offset(Lane lane, int src, uint32_t slot) const;
  size_t channel_bytes() const;  // the channels' part of an inbox (the ring region follows)
  bool peer_process_dead(int peer) const;
  void exchange_byes(bool* all_done);

  int rank_;
  int world_;
  int device_;
  CudaRingLayout ring_layout_;
  CudaIpcConfig cfg_;
  std::vector<ChannelKind> kinds_;
  std::unique_ptr<ShmTransport> ctl_;
  std::string ctl_name_;
  char* inbox_ = nullptr;                 // this rank's device inbox (nullptr: no kIpc channel in)
  size_t inbox_bytes_ = 0;
  std::vector<char*> peer_inbox_;         // opened peers' inboxes (kIpc channels out)
  std::vector<std::unique_ptr<Chan>> chans_;  // [lane * world + peer]
  PinRegistry* pins_;                     // the process's registry: what this transport pinned / opened
  uint64_t pin_owner_;                    // this transport's owner id there
  std::vector<int32_t> pids_;             // every rank's pid (from the infos)
  bool attached_ = false;
  bool closed_ = false;
  // Device modes: this rank's entry in its GPU's ledger, from create() to close() (an undrained
  // close keeps it until the process exits: its grids may still be resident).
  std::unique_ptr<GpuLedger> ledger_;
  bool ledger_ok_ = true;      // create()'s reservation succeeded (or there was none)
  std::string ledger_holders_;  // else: the holders that left too little
};

}  // namespace rc
