// How long a futex wake takes to run the sleeper, by how long the sleeper's CPU sat idle: the
// cost a wait pays when it sleeps instead of spinning (docs/latency.md, "The wait policy").
//
//   cc -O2 -o /tmp/futex_wake benchmarks/probes/futex_wake.c && /tmp/futex_wake 20 100 1000 5000
//
// Two processes on CPUs 0 and 1 (the first two this process may run on). For each idle time
// given (µs), 400 rounds: the sleeper futex-waits on a shared word; the waker spins out the idle
// time on its own CPU, stores CLOCK_MONOTONIC, bumps the word and wakes it; the sleeper reads the
// clock as soon as it runs. Prints p10/p50/p90/p99 of that delay.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kRounds = 400 };

struct Shared {
  _Atomic uint32_t word;  // 2i + 1: round i's wake (bumped to 2i + 2 once acknowledged)
  _Atomic int64_t sent;   // the waker's clock at round i's wake
  _Atomic uint32_t ack;   // rounds the sleeper has measured
  int64_t delay[kRounds];
};

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (sched_setaffinity(0, sizeof s, &s) != 0) perror("sched_setaffinity");
}

static int cmp(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return x < y ? -1 : x > y;
}

static void measure(int idle_us, int cpu_a, int cpu_b) {
  struct Shared* s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) { perror("mmap"); exit(1); }
  pid_t child = fork();
  if (child == 0) {  // the sleeper
    pin(cpu_b);
    for (uint32_t i = 0; i < kRounds; ++i) {
      uint32_t v;
      while ((v = atomic_load(&s->word)) < 2 * i + 1) syscall(SYS_futex, &s->word, FUTEX_WAIT, v, 0, 0, 0);
      s->delay[i] = now_ns() - atomic_load(&s->sent);
      atomic_store(&s->ack, i + 1);
    }
    _exit(0);
  }
  pin(cpu_a);
  for (uint32_t i = 0; i < kRounds; ++i) {
    const int64_t t0 = now_ns();
    while (now_ns() - t0 < idle_us * 1000LL) {
    }
    atomic_store(&s->sent, now_ns());
    atomic_fetch_add(&s->word, 1);
    syscall(SYS_futex, &s->word, FUTEX_WAKE, 1, 0, 0, 0);
    while (atomic_load(&s->ack) != i + 1) {
    }
    atomic_fetch_add(&s->word, 1);
  }
  waitpid(child, 0, 0);
  qsort(s->delay, kRounds, sizeof s->delay[0], cmp);
  printf("idle %6d us: wake -> running p10 %6.1f  p50 %6.1f  p90 %6.1f  p99 %7.1f us\n", idle_us,
         s->delay[kRounds / 10] / 1e3, s->delay[kRounds / 2] / 1e3, s->delay[9 * kRounds / 10] / 1e3,
         s->delay[99 * kRounds / 100] / 1e3);
  munmap(s, sizeof *s);
}

int main(int argc, char** argv) {
  cpu_set_t s;
  if (sched_getaffinity(0, sizeof s, &s) != 0) { perror("sched_getaffinity"); return 1; }
  int cpus[2], n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &s)) cpus[n++] = c;
  if (n < 2) { fprintf(stderr, "needs 2 CPUs\n"); return 1; }
  for (int i = 1; i < argc; ++i) measure(atoi(argv[i]), cpus[0], cpus[1]);
  return 0;
}
