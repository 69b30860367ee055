// Cross-process hand-off round trips between two processes on one GPU: the probe that chooses the
// device-driven design (docs/cuda.md). One way per run, so a way that stalls costs only its own
// budget (benchmarks/device/handoff_probe.sh runs each way in a process of its own, the kernel way
// first, under `timeout`, without and with MPS):
//
//   kernel      a kernel in each process writes a payload into the peer's box in IPC device memory,
//               fences at system scope, then release-stores the box's 64-bit flag; the peer's kernel
//               acquire-loads its own flag in a spin bounded by %globaltimer, then checks the payload
//               (needs both kernels resident at once: MPS, or distinct GPUs; without MPS the contexts
//               are time-sliced and a round trip takes a context switch);
//   memop-dev   cuStreamWriteValue32 / cuStreamWaitValue32 on words in IPC device memory;
//   memop-host  the same on words in host memory shared by both processes (mmap, registered with
//               cudaHostRegister in each);
//   event       IPC events: the producer records, tells the consumer on the host, the consumer's
//               stream waits the event and records its own, and back (host-ordered, as events
//               must be: a wait takes the record made before it was called).
//
// Shared words only increase and are never reset: each side keeps the value it expects next
// (rounds completed so far plus the round), so a fast side never erases what a time-sliced peer has
// yet to read. Nothing waits without a deadline: device spins read %globaltimer and give up; a
// stream is only queried (never synchronized) against a deadline; at the deadline the host releases
// what the stream waits on (kernel flags and stream-operation words set past every expected value,
// its own IPC event recorded again on an idle stream) and queries once more for a grace period; every host
// wait is bounded; alarm() ends a process that is stuck anyway. After a timeout the way stops (its
// words are spent) and reports the round trips it completed. Repetitions stop once the way's
// budget is spent. Never changes the GPU's compute mode.
//
//     nvcc -O2 -std=c++17 -arch=sm_90 -o /tmp/handoff_probe benchmarks/device/handoff_probe.cu
//     /tmp/handoff_probe WAY [STREAM [ROUNDS [REPS [TIMEOUT_MS [BUDGET_MS]]]]]
//         WAY: kernel | memop-dev | memop-host | event;  STREAM: nonblocking (default) | legacy
//         defaults: 1000 rounds (256 at most for the memop ways), 5 repetitions, 1000 ms, 4000 ms
// Prints a human-readable line, then one `RESULT key=value ...` line. Exit status: 0 every
// repetition completed; 1 a repetition timed out (the line says after how many round trips);
// 2 bad arguments; 3 a CUDA error; 4 the two processes lost each other; 5 the child had to be killed.
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda/atomic>
#include <new>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::printf("[%s] %s:%d %s -> %s\n", g_who, __FILE__, __LINE__, #x, cudaGetErrorName(e_));    \
      die(3);                                                                                        \
    }                                                                                                \
  } while (0)

static const char* g_who = "parent";
constexpr int kMemopRounds = 256;   // a stream's queue is finite: at most this many round trips per repetition
constexpr uint32_t kReleased = 0x7fffffffu;  // past every value a wait expects
constexpr int kPayload = 7;          // 64-bit payload words carried with each flag
static std::atomic<int>* g_dead = nullptr;  // Shared::dead, once mapped

// Tell the other side this one is gone (its barriers then end at once), and exit.
[[noreturn]] static void die(int code) {
  std::fflush(stdout);
  if (g_dead != nullptr) g_dead->store(1, std::memory_order_release);
  std::_Exit(code);
}

// The driver's stream memory operations, through the runtime's entry-point query (no link
// against libcuda, which only the machine with the driver has).
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
static WaitValue32 p_wait_value32 = nullptr;
static WriteValue32 p_write_value32 = nullptr;

static void load_driver_entries() {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&p_wait_value32), 12000,
                                      cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) { std::printf("[%s] no cuStreamWaitValue32\n", g_who); die(3); }
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&p_write_value32), 12000,
                                      cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) { std::printf("[%s] no cuStreamWriteValue32\n", g_who); die(3); }
}

// A side's inbox in IPC device memory (kernel way): the payload, then the flag that publishes it.
struct alignas(64) Box {
  uint64_t data[kPayload];
  uint64_t flag;
};

// What a kernel reports, in host-mapped memory: the host reads `done` while the kernel runs.
struct KernelReport {
  volatile uint64_t done;        // round trips completed in this launch
  volatile uint64_t elapsed_ns;  // when the kernel ended (0 while it runs)
  volatile uint64_t bad;         // payload words that did not match their flag
  volatile uint64_t gave_up;     // 1: the spin hit its deadline
};

