// A small pool of threads that splits one large copy or reduction of a rank over the CPUs it may
// use, and the split kernels built on it. Results are bit-identical to one thread: the work is
// cut into contiguous element ranges and every element is combined exactly as reduce_cpu would
// (the reduction order per element is the algorithm's, unchanged).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/dtype.h"

namespace rc {

class CpuPool {
 public:
  /// `threads` >= 1 parts per run: the calling thread runs part 0, threads - 1 workers the rest.
  /// Idle workers spin for `spin_us`, then sleep on a condition variable until the next run.
  CpuPool(int threads, int spin_us);
  /// Joins the workers. In a child forked after the pool started, the parent's workers do not
  /// exist: the child's copy of the pool's state is left allocated and nothing is joined.
  ~CpuPool();
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  int threads() const { return threads_; }
  int spin_us() const { return spin_us_.load(std::memory_order_relaxed); }
  /// The idle spin from the next idle period of each worker on (any thread; relaxed: a worker
  /// that reads the old value spins as long as it said, nothing else depends on it).
  void set_spin_us(int spin_us) { spin_us_.store(spin_us < 0 ? 0 : spin_us, std::memory_order_relaxed); }
  /// Run fn(k) for every part k in [0, threads()) and return when all are done; the first
  /// exception a part threw is rethrown here (after every part finished). One run at a time:
  /// called by one thread at a time (the communicator's executing thread). In a forked child
  /// the parts run one after the other on the caller.
  void run(const std::function<void(int)>& fn);

 private:
  struct State;
  void worker(int k);
  /// Stops and joins the workers and frees the shared state (the destructor; a failed constructor).
  void stop_workers();
  int threads_;
  std::atomic<int> spin_us_;
  int owner_pid_;
  State* st_;  // owned; leaked on purpose in a forked child (its mutex may be held by a parent thread)
};

/// If the calling thread runs on `cpu`, move it to another CPU of its affinity mask and leave
/// the mask as it was (narrowing the mask makes the kernel migrate the thread at once); nothing
/// when it runs elsewhere or may use no other CPU. A worker the scheduler placed on the caller's
/// CPU would run its part only by taking turns with the caller: it steps off before each run.
void step_off_cpu(int cpu);

/// The element range [*begin, *end) of part k of n elements of esize bytes split into `parts`:
/// contiguous, in order, covering [0, n); every boundary but the last on a 4 KiB multiple of
/// bytes where the parts are that large (no two parts write one cache line).
void split_range(size_t n, size_t esize, int parts, int k, size_t* begin, size_t* end);

/// dst = a (op) b (reduce_cpu's contract), split over pool's threads when the bytes are at least
/// min_bytes; pool may be null (one thread).
void reduce_split(CpuPool* pool, size_t min_bytes, void* dst, const void* a, const void* b, size_t n,
                  DType dt, ReduceOp op, double scale);
/// copy_to_peer(dst, src, bytes, stream) (copy_cpu.h), split likewise; every thread fences its
/// own streaming stores before the run returns, so the caller's release store orders after all.
void copy_split(CpuPool* pool, size_t min_bytes, void* dst, const void* src, size_t bytes, bool stream);
/// A fused reduction streamed into a peer's slot: scratch = a (op) b, then copy_to_peer(slot,
/// scratch, stream) range by range, each range by one thread (scratch holds n elements).
void reduce_stream_split(CpuPool* pool, size_t min_bytes, char* slot, char* scratch, const void* a,
                         const void* b, size_t n, DType dt, ReduceOp op);

}  // namespace rc
