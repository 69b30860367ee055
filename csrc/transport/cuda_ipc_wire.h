// The bytes CUDA IPC setup exchanges between ranks (peer infos, handle blobs): constants and a
// tiny binary writer / reader (host byte order: every rank runs on the same host). Private to
// transport/cuda_ipc*.cpp.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "common/errors.h"

namespace rc {
namespace cuda_ipc_wire {


inline constexpr uint32_t kInfoMagic = 0x52434449;  // "RCDI"
inline constexpr uint32_t kBlobMagic = 0x52434842;  // "RCHB"
inline constexpr uint32_t kWireVersion = 4;
inline constexpr uint64_t kByeTag = ~0ull;          // the control-plane message a closing rank sends
inline constexpr size_t kPageBytes = 4096;
/// RINGCOMM_CUDA_P2P=device's mode number (kModeNames in cuda_ipc_plan.cpp), and its two forced
/// signallings, device-flags and device-spin: every mode from kModeDevice on is a device mode.
inline constexpr int kModeDevice = 4;
inline constexpr int kModeDeviceFlags = 5;
inline constexpr int kModeDeviceSpin = 6;
inline constexpr bool is_device_mode(int m) { return m >= kModeDevice; }

// ---- a tiny binary writer / reader for the exchanged bytes (little-endian host order: every
// rank runs on the same host) ----
class Writer {
 public:
  template <class T> void put(const T& v) { s_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void bytes(const void* p, size_t n) { s_.append(static_cast<const char*>(p), n); }
  void str(const std::string& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    s_.append(v);
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  Reader(const std::string& s, const char* what) : s_(s), what_(what) {}
  template <class T> T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void bytes(void* p, size_t n) {
    need(n);
    std::memcpy(p, s_.data() + pos_, n);
    pos_ += n;
  }
  std::string str() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  void need(size_t n) {
    RC_CHECK(pos_ + n <= s_.size(), Mismatch,
             "ringcomm: malformed CUDA " << what_ << " (" << s_.size() << " bytes; a rank runs another ringcomm version?)");
  }
  const std::string& s_;
  const char* what_;
  size_t pos_ = 0;
};

inline std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

/// RINGCOMM_CUDA_P2P's name for a mode number.
const char* mode_name(int m);

}  // namespace cuda_ipc_wire
}  // namespace rc
