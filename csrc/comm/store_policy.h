// Per-communicator choice of how a rank writes into its peers' slots: cached stores (memcpy) or
// streaming stores (kernels/copy_cpu.h). Neither wins everywhere and the right one can change
// while a job runs (a VM's vCPUs moved between L3 domains by the host), so it is measured:
//  - per class (the kind of collective and log2 of its bytes), an EWMA of nanoseconds per byte
//    for each way, fed by the time of every collective of at least RINGCOMM_STREAM_MIN_BYTES;
//  - the first collective of a class runs cached and is not measured (it warms caches and page
//    tables up), the second runs cached, the third streaming; after that the faster way runs,
//    and every RINGCOMM_STREAM_PROBE_EVERY-th collective of the class runs the other way to
//    notice a change (a probe costs at most that collective's difference). The EWMA weighs the
//    newest sample 1/2, so one probe that finds the other way faster switches to it.
// Every rank sees the same sequence of (collective, size) (the header exchange checks it), so
// ranks probe in the same collectives and measure the same combined effect; the choice itself is
// local to the writer and never has to agree across ranks (either way moves the same bytes).
// RINGCOMM_STREAM = auto (the above) | on (always streaming; copies under 4 KiB stay cached, see
// copy_to_peer) | off. Used only by the thread that runs collectives.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace rc {

class StorePolicy {
 public:
  StorePolicy();  // reads the knobs

  struct Choice {
    bool stream = false;
    int cls = -1;  // class measured (kind x size), -1: not measured
  };
  /// The way to use for a collective of kind `kind` (0..kKinds-1; the communicator passes its
  /// Coll code) moving `bytes` (its full buffer size).
  Choice choose(uint64_t bytes, int kind = 0);
  /// Report how long the collective chosen by `c` took.
  void record(const Choice& c, uint64_t bytes, int64_t ns);
  /// "auto (measured from 524288 B, probe every 16)", "on" or "off", for the log.
  std::string describe() const;

 private:
  enum Mode { kAuto, kOn, kOff };
  struct Class {
    uint64_t calls = 0;
    double ns_per_byte[2] = {0, 0};  // [cached, streaming]; 0: not measured yet
  };
  Mode mode_ = kAuto;
  uint64_t min_bytes_ = 0;
  uint64_t probe_every_ = 16;
  static constexpr int kKinds = 16;
  std::array<Class, 64 * kKinds> classes_{};
};

}  // namespace rc