// Shared between the two processes (an anonymous MAP_SHARED page set up before fork). Every
// counter only increases.
struct Shared {
  std::atomic<int> barrier;             // both sides add one per barrier
  std::atomic<int> dead;                // a side exited on an error (die)
  std::atomic<int> stop;                // 1: run no further repetition (set before a barrier)
  std::atomic<int> failed_rep;          // the repetition (1-based) that timed out on some side, 0: none
  std::atomic<uint64_t> rounds_seen[2]; // round trips side s completed in its last repetition
  std::atomic<int> drained[2];          // side s's stream drained after the release (1) or not (0)
  cudaIpcMemHandle_t mem;               // the parent's device words
  cudaIpcEventHandle_t ev[2];           // [0] the parent's event, [1] the child's
  std::atomic<uint32_t> posted[2];      // event way: rounds recorded by side s, over all repetitions
  // memop-host: [0] the parent's inbox, [1] the child's, [2] go. A page of their own: that page
  // alone is registered with cudaHostRegister in each process.
  alignas(4096) volatile uint32_t host_word[1024];
};

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Both sides reach barrier number k (1, 2, ...). The two sides' barrier counts must never fall
// out of step, so a barrier that times out, or finds the other side dead, ends this process.
static void barrier(Shared* sh, int k, double timeout_s) {
  sh->barrier.fetch_add(1, std::memory_order_acq_rel);
  const double end = now_s() + timeout_s;
  while (sh->barrier.load(std::memory_order_acquire) < 2 * k) {
    if (sh->dead.load(std::memory_order_acquire) != 0) {
      std::printf("[%s] barrier %d: the other side exited on an error\n", g_who, k);
      die(4);
    }
    if (now_s() > end) {
      std::printf("[%s] barrier %d timed out after %.0f s\n", g_who, k, timeout_s);
      die(4);
    }
    std::this_thread::yield();
  }
}

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t payload(uint64_t v, int k) { return v * 0x9e3779b97f4a7c15ull + k; }

// Data, then a system-scope fence, then the flag (release): a peer that acquires the flag sees the data.
__device__ __forceinline__ void send(Box* to, uint64_t v) {
  for (int k = 0; k < kPayload; ++k) reinterpret_cast<volatile uint64_t*>(to->data)[k] = payload(v, k);
  __threadfence_system();
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(to->flag).store(v, cuda::memory_order_release);
}

// One thread: `rounds` round trips. Round i carries value base + i; the first side sends, then
// waits for its own box; the second waits, then answers. Never resets a flag.
__global__ void pingpong(Box* mine, Box* theirs, uint64_t base, int rounds, int first, uint64_t timeout_ns,
                         KernelReport* rep) {
  const uint64_t t0 = globaltimer();
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> flag(mine->flag);
  uint64_t bad = 0;
  for (int i = 1; i <= rounds; ++i) {
    const uint64_t v = base + static_cast<uint64_t>(i);
    if (first) send(theirs, v);
    while (flag.load(cuda::memory_order_acquire) < v) {
      if (globaltimer() - t0 > timeout_ns) {
        rep->bad = bad;
        rep->gave_up = 1;
        __threadfence_system();
        rep->elapsed_ns = globaltimer() - t0;
        return;
      }
    }
    for (int k = 0; k < kPayload; ++k)
      if (reinterpret_cast<volatile uint64_t*>(mine->data)[k] != payload(v, k)) ++bad;
    if (!first) send(theirs, v);
    rep->done = static_cast<uint64_t>(i);
  }
  rep->bad = bad;
  rep->gave_up = 0;
  __threadfence_system();
  rep->elapsed_ns = globaltimer() - t0;
}

struct Ctx {
  int side;              // 0 parent, 1 child
  Shared* sh;
  const char* way;
  cudaStream_t s;
  int rounds, reps;
  double timeout_s, budget_s;
  Box* boxes;            // kernel way: [0] the parent's inbox, [1] the child's (IPC device memory)
  uint32_t* dev_words;   // memop-dev: [0] the parent's inbox, [1] the child's (same allocation, after the boxes)
  uint32_t* host_dev;    // device pointer of sh->host_word
  KernelReport* report;  // host-mapped
  cudaEvent_t own = nullptr, peer = nullptr;
  int bar = 0;           // barriers passed
  uint64_t base = 0;     // round trips completed in earlier repetitions (the words' next base)
  int refused = 0;       // the CUresult a stream memory operation was refused with (0: none)
  uint64_t bad = 0;      // kernel way: payload mismatches
  bool enqueue_blocked = false;  // memop way: enqueuing outlived the deadline (the queue was full)
};

