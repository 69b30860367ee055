// Two threads: A (on cpu_a) drives, B (on cpu_b) answers.
//
// Round trips: A stores ping = i (release); B, seeing it (acquire), stores pong = i; A waits for
// pong == i. A times blocks of kTrips trips.
//
// Hand-offs: slot s = i % 2. A copies the source into slot s and stores ready[s] = i + 1; B, seeing
// it, copies the slot out and stores done[s] = i + 1. A reuses slot s for hand-off i only after
// done[s] == i - 1 (B has read it), so no slot is written while it is read. A times blocks of
// hand-offs from its first copy to B's last done.
//
// `stop` ends B's loops; every wait ends at its deadline with `stop` set, so neither thread waits
// on one that has left.
#include "transport/cpu_pair_probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "kernels/copy_cpu.h"
#include "transport/futex.h"

namespace rc {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTrips = 1000;            // round trips per timed block
constexpr size_t kMinBlocks = 5;           // of each figure, whatever the time
constexpr auto kStall = std::chrono::seconds(5);

struct Shared {
  alignas(64) std::atomic<uint64_t> ping{0};
  alignas(64) std::atomic<uint64_t> pong{0};
  alignas(64) std::atomic<uint64_t> ready[2] = {0, 0};
  alignas(64) std::atomic<uint64_t> done[2] = {0, 0};
  alignas(64) std::atomic<bool> stop{false};
  std::atomic<int> pin_error{0};  // the error number of a failed pin (first wins)
  std::atomic<bool> timed_out{false};
};

// Pin the calling thread to `cpu`; on failure record why (pthread_setaffinity_np returns its
// error number, it does not set errno) and stop the other thread. False when it failed.
bool pin_self(Shared& s, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (err == 0) return true;
  int expected = 0;
  s.pin_error.compare_exchange_strong(expected, err);
  s.stop.store(true);
  return false;
}

// Spin until `word` holds `want` (acquire). False when `stop` is set or the wait outlives kStall
// (then it sets `stop` and `timed_out` so the other thread leaves too).
bool await(Shared& s, const std::atomic<uint64_t>& word, uint64_t want) {
  const auto deadline = Clock::now() + kStall;
  for (uint32_t n = 1;; ++n) {
    if (word.load(std::memory_order_acquire) == want) return true;
    cpu_relax();
    if ((n & 1023) == 0) {
      if (s.stop.load(std::memory_order_relaxed)) return false;
      if (Clock::now() > deadline) {
        s.timed_out.store(true);
        s.stop.store(true);
        return false;
      }
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Buffers {
  std::vector<char> src, dst, slots[2];
  explicit Buffers(size_t n) : src(n, 1), dst(n, 0) {
    for (auto& sl : slots) sl.assign(n, 0);
  }
};

void answer(Shared& s, Buffers& b, int cpu) {
  if (!pin_self(s, cpu)) return;
  for (uint64_t i = 1;; ++i) {                 // round trips until A moves on (stop or ping == 0)
    const auto deadline = Clock::now() + kStall;
    uint64_t seen;
    for (uint32_t n = 1;; ++n) {
      seen = s.ping.load(std::memory_order_acquire);
      if (seen == i || seen == UINT64_MAX) break;
      cpu_relax();
      if ((n & 1023) == 0 && (s.stop.load() || Clock::now() > deadline)) {
        if (!s.stop.load()) s.timed_out.store(true);
        s.stop.store(true);
        return;
      }
    }
    if (seen == UINT64_MAX) break;
    s.pong.store(i, std::memory_order_release);
  }
  const size_t n = b.src.size();
  for (uint64_t i = 0;; ++i) {
    const int sl = static_cast<int>(i & 1);
    if (!await(s, s.ready[sl], i + 1)) return;
    std::memcpy(b.dst.data(), b.slots[sl].data(), n);
    s.done[sl].store(i + 1, std::memory_order_release);
  }
}

}  // namespace

CpuPairProbe probe_cpu_pair(int cpu_a, int cpu_b, size_t handoff_bytes, double seconds) {
  RC_CHECK(cpu_a >= 0 && cpu_b >= 0 && cpu_a != cpu_b, InvalidArgument,
           "probe_cpu_pair: needs two different CPUs, got " << cpu_a << " and " << cpu_b);
  RC_CHECK(handoff_bytes > 0, InvalidArgument, "probe_cpu_pair: handoff_bytes must be > 0");
  RC_CHECK(seconds > 0, InvalidArgument, "probe_cpu_pair: seconds must be > 0, got " << seconds);
  Shared s;
  Buffers b(handoff_bytes);
  CpuPairProbe out{0, 0};
  std::vector<double> trips, rates;
  auto drive = [&] {
    if (!pin_self(s, cpu_a)) return;
    const auto start = Clock::now();
    const auto trips_until = start + std::chrono::duration<double>(seconds * 0.3);
    uint64_t i = 0;
    while (trips.size() < kMinBlocks || Clock::now() < trips_until) {
      const auto t0 = Clock::now();
      for (int k = 0; k < kTrips; ++k) {
        s.ping.store(++i, std::memory_order_release);
        if (!await(s, s.pong, i)) return;
      }
      trips.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kTrips);
    }
    s.ping.store(UINT64_MAX, std::memory_order_release);
    const auto until = Clock::now() + std::chrono::duration<double>(seconds * 0.7);
    // Each block hands over about 4 MiB (at least 8 hand-offs), so a block outlasts the timer's grain.
    const uint64_t per_block = std::max<uint64_t>(8, (4u << 20) / handoff_bytes);
    uint64_t h = 0;
    while (rates.size() < kMinBlocks || Clock::now() < until) {
      const auto t0 = Clock::now();
      for (uint64_t k = 0; k < per_block; ++k, ++h) {
        const int sl = static_cast<int>(h & 1);
        if (h >= 2 && !await(s, s.done[sl], h - 1)) return;
        copy_to_peer(b.slots[sl].data(), b.src.data(), handoff_bytes, false);
        s.ready[sl].store(h + 1, std::memory_order_release);
      }
      if (!await(s, s.done[(h - 1) & 1], h)) return;
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      rates.push_back(static_cast<double>(per_block * handoff_bytes) / dt);
    }
    s.stop.store(true);
  };
  {
    std::thread a(drive), bt(answer, std::ref(s), std::ref(b), cpu_b);
    a.join();
    bt.join();
  }
  const int err = s.pin_error.load();
  RC_CHECK(err == 0, InvalidArgument,
           "probe_cpu_pair: cannot pin a thread to CPU " << cpu_a << " or " << cpu_b << ": " << std::strerror(err)
                                                         << " (a CPU outside this process's mask, or offline?)");
  if (s.timed_out.load() || trips.empty() || rates.empty())
    throw TimeoutError("probe_cpu_pair: a thread on CPU " + std::to_string(cpu_a) + " or " + std::to_string(cpu_b) +
                       " stopped answering for 5 s (its CPU taken by other work?)");
  out.round_trip_ns = median(trips);
  out.handoff_Bps = median(rates);
  return out;
}

}  // namespace rc
