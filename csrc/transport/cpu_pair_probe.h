// What one hand-off between two CPUs costs on this machine now, whatever library runs there: two
// threads, pinned one to each CPU, bounce a cache line and then hand a buffer through two slots.
// Benchmarks print it beside their timings, since on a virtual machine the host may move the
// vCPUs nearer or farther apart while the guest sees the same two CPUs.
#pragma once
#include <cstddef>

namespace rc {

struct CpuPairProbe {
  double round_trip_ns;  ///< median over blocks of one flag's trip there and back
  double handoff_Bps;    ///< median over blocks: bytes handed over (copied in, copied out) per second
};

/// Measures for about `seconds` (at least a few blocks of each figure). Throws InvalidArgument
/// when cpu_a == cpu_b, `handoff_bytes` is 0 or a thread cannot be pinned to its CPU (not in the
/// process's mask, or offline), and TimeoutError when a thread stops answering for 5 s (its CPU
/// taken by other work).
CpuPairProbe probe_cpu_pair(int cpu_a, int cpu_b, size_t handoff_bytes, double seconds);

}  // namespace rc