static void sync_bar(Ctx& c) { barrier(c.sh, ++c.bar, c.timeout_s + 10); }
static void setup_bar(Ctx& c) { barrier(c.sh, ++c.bar, 60); }  // cold CUDA starts, MPS

// Query a stream until it is done or `deadline` passes; never synchronizes.
static bool query_until(cudaStream_t s, double deadline) {
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) CK(q);
    if (now_s() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Release what this side's stream may wait on: the kernels' flags and the stream-operation words
// past every expected value, and this side's IPC event recorded again on an idle stream (a record
// that completes at once). The way's words are spent afterwards: it runs no further repetition.
static void release(Ctx& c) {
  for (int w = 0; w < 3; ++w) c.sh->host_word[w] = kReleased;
  cudaStream_t idle;
  CK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
  if (c.dev_words != nullptr) {
    static const uint32_t big[2] = {kReleased, kReleased};
    static const uint64_t big_flag = ~0ull;
    CK(cudaMemcpyAsync(c.dev_words, big, sizeof big, cudaMemcpyHostToDevice, idle));
    for (int b = 0; b < 2; ++b)
      CK(cudaMemcpyAsync(&c.boxes[b].flag, &big_flag, sizeof big_flag, cudaMemcpyHostToDevice, idle));
  }
  if (c.own != nullptr) CK(cudaEventRecord(c.own, idle));
  (void)query_until(idle, now_s() + 1.0);  // a bounded wait; the stream is left as it is
}

// A repetition that timed out on this side: record what it saw, release, and see whether the
// stream drains within a grace period. Never synchronizes.
static void give_up(Ctx& c, int rep, uint64_t seen) {
  int zero = 0;
  c.sh->failed_rep.compare_exchange_strong(zero, rep, std::memory_order_acq_rel);
  c.sh->rounds_seen[c.side].store(seen, std::memory_order_release);
  c.sh->stop.store(1, std::memory_order_release);
  release(c);
  c.sh->drained[c.side].store(query_until(c.s, now_s() + 1.0) ? 1 : 0, std::memory_order_release);
}

// The values of the memop-dev words, read on an idle stream under a deadline (UINT64_MAX: unknown).
static uint64_t read_dev_word(Ctx& c, int w) {
  uint32_t v = 0;
  cudaStream_t idle;
  CK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
  CK(cudaMemcpyAsync(&v, c.dev_words + w, sizeof v, cudaMemcpyDeviceToHost, idle));
  return query_until(idle, now_s() + 1.0) ? v : UINT64_MAX;
}

// One repetition; returns the mean round trip in µs, or a negative number when it timed out.
static double run_kernel(Ctx& c, int rep) {
  const int me = c.side, peer = 1 - c.side;
  c.report->done = 0;
  c.report->elapsed_ns = 0;
  c.report->gave_up = 0;
  sync_bar(c);
  pingpong<<<1, 1, 0, c.s>>>(c.boxes + me, c.boxes + peer, c.base, c.rounds, me == 0,
                             static_cast<uint64_t>(c.timeout_s * 1e9), c.report);
  CK(cudaGetLastError());
  const bool ended = query_until(c.s, now_s() + c.timeout_s + 1.0);
  c.bad += c.report->bad;
  if (ended && c.report->gave_up == 0 && c.report->done == static_cast<uint64_t>(c.rounds))
    return c.report->elapsed_ns / 1e3 / c.rounds;
  give_up(c, rep, c.report->done);
  return -1;
}

static double run_memop(Ctx& c, int rep) {
  const int me = c.side, peer = 1 - c.side;
  const bool host = std::strcmp(c.way, "memop-host") == 0;
  uint32_t* words = host ? c.host_dev : c.dev_words;
  const CUstream cs = reinterpret_cast<CUstream>(c.s);
  // Every op is enqueued behind a wait on the go word (>= rep), so the clock covers the hand-offs
  // only. A driver that refuses stream memory operations refuses them on both sides alike: each
  // side stops enqueuing, both still meet at the barrier, and the go word releases what was
  // queued. A full queue blocks the enqueuing call; a watchdog opens the go word if enqueuing
  // outlives the deadline.
  std::atomic<bool> enqueued{false};
  std::thread watchdog([&] {
    const double end = now_s() + c.timeout_s;
    while (!enqueued.load(std::memory_order_acquire)) {
      if (now_s() > end) {
        c.enqueue_blocked = true;
        c.sh->host_word[2] = kReleased;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  CUresult bad = p_wait_value32(cs, reinterpret_cast<CUdeviceptr>(c.host_dev + 2), static_cast<cuuint32_t>(rep),
                                CU_STREAM_WAIT_VALUE_GEQ);
  for (int i = 1; i <= c.rounds && bad == CUDA_SUCCESS; ++i) {
    const cuuint32_t v = static_cast<cuuint32_t>(c.base + i);
    const CUdeviceptr mine = reinterpret_cast<CUdeviceptr>(words + me);
    const CUdeviceptr theirs = reinterpret_cast<CUdeviceptr>(words + peer);
    if (me == 0) bad = p_write_value32(cs, theirs, v, 0);
    if (bad == CUDA_SUCCESS) bad = p_wait_value32(cs, mine, v, CU_STREAM_WAIT_VALUE_GEQ);
    if (me != 0 && bad == CUDA_SUCCESS) bad = p_write_value32(cs, theirs, v, 0);
  }
  enqueued.store(true, std::memory_order_release);
  watchdog.join();
  if (bad != CUDA_SUCCESS) {
    (void)cudaGetLastError();
    c.refused = static_cast<int>(bad);
    c.sh->stop.store(1, std::memory_order_release);
  }
  sync_bar(c);
  const double t0 = now_s();
  if (me == 0) c.sh->host_word[2] = static_cast<uint32_t>(rep);
  const bool ok = query_until(c.s, t0 + c.timeout_s);
  const double t1 = now_s();
  if (bad != CUDA_SUCCESS) {
    (void)query_until(c.s, now_s() + 1.0);
    return -1;
  }
  if (ok && !c.enqueue_blocked) return (t1 - t0) * 1e6 / c.rounds;
  // My inbox holds the rounds the peer completed towards me: read it before the release overwrites it.
  const uint64_t inbox = host ? c.sh->host_word[me] : read_dev_word(c, me);
  give_up(c, rep, inbox == UINT64_MAX || inbox < c.base ? UINT64_MAX : inbox - c.base);
  return -1;
}

static double run_event(Ctx& c, int rep) {
  const int me = c.side;
  sync_bar(c);
  const double t0 = now_s();
  auto stopped = [&] { return c.sh->stop.load(std::memory_order_acquire) != 0; };
  uint64_t done = 0;
  bool ok = true;
  for (int i = 1; i <= c.rounds && ok; ++i) {
    const uint32_t v = static_cast<uint32_t>(c.base + i);
    const double end = now_s() + c.timeout_s;
    if (me == 0) {
      CK(cudaEventRecord(c.own, c.s));
      c.sh->posted[0].store(v, std::memory_order_release);
      while (c.sh->posted[1].load(std::memory_order_acquire) < v)
        if (now_s() > end || stopped()) { ok = false; break; }
      if (!ok) break;
      CK(cudaStreamWaitEvent(c.s, c.peer, 0));
      ok = query_until(c.s, end);  // the round trip, as completed on the GPU
    } else {
      while (c.sh->posted[0].load(std::memory_order_acquire) < v)
        if (now_s() > end || stopped()) { ok = false; break; }
      if (!ok) break;
      CK(cudaStreamWaitEvent(c.s, c.peer, 0));
      CK(cudaEventRecord(c.own, c.s));
      c.sh->posted[1].store(v, std::memory_order_release);
    }
    if (ok) done = static_cast<uint64_t>(i);
  }
  if (ok) ok = query_until(c.s, now_s() + c.timeout_s);
  const double t1 = now_s();
  if (ok) return (t1 - t0) * 1e6 / c.rounds;
  give_up(c, rep, done);
  return -1;
}

static int side_main(int side, Shared* sh, const char* way, bool legacy, int rounds, int reps, double timeout_s,
                     double budget_s) {
  g_who = side == 0 ? "parent" : "child";
  g_dead = &sh->dead;
  alarm(static_cast<unsigned>(90 + budget_s + reps * (timeout_s + 4)));  // the last resort
  CK(cudaSetDevice(0));
  load_driver_entries();
  Ctx c{side, sh, way, nullptr, rounds, reps, timeout_s, budget_s, nullptr, nullptr, nullptr, nullptr};
  constexpr size_t kBytes = 4096;  // two Boxes, then the two memop-dev words
  void* mem = nullptr;
  if (side == 0) {
    CK(cudaMalloc(&mem, kBytes));
    CK(cudaMemset(mem, 0, kBytes));
    CK(cudaDeviceSynchronize());  // nothing of the peer's is queued yet
    CK(cudaIpcGetMemHandle(&sh->mem, mem));
  }
  setup_bar(c);
  if (side == 1) CK(cudaIpcOpenMemHandle(&mem, sh->mem, cudaIpcMemLazyEnablePeerAccess));
  c.boxes = static_cast<Box*>(mem);
  c.dev_words = reinterpret_cast<uint32_t*>(c.boxes + 2);
  CK(cudaHostRegister(const_cast<uint32_t*>(sh->host_word), sizeof sh->host_word,
                      cudaHostRegisterMapped | cudaHostRegisterPortable));
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c.host_dev), const_cast<uint32_t*>(sh->host_word), 0));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&c.report), sizeof(KernelReport), cudaHostAllocMapped));
  std::memset(c.report, 0, sizeof(KernelReport));
  CK(cudaEventCreateWithFlags(&c.own, cudaEventDisableTiming | cudaEventInterprocess));
  CK(cudaIpcGetEventHandle(&sh->ev[side], c.own));
  setup_bar(c);
  CK(cudaIpcOpenEventHandle(&c.peer, sh->ev[1 - side]));
  cudaStream_t nonblocking;
  CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  c.s = legacy ? cudaStreamLegacy : nonblocking;
  // Load the kernel's module now (lazy loading would load it inside the first timed repetition).
  pingpong<<<1, 1, 0, nonblocking>>>(c.boxes + side, c.boxes + 1 - side, 0, 0, 1, 0, c.report);
  CK(cudaGetLastError());
  if (!query_until(nonblocking, now_s() + 30)) { std::printf("[%s] the warm-up launch did not end\n", g_who); die(3); }
  const bool memop = std::strncmp(way, "memop", 5) == 0;
  if (memop) c.rounds = std::min(c.rounds, kMemopRounds);
  if (side == 0) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int driver = 0;
    CK(cudaDriverGetVersion(&driver));
    std::printf("device %s; driver %d; way %s on the %s stream; %d rounds x %d repetitions; deadline %.2f s; "
                "budget %.1f s\n", p.name, driver, way, legacy ? "legacy default" : "non-blocking", c.rounds, reps,
                timeout_s, budget_s);
  }
  std::vector<double> r;
  const double start = now_s();
  for (int k = 1; k <= reps; ++k) {
    // Side 0 decides whether another repetition fits the budget; both read it after the barrier.
    if (side == 0 && k > 1) {
      const double per = (now_s() - start) / (k - 1);
      if (now_s() - start + per > budget_s) sh->stop.store(1, std::memory_order_release);
    }
    sync_bar(c);
    if (sh->stop.load(std::memory_order_acquire) != 0) break;
    double v = -1;
    if (std::strcmp(way, "kernel") == 0) v = run_kernel(c, k);
    else if (memop) v = run_memop(c, k);
    else v = run_event(c, k);
    r.push_back(v);
    if (v >= 0) {
      c.base += static_cast<uint64_t>(c.rounds);
      sh->rounds_seen[side].store(static_cast<uint64_t>(c.rounds), std::memory_order_release);  // all of them
    }
    sync_bar(c);  // both sides' outcome of repetition k is now visible
    if (sh->failed_rep.load(std::memory_order_acquire) != 0) break;
  }
  sync_bar(c);
  // Report (side 0): the child's numbers are in the shared page, published before the barrier.
  int rc = 0;
  if (side == 0) {
    std::vector<double> good;
    for (double v : r)
      if (v >= 0) good.push_back(v);
    std::sort(good.begin(), good.end());
    const int failed = sh->failed_rep.load(std::memory_order_acquire);
    std::printf("%-11s %-15s ", way, legacy ? "legacy" : "nonblocking");
    if (!good.empty())
      std::printf("round trip us: median %.2f min %.2f max %.2f over %zu repetitions", good[good.size() / 2],
                  good.front(), good.back(), good.size());
    else
      std::printf("no repetition completed");
    std::string res = std::string("RESULT way=") + way + " stream=" + (legacy ? "legacy" : "nonblocking") +
                      " rounds=" + std::to_string(c.rounds) + " reps_ok=" + std::to_string(good.size());
    char buf[256];
    if (!good.empty()) {
      std::snprintf(buf, sizeof buf, " median_us=%.3f min_us=%.3f max_us=%.3f", good[good.size() / 2], good.front(),
                    good.back());
      res += buf;
    }
    if (c.refused != 0) {
      std::printf("; refused by the driver (CUresult %d)", c.refused);
      res += " refused=" + std::to_string(c.refused);
      rc = 1;
    }
    if (failed != 0) {
      const uint64_t s0 = sh->rounds_seen[0].load(std::memory_order_acquire);
      const uint64_t s1 = sh->rounds_seen[1].load(std::memory_order_acquire);
      auto fmt = [](uint64_t v) { return v == UINT64_MAX ? std::string("?") : std::to_string(v); };
      std::printf("; repetition %d timed out after %s (parent) / %s (child) of %d round trips in %.2f s%s; "
                  "after the release the streams %s / %s", failed, fmt(s0).c_str(), fmt(s1).c_str(), c.rounds,
                  timeout_s, c.enqueue_blocked ? " (enqueuing the stream operations blocked)" : "",
                  sh->drained[0].load() ? "drained" : "did NOT drain", sh->drained[1].load() ? "drained" : "did NOT drain");
      std::snprintf(buf, sizeof buf, " timeout_rep=%d rounds_done=%s/%s drained=%d/%d", failed, fmt(s0).c_str(),
                    fmt(s1).c_str(), sh->drained[0].load(), sh->drained[1].load());
      res += buf;
      if (s0 != UINT64_MAX && s0 > 0)
        std::printf(" (about %.0f us per completed round trip)", timeout_s * 1e6 / static_cast<double>(s0));
      rc = 1;
    }
    if (c.bad != 0) {
      std::printf("; %llu payload words did not match their flag", static_cast<unsigned long long>(c.bad));
      res += " payload_bad=" + std::to_string(c.bad);
      rc = 1;
    }
    std::printf("\n%s\n", res.c_str());
    std::fflush(stdout);
  }
  // A stream that did not drain is left as it is: the process exits without tearing anything
  // down that could wait on it (the driver reclaims the context).
  if (sh->failed_rep.load() == 0) {
    CK(cudaHostUnregister(const_cast<uint32_t*>(sh->host_word)));
    if (side == 1) CK(cudaIpcCloseMemHandle(mem));
  }
  return rc;
}

