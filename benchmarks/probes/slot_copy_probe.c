// Two threads, one writer and one reader, move 64 MiB through 8 slots of 256 KiB (ringcomm's
// default slot geometry): the writer fills a slot with memcpy (cached stores) or with streaming
// (non-temporal) stores, the reader copies it out. Prints GB/s for both ways, twice each. Which
// way is faster depends on where the reader finds the lines: still dirty in the writer's cache
// (another L3, as on a VM whose vCPUs the host moves around) or in memory; docs/latency.md,
// "Stores into peers' slots", says when each wins and why RINGCOMM_STREAM exists.
//
//   gcc -O2 -mavx2 -pthread benchmarks/probes/slot_copy_probe.c -o /tmp/slot_copy_probe
//   /tmp/slot_copy_probe 0 1      # writer on CPU 0, reader on CPU 1
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOT (256 * 1024)
#define NSLOT 8
#define TOTAL (64ul << 20)

static char *slots, *src, *dst;
static _Atomic long head, tail;  // slots published by the writer / released by the reader
static int streaming, cpu_w, cpu_r;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void stream_copy(char *d, const char *s, size_t n) {  // n: a multiple of 64, d 32-aligned
  for (size_t i = 0; i < n; i += 64) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    _mm256_stream_si256((__m256i *)(d + i), a);
    _mm256_stream_si256((__m256i *)(d + i + 32), b);
  }
  _mm_sfence();  // order the streaming stores before the release store that publishes the slot
}

static void *writer(void *x) {
  (void)x;
  pin(cpu_w);
  for (long i = 0; i < (long)(TOTAL / SLOT); i++) {
    while (i - atomic_load_explicit(&tail, memory_order_acquire) >= NSLOT) {
    }
    char *s = slots + (i % NSLOT) * SLOT;
    if (streaming) stream_copy(s, src + i * SLOT, SLOT);
    else memcpy(s, src + i * SLOT, SLOT);
    atomic_store_explicit(&head, i + 1, memory_order_release);
  }
  return 0;
}

static void *reader(void *x) {
  (void)x;
  pin(cpu_r);
  for (long i = 0; i < (long)(TOTAL / SLOT); i++) {
    while (atomic_load_explicit(&head, memory_order_acquire) <= i) {
    }
    memcpy(dst + i * SLOT, slots + (i % NSLOT) * SLOT, SLOT);
    atomic_store_explicit(&tail, i + 1, memory_order_release);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s WRITER_CPU READER_CPU\n", argv[0]);
    return 2;
  }
  cpu_w = atoi(argv[1]);
  cpu_r = atoi(argv[2]);
  slots = aligned_alloc(4096, SLOT * NSLOT);
  src = aligned_alloc(4096, TOTAL);
  dst = aligned_alloc(4096, TOTAL);
  memset(src, 1, TOTAL);
  memset(dst, 0, TOTAL);
  memset(slots, 0, SLOT * NSLOT);
  for (int rep = 0; rep < 2; rep++) {
    for (streaming = 0; streaming < 2; streaming++) {
      head = tail = 0;
      pthread_t a, b;
      double t0 = now();
      pthread_create(&a, 0, writer, 0);
      pthread_create(&b, 0, reader, 0);
      pthread_join(a, 0);
      pthread_join(b, 0);
      double t = now() - t0;
      printf("cpus %d->%d %-9s %.2f ms (%.2f GB/s)\n", cpu_w, cpu_r, streaming ? "streaming" : "memcpy", t * 1e3,
             TOTAL / t / 1e9);
    }
  }
  if (memcmp(src, dst, TOTAL) != 0) {
    fprintf(stderr, "data mismatch\n");
    return 1;
  }
  return 0;
}
