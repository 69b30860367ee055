// copy_to_peer: memcpy, or SSE2 streaming stores (baseline x86-64, no ISA dispatch needed).
#include "kernels/copy_cpu.h"

#include <cstdint>
#include <cstring>


#if defined(__x86_64__)
#include <emmintrin.h>
#define RC_HAVE_STREAM 1
#endif

namespace rc {

void copy_to_peer(void* dst, const void* src, size_t n, bool stream) {
#ifdef RC_HAVE_STREAM
  if (stream && n >= 4096) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    // Head: plain stores up to a 16-byte boundary of dst (streaming stores need it aligned).
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    // Body: 64 bytes (one cache line's worth) per iteration; loads may be unaligned.
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);  // tail
    // Streaming stores are weakly ordered: fence them before the caller's release store.
    _mm_sfence();
    return;
  }
#else
  (void)stream;
#endif
  std::memcpy(dst, src, n);
}

}  // namespace rc
