// CUDA IPC transport, the pure part: knobs, the peer-info wire format and the channel planner
// (every rank computes every channel's kind alike from the exchanged infos; see cuda_ipc.h).
#include <algorithm>
#include <sstream>

#include "common/knobs.h"
#include "common/errors.h"
#include "transport/cuda_ipc.h"
#include "transport/cuda_ipc_wire.h"

namespace rc {

namespace cuda_ipc_wire {

namespace {

// RINGCOMM_CUDA_P2P's names, indexed by the mode number. A forced mode m >= 1 makes every
// channel ChannelKind(m - 1) where that kind is possible, so kind k shares mode k+1's name.
// The device modes ("device", "device-flags", "device-spin") force kIpc channels and select the
// fused device ring (comm/cuda_ring.h), with the signalling of the detected setup or a forced one.
constexpr const char* kModeNames[] = {"auto", "ipc", "host", "hostsync", "device", "device-flags", "device-spin"};
constexpr int kNumModes = static_cast<int>(sizeof(kModeNames) / sizeof(kModeNames[0]));
static_assert(static_cast<int>(ChannelKind::kHostSync) + 1 == kModeDevice - 1 && kModeDeviceSpin == kNumModes - 1 &&
                  kModeDeviceFlags == kModeDevice + 1 && kModeDeviceSpin == kModeDevice + 2,
              "every ChannelKind k is named by mode k+1; the device modes are the last ones");

}  // namespace

const char* mode_name(int m) { return m >= 0 && m < kNumModes ? kModeNames[m] : "?"; }

}  // namespace cuda_ipc_wire

namespace {

using namespace cuda_ipc_wire;

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

int parse_mode(const std::string& m) {
  for (int i = 0; i < kNumModes; ++i) {
    if (m == kModeNames[i]) return i;
  }
  RC_THROW(InvalidArgument, "ringcomm: RINGCOMM_CUDA_P2P='" << m
                                << "' (expected auto, ipc, host, hostsync, device, device-flags or device-spin)");
}

bool can_reach(const CudaPeerInfo& a, const CudaPeerInfo& b) {
  if (a.uuid == b.uuid) return true;  // one GPU, two processes: IPC within a device
  for (size_t i = 0; i < a.visible.size(); ++i) {
    if (a.visible[i] == b.uuid) return i < a.can_access.size() && a.can_access[i] != 0;
  }
  return false;  // b's GPU is not visible to a: nothing proves peer access
}

}  // namespace

const char* channel_kind_name(ChannelKind k) {
  const int m = static_cast<int>(k) + 1;
  return m >= 1 && m < kNumModes ? kModeNames[m] : "?";
}

CudaIpcConfig CudaIpcConfig::from_knobs(const Knobs& k, int world, double timeout_s, const CudaRingLayout& ring) {
  CudaIpcConfig c;
  c.shm = ShmConfig::from_knobs(k, world, timeout_s);
  const int64_t slot = k.cuda_slot_bytes;
  const int64_t nslots = k.cuda_nslots;
  RC_CHECK(slot >= static_cast<int64_t>(kPageBytes), InvalidArgument,
           "RINGCOMM_CUDA_SLOT_BYTES must be >= " << kPageBytes << ", got " << slot);
  RC_CHECK(nslots >= 2 && nslots <= 64, InvalidArgument,
           "RINGCOMM_CUDA_NSLOTS must be in [2, 64] (the ring's fused forward needs two), got " << nslots);
  // Whole pages: host-staged slots are pinned one by one with cudaHostRegister, which must not
  // see two slots share a page.
  c.slot_bytes = (static_cast<size_t>(slot) + kPageBytes - 1) / kPageBytes * kPageBytes;
  c.nslots = static_cast<uint32_t>(nslots);
  c.mode = parse_mode(k.cuda_p2p);
  c.max_blocks = static_cast<int>(k.cuda_max_blocks);
  RC_CHECK(c.max_blocks >= 0, InvalidArgument, "RINGCOMM_CUDA_MAX_BLOCKS must be >= 0");
  c.max_blocks_set = c.max_blocks > 0;
  c.close_wait_s = k.cuda_close_wait;
  c.ring_lanes = static_cast<int>(k.cuda_ring_lanes);
  RC_CHECK(c.ring_lanes >= 1 && c.ring_lanes <= ring.max_lanes, InvalidArgument,
           "RINGCOMM_CUDA_RING_LANES must be in [1, " << ring.max_lanes << "], got " << c.ring_lanes);
  c.ring_knobs_set = (k.is_set(KnobId::cuda_ring_lanes) ? 1u : 0u) | (k.is_set(KnobId::cuda_nslots) ? 2u : 0u) |
                     (k.is_set(KnobId::cuda_slot_bytes) ? 4u : 0u);
  c.watchdog_us = k.cuda_watchdog_us;
  c.ledger_dir = k.cuda_ledger_dir;
  RC_CHECK(c.watchdog_us >= 10, InvalidArgument, "RINGCOMM_CUDA_WATCHDOG_US must be >= 10, got " << c.watchdog_us);
  // Device modes: the ring's geometry and region (ring, ring_bytes) are decided at create(), from
  // every rank's device info (plan_device_ring).
  return c;
}

std::string encode_peer_info(const CudaPeerInfo& p) {
  Writer w;
  w.put(kInfoMagic);
  w.put(kWireVersion);
  w.put(p.pid);
  w.put(p.device);
  w.str(p.host);
  w.str(p.uuid);
  w.put<uint8_t>(p.ipc_events ? 1 : 0);
  w.put(p.mode);
  w.put(p.slot_bytes);
  w.put(p.nslots);
  w.put<uint32_t>(static_cast<uint32_t>(p.visible.size()));
  for (size_t i = 0; i < p.visible.size(); ++i) {
    w.str(p.visible[i]);
    w.put<uint8_t>(i < p.can_access.size() ? p.can_access[i] : 0);
  }
  w.put<uint8_t>(p.mps ? 1 : 0);
  w.put(p.sms);
  w.put(p.ring_blocks_per_sm);
  w.put(p.max_blocks);
  w.put(p.ring_lanes);
  w.put(p.ring_knobs_set);
  w.put(p.ledger_free);
  w.str(p.ledger_holders);
  return w.take();
}

CudaPeerInfo decode_peer_info(const std::string& bytes) {
  Reader r(bytes, "device info");
  RC_CHECK(r.get<uint32_t>() == kInfoMagic, Mismatch, "ringcomm: CUDA device info has a bad magic number");
  RC_CHECK(r.get<uint32_t>() == kWireVersion, Mismatch, "ringcomm: CUDA device info from another ringcomm version");
  CudaPeerInfo p;
  p.pid = r.get<int32_t>();
  p.device = r.get<int32_t>();
  p.host = r.str();
  p.uuid = r.str();
  p.ipc_events = r.get<uint8_t>() != 0;
  p.mode = r.get<int32_t>();
  p.slot_bytes = r.get<uint64_t>();
  p.nslots = r.get<uint32_t>();
  uint32_t n = r.get<uint32_t>();
  RC_CHECK(n <= 4096, Mismatch, "ringcomm: CUDA device info lists " << n << " devices");
  for (uint32_t i = 0; i < n; ++i) {
    p.visible.push_back(r.str());
    p.can_access.push_back(r.get<uint8_t>());
  }
  p.mps = r.get<uint8_t>() != 0;
  p.sms = r.get<int32_t>();
  p.ring_blocks_per_sm = r.get<int32_t>();
  p.max_blocks = r.get<int32_t>();
  p.ring_lanes = r.get<int32_t>();
  p.ring_knobs_set = r.get<uint32_t>();
  p.ledger_free = r.get<int32_t>();
  p.ledger_holders = r.str();
  return p;
}

std::vector<ChannelKind> plan_channels(const std::vector<CudaPeerInfo>& infos, int mode) {
  const int n = static_cast<int>(infos.size());
  std::vector<ChannelKind> k(static_cast<size_t>(n) * n, ChannelKind::kIpc);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      ChannelKind& c = k[static_cast<size_t>(a) * n + b];
      if (a == b) continue;
      const CudaPeerInfo &pa = infos[a], &pb = infos[b];
      if (is_device_mode(mode)) {
        // The device ring's flags live in the peers' inboxes: every channel is kIpc (no IPC event
        // is used on it).
        RC_CHECK(can_reach(pa, pb) && can_reach(pb, pa), InvalidArgument,
                 "ringcomm: RINGCOMM_CUDA_P2P=" << mode_name(mode) << " but rank " << a << " (GPU "
                                                << hex(pa.uuid).substr(0, 8) << ") and rank "
                     << b << " (GPU " << hex(pb.uuid).substr(0, 8) << ") cannot access each other's memory; use auto or host");
        c = ChannelKind::kIpc;
      } else if (mode == 3 || !pa.ipc_events || !pb.ipc_events) {
        c = ChannelKind::kHostSync;
      } else if (mode == 2) {
        c = ChannelKind::kHost;
      } else if (can_reach(pa, pb) && can_reach(pb, pa)) {
        c = ChannelKind::kIpc;
      } else if (mode == 1) {
        RC_THROW(InvalidArgument, "ringcomm: RINGCOMM_CUDA_P2P=ipc but rank " << a << " (GPU " << hex(pa.uuid).substr(0, 8)
                                  << ") and rank " << b << " (GPU " << hex(pb.uuid).substr(0, 8)
                                  << ") cannot access each other's memory; use auto or host");
      } else {
        c = ChannelKind::kHost;
      }
    }
  }
  return k;
}