int main(int argc, char** argv) {
  const char* usage = "usage: handoff_probe kernel|memop-dev|memop-host|event [nonblocking|legacy [ROUNDS [REPS "
                      "[TIMEOUT_MS [BUDGET_MS]]]]]\n";
  if (argc < 2) { std::fputs(usage, stderr); return 2; }
  const char* way = argv[1];
  if (std::strcmp(way, "kernel") != 0 && std::strcmp(way, "memop-dev") != 0 && std::strcmp(way, "memop-host") != 0 &&
      std::strcmp(way, "event") != 0) { std::fputs(usage, stderr); return 2; }
  bool legacy = false;
  if (argc > 2) {
    if (std::strcmp(argv[2], "legacy") == 0) legacy = true;
    else if (std::strcmp(argv[2], "nonblocking") != 0) { std::fputs(usage, stderr); return 2; }
  }
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 1000;
  const int reps = argc > 4 ? std::max(1, std::atoi(argv[4])) : 5;
  const double timeout_s = (argc > 5 ? std::max(10, std::atoi(argv[5])) : 1000) / 1e3;
  const double budget_s = (argc > 6 ? std::max(10, std::atoi(argv[6])) : 4000) / 1e3;
  void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 2;
  Shared* sh = new (page) Shared();  // mmap returns a page-aligned, zero-filled region
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent on the GPU
    if (getppid() == 1) std::_Exit(6);
    std::_Exit(side_main(1, sh, way, legacy, rounds, reps, timeout_s, budget_s));
  }
  const int rc = side_main(0, sh, way, legacy, rounds, reps, timeout_s, budget_s);
  int status = 0;
  const double end = now_s() + 10;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (now_s() > end) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      std::printf("child did not exit: killed\n");
      std::fflush(stdout);
      std::_Exit(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (child_rc > 1) std::printf("child exited with %d\n", child_rc);
  // _Exit, not a return: no runtime teardown that could wait on a stream left blocked.
  std::fflush(stdout);
  std::_Exit(rc != 0 ? rc : (child_rc > 1 ? child_rc : 0));
}
