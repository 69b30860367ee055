#include "kernels/cpu_pool.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/copy_cpu.h"
#include "kernels/reduce_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define RC_POOL_PAUSE() _mm_pause()
#else
#define RC_POOL_PAUSE() std::this_thread::yield()
#endif

namespace rc {

// Hand-off protocol. The caller writes job and clears errors, then publishes a run by
// incrementing gen (seq_cst). Every worker runs its part of each generation exactly once: it
// waits for gen to move past the last one it ran, runs, then decrements pending (release). The
// caller sets pending = threads - 1 before publishing and returns only when it reads 0
// (acquire), so no worker still reads job or errors when the next run rewrites them.
// Sleeping: a worker that spun out increments sleepers under mu and re-checks gen before
// waiting; the caller reads sleepers after publishing gen (both seq_cst, so one of the two sees
// the other's write) and, when nonzero, takes mu before notifying: no wake-up is lost.
struct CpuPool::State {
  std::atomic<uint64_t> gen{0};
  std::atomic<int> caller_cpu{-1};  // the CPU the caller ran on when it published gen
  std::atomic<int> pending{0};
  std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  const std::function<void(int)>* job = nullptr;
  std::vector<std::exception_ptr> errors;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::thread> workers;
};

CpuPool::CpuPool(int threads, int spin_us)
    : threads_(threads < 1 ? 1 : threads), spin_us_(spin_us < 0 ? 0 : spin_us),
      owner_pid_(static_cast<int>(::getpid())), st_(new State) {
  st_->errors.resize(static_cast<size_t>(threads_));
  try {
    for (int k = 1; k < threads_; ++k) st_->workers.emplace_back([this, k] { worker(k); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

CpuPool::~CpuPool() {
  if (static_cast<int>(::getpid()) != owner_pid_) return;  // forked child: see the header
  stop_workers();
}

void CpuPool::stop_workers() {
  st_->stop.store(true);
  st_->gen.fetch_add(1);
  { std::lock_guard<std::mutex> lk(st_->mu); }  // a worker between its check and its wait sees stop
  st_->cv.notify_all();
  for (auto& t : st_->workers) t.join();
  delete st_;
}

// The mask is read at each step, never kept: ringcomm pins a rank's threads at init, before any
// run, and the mask this restores is the one the thread had a moment before.
void step_off_cpu(int cpu) {
  if (cpu < 0 || sched_getcpu() != cpu) return;
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof(all), &all) != 0) return;
  cpu_set_t others = all;
  CPU_CLR(cpu, &others);
  if (CPU_COUNT(&others) == 0) return;
  if (sched_setaffinity(0, sizeof(others), &others) == 0) sched_setaffinity(0, sizeof(all), &all);
}

void CpuPool::worker(int k) {
  State& s = *st_;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = s.gen.load();
    if (g == seen) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed));
      int i = 0;
      while ((g = s.gen.load()) == seen) {
        RC_POOL_PAUSE();
        if ((++i & 255) == 0 && std::chrono::steady_clock::now() >= until) {
          std::unique_lock<std::mutex> lk(s.mu);
          s.sleepers.fetch_add(1);
          s.cv.wait(lk, [&] { return s.gen.load() != seen; });
          s.sleepers.fetch_sub(1);
          g = s.gen.load();
          break;
        }
      }
    }
    seen = g;
    if (s.stop.load()) return;
    step_off_cpu(s.caller_cpu.load(std::memory_order_relaxed));
    try {
      (*s.job)(k);
    } catch (...) {
      s.errors[static_cast<size_t>(k)] = std::current_exception();
    }
    s.pending.fetch_sub(1, std::memory_order_release);
  }
}