const char* ring_setup_name(RingSetup s) {
  switch (s) {
    case RingSetup::kSeparate: return "separate GPUs";
    case RingSetup::kMps: return "one GPU shared under MPS";
    case RingSetup::kTimeSliced: return "one GPU shared without MPS";
    default: return "none";
  }
}

RingPlan plan_device_ring(const std::vector<CudaPeerInfo>& infos, int mode) {
  RC_CHECK(is_device_mode(mode) && !infos.empty(), Error, "ringcomm: plan_device_ring needs a device mode");
  const int n = static_cast<int>(infos.size());
  const CudaPeerInfo& r0 = infos.front();
  for (int r = 1; r < n; ++r) {
    RC_CHECK(infos[r].ring_lanes == r0.ring_lanes && infos[r].ring_knobs_set == r0.ring_knobs_set, Mismatch,
             "ringcomm: rank " << r << " and rank 0 set RINGCOMM_CUDA_RING_LANES / RINGCOMM_CUDA_NSLOTS / "
                                  "RINGCOMM_CUDA_SLOT_BYTES differently (set them alike on every rank)");
  }
  // The GPUs (by uuid, in order of first appearance) and the ranks on each. A GPU's grids run at
  // once when it is one rank's alone or every rank there is an MPS client; otherwise its
  // contexts take turns (one grid at a time).
  struct Gpu {
    std::string uuid;
    std::vector<int> ranks;
    bool mps = true;
    int64_t resident = -1;  // ring blocks resident at once: SMs x blocks per SM
    int sms = 0, per_sm = 0;
    int64_t free = -1;    // of those, what the GPU's ledger leaves to this communicator
    int ledger_rank = -1;  // the rank whose ledger left the least (-1: no other holder)
    bool concurrent() const { return ranks.size() == 1 || mps; }
    int64_t share() const { return concurrent() ? static_cast<int64_t>(ranks.size()) : 1; }
  };
  std::vector<Gpu> gpus;
  std::vector<size_t> gpu_of(n);
  for (int r = 0; r < n; ++r) {
    const CudaPeerInfo& x = infos[r];
    size_t g = 0;
    while (g < gpus.size() && gpus[g].uuid != x.uuid) ++g;
    if (g == gpus.size()) {
      gpus.emplace_back();
      gpus.back().uuid = x.uuid;
    }
    Gpu& G = gpus[g];
    G.ranks.push_back(r);
    G.mps = G.mps && x.mps;
    const int64_t res = static_cast<int64_t>(x.sms) * x.ring_blocks_per_sm;
    if (G.resident < 0 || res < G.resident) {
      G.resident = res;
      G.sms = x.sms;
      G.per_sm = x.ring_blocks_per_sm;
    }
    gpu_of[r] = g;
  }
  auto describe = [](const Gpu& G) {
    std::ostringstream o;
    if (G.concurrent()) o << G.ranks.size() << " grid(s) at once";
    else o << "one grid at a time (time-sliced)";
    o << " on GPU " << hex(G.uuid).substr(0, 8) << ", " << G.resident << " resident blocks (" << G.sms << " SMs x "
      << G.per_sm << ")";
    return o.str();
  };

  RingPlan p;
  p.setup = RingSetup::kSeparate;
  for (const Gpu& G : gpus) {
    if (G.ranks.size() > 1)
      p.setup = G.mps && p.setup != RingSetup::kTimeSliced ? RingSetup::kMps : RingSetup::kTimeSliced;
  }
  p.spin = mode == kModeDeviceSpin || (mode == kModeDevice && p.setup == RingSetup::kTimeSliced);
  // Few, large slots where every hand-off between the ranks of a GPU waits for a context switch;
  // a knob the user set wins.
  p.lanes = (r0.ring_knobs_set & 1u) || !p.spin ? r0.ring_lanes : 1;
  p.nslots = (r0.ring_knobs_set & 2u) || !p.spin ? r0.nslots : 2;
  p.slot_bytes = (r0.ring_knobs_set & 4u) || !p.spin ? r0.slot_bytes : (size_t{8} << 20);
  const int asked = p.lanes;

  // What each GPU's ledger leaves to this communicator (the other communicators' grids there):
  // the least any of its ranks there saw; without a ledger, every resident block.
  for (int r = 0; r < n; ++r) {
    Gpu& G = gpus[gpu_of[r]];
    if (G.free < 0) G.free = G.resident;
    if (infos[r].ledger_free >= 0 && infos[r].ledger_free < G.free) {
      G.free = infos[r].ledger_free;
      G.ledger_rank = r;
    }
  }
  auto ledger_text = [&](const Gpu& G) {
    std::ostringstream o;
    if (G.ledger_rank >= 0)
      o << "; its ledger (RINGCOMM_CUDA_LEDGER_DIR) leaves " << G.free << " of them: other communicators hold the rest: "
        << infos[G.ledger_rank].ledger_holders;
    return o.str();
  };

  // Each rank's SM budget: its RINGCOMM_CUDA_MAX_BLOCKS, else its share of what its GPU's ledger
  // leaves. Every rank runs the smallest (the lanes of a ring are equal on every rank).
  int tight = 0;
  int64_t budget = -1;
  for (int r = 0; r < n; ++r) {
    const Gpu& G = gpus[gpu_of[r]];
    RC_CHECK(G.resident > 0, InvalidArgument,
             "ringcomm: RINGCOMM_CUDA_P2P=" << mode_name(mode) << ": the ring kernel cannot be resident on the GPU of "
                                            << "rank " << r << " (" << G.sms << " SMs x " << G.per_sm
                                            << " blocks per SM)");
    const int64_t b = infos[r].max_blocks > 0 ? infos[r].max_blocks : G.free / G.share();
    if (budget < 0 || b < budget) {
      budget = b;
      tight = r;
    }
  }
  const Gpu& T = gpus[gpu_of[tight]];
  const bool by_ledger = infos[tight].max_blocks <= 0 && T.ledger_rank >= 0;
  p.budget = static_cast<int>(std::min<int64_t>(budget, 1 << 30));
  p.lanes = std::min(p.lanes, p.budget);
  RC_CHECK(p.lanes >= 1, InvalidArgument,
           "ringcomm: RINGCOMM_CUDA_P2P=" << mode_name(mode) << ": no ring block fits the SM budget of rank " << tight
               << " (" << describe(T) << ledger_text(T) << "); a spinning grid waiting on one that is not resident "
               << "never ends: " << (by_ledger ? "close one of those communicators, " : "")
               << "use fewer ranks per GPU, MPS, or RINGCOMM_CUDA_P2P=auto");
  for (const Gpu& G : gpus) {
    RC_CHECK(G.share() * p.lanes <= G.free, InvalidArgument,
             "ringcomm: RINGCOMM_CUDA_P2P=" << mode_name(mode) << ": " << G.share() << " ring grid(s) of " << p.lanes
                 << " blocks cannot all be resident (" << describe(G) << ledger_text(G) << "; RINGCOMM_CUDA_MAX_BLOCKS "
                 << p.budget << "); a spinning grid waiting on one that is not resident never ends: lower "
                 << "RINGCOMM_CUDA_MAX_BLOCKS or RINGCOMM_CUDA_RING_LANES"
                 << (G.ledger_rank >= 0 ? ", or close one of those communicators" : ""));
  }

  std::ostringstream why;
  why << "device ring: " << ring_setup_name(p.setup) << " (";
  for (size_t g = 0; g < gpus.size(); ++g) {
    const Gpu& G = gpus[g];
    why << (g ? "; " : "") << "GPU " << hex(G.uuid).substr(0, 8) << ": " << G.ranks.size() << " rank(s)"
        << (G.ranks.size() > 1 ? (G.mps ? ", MPS" : ", no MPS") : "");
  }
  why << "); " << (p.spin ? "in-kernel spins with few, large slots" : "in-kernel flags")
      << (mode == kModeDevice ? "" : " (forced by RINGCOMM_CUDA_P2P)") << "; grid " << p.lanes
      << " block(s) per rank (lanes asked " << asked << ", SM budget " << p.budget << " of rank " << tight << ": "
      << (infos[tight].max_blocks > 0 ? std::string("RINGCOMM_CUDA_MAX_BLOCKS") : describe(T) + ledger_text(T))
      << "); slots " << p.nslots << " x " << p.slot_bytes << " B per lane";
  p.why = why.str();
  return p;
}

}  // namespace rc
