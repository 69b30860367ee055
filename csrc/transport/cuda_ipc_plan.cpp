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
// kModeDevice ("device") forces kIpc channels and selects the fused device ring (comm/cuda_ring.h).
constexpr const char* kModeNames[] = {"auto", "ipc", "host", "hostsync", "device"};
constexpr int kNumModes = static_cast<int>(sizeof(kModeNames) / sizeof(kModeNames[0]));
static_assert(static_cast<int>(ChannelKind::kHostSync) + 1 == kModeDevice - 1 && kModeDevice == kNumModes - 1,
              "every ChannelKind k is named by mode k+1; device is the last mode");

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
  RC_THROW(InvalidArgument, "ringcomm: RINGCOMM_CUDA_P2P='" << m << "' (expected auto, ipc, host, hostsync or device)");
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
  c.close_wait_s = k.cuda_close_wait;
  c.ring_lanes = static_cast<int>(k.cuda_ring_lanes);
  RC_CHECK(c.ring_lanes >= 1 && c.ring_lanes <= ring.max_lanes, InvalidArgument,
           "RINGCOMM_CUDA_RING_LANES must be in [1, " << ring.max_lanes << "], got " << c.ring_lanes);
  c.watchdog_us = k.cuda_watchdog_us;
  RC_CHECK(c.watchdog_us >= 10, InvalidArgument, "RINGCOMM_CUDA_WATCHDOG_US must be >= 10, got " << c.watchdog_us);
  if (c.mode == kModeDevice) {
    // This rank's signal page, then [lane][slot] slots of stride slot_stride: in its inbox, after
    // the channels' slots (exported and opened with them, once, at setup).
    c.ring_slot_stride = ring.slot_stride(c.slot_bytes);
    c.ring_bytes = ring.region_bytes(c.slot_bytes, c.nslots, static_cast<size_t>(c.ring_lanes));
  }
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
      if (mode == kModeDevice) {
        // The device ring's flags live in the peers' inboxes: every channel is kIpc (no IPC event
        // is used on it).
        RC_CHECK(can_reach(pa, pb) && can_reach(pb, pa), InvalidArgument,
                 "ringcomm: RINGCOMM_CUDA_P2P=device but rank " << a << " (GPU " << hex(pa.uuid).substr(0, 8) << ") and rank "
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

}  // namespace rc
