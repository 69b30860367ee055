// Probe of CUDA IPC events between two processes on one GPU: does a host poll (cudaEventQuery)
// of an imported event see the peer's record complete while the recording process makes no
// further CUDA call? Five variants (a 20 ms kernel then the record; the producer querying its
// event or stream after the record; the consumer waiting through a private stream; a memcpy into
// the consumer's IPC buffer). Needs a GPU (docs/cuda.md: why the hand-offs wait on the process's
// own events).
//
//     nvcc -O2 -arch=sm_90 -o /tmp/ipc_probe benchmarks/device/cuda_ipc_event_probe.cu && /tmp/ipc_probe
#include <cuda_runtime.h>
#include <unistd.h>
#include <sys/wait.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); std::exit(3); } } while (0)

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static void wr(int fd, const void* p, size_t n) { if (write(fd, p, n) != (ssize_t)n) std::exit(4); }
static void rd(int fd, void* p, size_t n) { size_t g = 0; while (g < n) { ssize_t r = read(fd, (char*)p + g, n - g); if (r <= 0) std::exit(5); g += r; } }

const char* names[] = {"record, consumer polls the IPC event",
                       "record + producer cudaEventQuery, consumer polls the IPC event",
                       "record, consumer stream-waits it and polls a local event",
                       "record + producer cudaStreamQuery, consumer polls the IPC event",
                       "memcpy into consumer's IPC buffer + record, consumer polls"};
const int NV = 5;

int main() {
  int p2c[2], c2p[2];
  if (pipe(p2c) || pipe(c2p)) return 1;
  pid_t pid = fork();
  if (pid == 0) {  // consumer
    CK(cudaSetDevice(0));
    cudaIpcEventHandle_t h; rd(p2c[0], &h, sizeof(h));
    cudaEvent_t iev; CK(cudaIpcOpenEventHandle(&iev, h));
    void* inbox; CK(cudaMalloc(&inbox, 1 << 20));
    cudaIpcMemHandle_t mh; CK(cudaIpcGetMemHandle(&mh, inbox));
    wr(c2p[1], &mh, sizeof(mh));
    cudaStream_t cs; CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    cudaEvent_t local; CK(cudaEventCreateWithFlags(&local, cudaEventDisableTiming));
    for (int v = 0; v < NV; ++v) {
      int go; rd(p2c[0], &go, sizeof(go));
      double t0 = now(), done = -1;
      cudaEvent_t ev = iev;
      if (v == 2) { CK(cudaStreamWaitEvent(cs, iev, 0)); CK(cudaEventRecord(local, cs)); ev = local; }
      int first = (int)cudaEventQuery(ev);
      while (now() - t0 < 2.0) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) { done = now() - t0; break; }
        if (e != cudaErrorNotReady) { std::printf("query error %s\n", cudaGetErrorName(e)); break; }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      std::printf("[probe] variant %d (%s): first query %d, %s %.4f s\n", v, names[v], first,
                  done >= 0 ? "complete after" : "NOT complete within", done >= 0 ? done : 2.0);
      std::fflush(stdout);
      wr(c2p[1], &v, sizeof(v));
    }
    return 0;
  }
  CK(cudaSetDevice(0));
  cudaEvent_t ev; CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t h; CK(cudaIpcGetEventHandle(&h, ev));
  wr(p2c[1], &h, sizeof(h));
  cudaIpcMemHandle_t mh; rd(c2p[0], &mh, sizeof(mh));
  void* peer; CK(cudaIpcOpenMemHandle(&peer, mh, cudaIpcMemLazyEnablePeerAccess));
  void* src; CK(cudaMalloc(&src, 1 << 20));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rate = 0; CK(cudaDeviceGetAttribute(&rate, cudaDevAttrClockRate, 0));  // kHz
  for (int v = 0; v < NV; ++v) {
    if (v == 4) CK(cudaMemcpyAsync(peer, src, 1 << 20, cudaMemcpyDefault, s));
    else spin<<<1, 1, 0, s>>>((long long)rate * 20);  // ~20 ms
    CK(cudaEventRecord(ev, s));
    if (v == 1) (void)cudaEventQuery(ev);
    if (v == 3) (void)cudaStreamQuery(s);
    wr(p2c[1], &v, sizeof(v));
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // no CUDA call meanwhile
    int r; rd(c2p[0], &r, sizeof(r));
    CK(cudaStreamSynchronize(s));
  }
  int st = 0; waitpid(pid, &st, 0);
  std::printf("[probe] done, consumer status %d\n", st);
  return 0;
}