void CpuPool::run(const std::function<void(int)>& fn) {
  if (threads_ == 1 || static_cast<int>(::getpid()) != owner_pid_) {
    for (int k = 0; k < threads_; ++k) fn(k);
    return;
  }
  State& s = *st_;
  s.job = &fn;
  for (auto& e : s.errors) e = nullptr;
  s.pending.store(threads_ - 1);
  s.caller_cpu.store(sched_getcpu(), std::memory_order_relaxed);  // ordered by gen's seq_cst store
  s.gen.fetch_add(1);
  if (s.sleepers.load() > 0) {
    { std::lock_guard<std::mutex> lk(s.mu); }
    s.cv.notify_all();
  }
  try {
    fn(0);
  } catch (...) {
    s.errors[0] = std::current_exception();
  }
  // Deadline-free: the workers run bounded memory loops and cannot block. After a few pauses
  // the caller offers its CPU, which a worker woken onto it needs to finish its part.
  for (int i = 0; s.pending.load(std::memory_order_acquire) != 0; ++i) {
    if (i < 64) {
      RC_POOL_PAUSE();
    } else {
      sched_yield();
    }
  }
  for (auto& e : s.errors)
    if (e) std::rethrow_exception(e);
}

void split_range(size_t n, size_t esize, int parts, int k, size_t* begin, size_t* end) {
  const size_t p = parts < 1 ? 1 : static_cast<size_t>(parts);
  const size_t grain = esize >= 4096 ? 1 : 4096 / esize;  // elements per 4 KiB
  size_t per = (n + p - 1) / p;
  per = (per + grain - 1) / grain * grain;
  const size_t b = std::min(n, per * static_cast<size_t>(k));
  *begin = b;
  *end = (k + 1 == static_cast<int>(p)) ? n : std::min(n, b + per);
}

namespace {
bool split(CpuPool* pool, size_t min_bytes, size_t bytes) {
  return pool != nullptr && pool->threads() > 1 && bytes >= min_bytes && bytes > 0;
}
// Runs fn(lo, hi) on every thread of the pool for its non-empty share [lo, hi) of n elements of
// es bytes (split_range), and returns when every share is done.
template <class Fn>
void for_each_range(CpuPool* pool, size_t n, size_t es, Fn fn) {
  const int parts = pool->threads();
  pool->run([&](int k) {
    size_t lo, hi;
    split_range(n, es, parts, k, &lo, &hi);
    if (hi > lo) fn(lo, hi);
  });
}

}  // namespace

void reduce_split(CpuPool* pool, size_t min_bytes, void* dst, const void* a, const void* b, size_t n,
                  DType dt, ReduceOp op, double scale) {
  const size_t es = dtype_size(dt);
  if (!split(pool, min_bytes, n * es)) {
    reduce_cpu(dst, a, b, n, dt, op, scale);
    return;
  }
  check_reduce_supported(dt, op);
  for_each_range(pool, n, es, [&](size_t lo, size_t hi) {
    reduce_cpu(static_cast<char*>(dst) + lo * es, static_cast<const char*>(a) + lo * es,
               static_cast<const char*>(b) + lo * es, hi - lo, dt, op, scale);
  });
}

void copy_split(CpuPool* pool, size_t min_bytes, void* dst, const void* src, size_t bytes, bool stream) {
  if (!split(pool, min_bytes, bytes)) {
    copy_to_peer(dst, src, bytes, stream);
    return;
  }
  for_each_range(pool, bytes, 1, [&](size_t lo, size_t hi) {
    copy_to_peer(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo, stream);
  });
}

void reduce_stream_split(CpuPool* pool, size_t min_bytes, char* slot, char* scratch, const void* a,
                         const void* b, size_t n, DType dt, ReduceOp op) {
  const size_t es = dtype_size(dt);
  if (!split(pool, min_bytes, n * es)) {
    reduce_cpu(scratch, a, b, n, dt, op, 1.0);
    copy_to_peer(slot, scratch, n * es, true);
    return;
  }
  check_reduce_supported(dt, op);
  for_each_range(pool, n, es, [&](size_t lo, size_t hi) {
    reduce_cpu(scratch + lo * es, static_cast<const char*>(a) + lo * es, static_cast<const char*>(b) + lo * es,
               hi - lo, dt, op, 1.0);
    copy_to_peer(slot + lo * es, scratch + lo * es, (hi - lo) * es, true);
  });
}

}  // namespace rc
