// Futex wait/wake on a 32-bit word in (possibly shared) memory, and a CPU relax hint.
// Shared mappings need the non-PRIVATE futex ops: the key is the physical page, so waiters and
// wakers in different processes meet.
#pragma once
#include <atomic>
#include <cstdint>

namespace rc {

/// Sleep while *word == expected, at most timeout_ns. Returns on wake, timeout, signal or mismatch.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
/// Wake every sleeper on word.
void futex_wake_all(std::atomic<uint32_t>* word);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace rc
