// The fake CUDA runtime (fake_cudart.h): definitions of the runtime API functions the production
// CUDA sources call, declared by the toolkit's own cuda_runtime_api.h (so every signature is the
// real one), and of the two kernel entries they launch through.
#include "fake_cudart.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/dtype.h"
#include "device/ring_cuda.h"
#include "kernels/reduce_cuda.h"

namespace fake_cuda {
namespace {

struct FStream {
  uint64_t id;
  uint64_t capture = 0;  // the capture this stream belongs to (0: none)
};
struct FEvent {
  uint64_t capture = 0;  // recorded during that capture
};
struct Alloc {
  size_t size;
  int fd;      // device memory: its memfd (-1 otherwise)
  int kind;    // 0 device, 1 host-mapped, 2 opened IPC mapping
  int device = 0;
};
struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t size;
};
constexpr uint32_t kMagic = 0x46414b45;

std::mutex mu;
std::vector<Call> g_calls;
std::vector<Launch> g_launches;
std::map<uintptr_t, Alloc> g_allocs;
std::map<uint64_t, std::vector<Launch>> g_graphs;
std::vector<FStream*> g_streams;  // every stream created (never freed: ids stay meaningful)
uint64_t g_next_stream = 1, g_next_capture = 1;
int g_active = 0;  // captures in progress

// The topology (fake_cudart.h), read once.
struct Topology {
  int devices = 1, current = 0, p2p = 0, mps = 0, sms = 4, blocks_per_sm = 2;
  Topology() {
    auto env = [](const char* n, int d) {
      const char* v = std::getenv(n);
      return v != nullptr && *v != 0 ? std::atoi(v) : d;
    };
    devices = env("FAKE_CUDA_DEVICES", 1);
    current = env("FAKE_CUDA_DEVICE", 0);
    p2p = env("FAKE_CUDA_P2P", 0);
    mps = env("FAKE_CUDA_MPS", 0);
    sms = env("FAKE_CUDA_SMS", 4);
    blocks_per_sm = env("FAKE_CUDA_BLOCKS_PER_SM", 2);
  }
};
Topology& topo() {
  static Topology t;
  return t;
}

uint64_t sid(cudaStream_t s) { return s == nullptr ? 0 : reinterpret_cast<FStream*>(s)->id; }
uint64_t cap_of(cudaStream_t s) { return s == nullptr ? 0 : reinterpret_cast<FStream*>(s)->capture; }

void rec(const char* name, cudaStream_t s, bool has_stream = true) {
  Call c;
  c.name = name;
  c.stream = has_stream ? sid(s) : ~0ull;
  c.capturing = g_active > 0;
  c.graph = has_stream ? cap_of(s) : 0;
  g_calls.push_back(c);
}

// Queries and synchronizes: illegal while a capture is active (global capture mode).
cudaError_t query(const char* name, cudaStream_t s, bool has_stream) {
  std::lock_guard<std::mutex> lk(mu);
  rec(name, s, has_stream);
  return g_active > 0 ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

const Alloc* find(const void* p, uintptr_t* base) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

void launch(Launch l, cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu);
  rec(l.kernel == "ring" ? "launch ring" : "launch reduce", s);
  l.stream = sid(s);
  if (cap_of(s) != 0) g_graphs[cap_of(s)].push_back(l);
  g_launches.push_back(l);
}

}  // namespace

std::vector<Call> calls() {
  std::lock_guard<std::mutex> lk(mu);
  return g_calls;
}
std::vector<Launch> launches() {
  std::lock_guard<std::mutex> lk(mu);
  return g_launches;
}
void clear() {
  std::lock_guard<std::mutex> lk(mu);
  g_calls.clear();
  g_launches.clear();
}
uint64_t stream_id(const void* s) { return sid(static_cast<cudaStream_t>(const_cast<void*>(s))); }
void begin_capture(void* s) {
  std::lock_guard<std::mutex> lk(mu);
  FStream* f = static_cast<FStream*>(s);
  f->capture = g_next_capture++;
  ++g_active;
  g_graphs[f->capture];
  rec("begin capture", static_cast<cudaStream_t>(s));
}
uint64_t end_capture(void* s) {
  std::lock_guard<std::mutex> lk(mu);
  FStream* f = static_cast<FStream*>(s);
  const uint64_t g = f->capture;
  rec("end capture", static_cast<cudaStream_t>(s));
  // Every stream that joined the capture leaves it (the real runtime requires them joined back).
  for (FStream* x : g_streams) {
    if (x->capture == g) x->capture = 0;
  }
  --g_active;
  return g;
}
int replay(uint64_t graph) {
  std::lock_guard<std::mutex> lk(mu);
  int n = 0;
  for (Launch l : g_graphs[graph]) {
    l.replay = true;
    Call c;
    c.name = "replay " + l.kernel;
    c.replay = true;
    c.graph = graph;
    g_calls.push_back(c);
    g_launches.push_back(l);
    ++n;
  }
  return n;
}
void* new_stream() {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}
void* device_alloc(uint64_t n) {
  void* p = nullptr;
  return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
}

}  // namespace fake_cuda

using namespace fake_cuda;

// ---------------- the runtime API ----------------

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorStreamCaptureUnsupported ? "cudaErrorStreamCaptureUnsupported" : "cudaErrorFake"; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake runtime error"; }
cudaError_t cudaGetDevice(int* d) { *d = topo().current; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= topo().devices) return cudaErrorInvalidDevice;
  topo().current = d;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) { *n = topo().devices; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int d) {
  if (d < 0 || d >= topo().devices) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof(*p));
  std::strcpy(p->name, "fake GPU");
  const std::string uuid = std::to_string(d % 10) + "fake-gpu-uuid-0";  // 16 bytes
  std::memcpy(p->uuid.bytes, uuid.data(), 16);
  p->multiProcessorCount = topo().sms;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr a, int d) {
  *v = a == cudaDevAttrIpcEventSupport ? 1 : a == cudaDevAttrMultiProcessorCount ? topo().sms
       : a == cudaDevAttrMpsEnabled ? topo().mps : 0;
  return d >= 0 && d < topo().devices ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int a, int b) {
  *can = a != b && topo().p2p != 0 ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* fa, const void* f) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaFuncGetAttributes", nullptr, false);
  g_calls.back().arg = reinterpret_cast<uint64_t>(f);
  std::memset(fa, 0, sizeof(*fa));
  fa->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* f, int, size_t) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaOccupancyMaxActiveBlocksPerMultiprocessor", nullptr, false);
  g_calls.back().arg = reinterpret_cast<uint64_t>(f);
  *n = topo().blocks_per_sm;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t n) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaMalloc", nullptr, false);
  const int fd = memfd_create("fake-cuda", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0) return cudaErrorMemoryAllocation;
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  g_allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{n, fd, 0, topo().current};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaFree", nullptr, false);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != 0) return cudaErrorInvalidValue;
  munmap(p, it->second.size);
  close(it->second.fd);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaHostAlloc", nullptr, false);
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  g_allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{n, -1, 1};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> lk(mu);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != 1) return cudaErrorInvalidValue;
  munmap(p, it->second.size);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned int) {
  *d = h;  // one address space
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void*, size_t, unsigned int) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaHostRegister", nullptr, false);
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  std::lock_guard<std::mutex> lk(mu);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != 0) return cudaErrorInvalidValue;
  IpcHandle x{kMagic, static_cast<int32_t>(getpid()), it->second.fd, it->second.size};
  std::memset(h, 0, sizeof(*h));
  std::memcpy(h, &x, sizeof(x));
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int) {
  IpcHandle x;
  std::memcpy(&x, &h, sizeof(x));
  if (x.magic != kMagic) return cudaErrorInvalidValue;
  const std::string path = "/proc/" + std::to_string(x.pid) + "/fd/" + std::to_string(x.fd);
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return cudaErrorInvalidResourceHandle;
  void* m = mmap(nullptr, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaIpcOpenMemHandle", nullptr, false);
  g_allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{x.size, -1, 2};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> lk(mu);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != 2) return cudaErrorInvalidValue;
  munmap(p, it->second.size);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  std::lock_guard<std::mutex> lk(mu);
  std::memset(a, 0, sizeof(*a));
  const Alloc* x = find(p, nullptr);
  a->type = x == nullptr ? cudaMemoryTypeUnregistered : x->kind == 1 ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  a->device = x == nullptr ? 0 : x->device;
  a->devicePointer = const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  std::lock_guard<std::mutex> lk(mu);
  FStream* f = new FStream{g_next_stream++};
  g_streams.push_back(f);
  *s = reinterpret_cast<cudaStream_t>(f);
  rec("cudaStreamCreate", *s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaStreamDestroy", s);
  return cudaSuccess;  // the object stays: ids in the log remain meaningful
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaStreamIsCapturing", s);
  *st = cap_of(s) != 0 ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return query("cudaStreamQuery", s, true); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return query("cudaStreamSynchronize", s, true); }
cudaError_t cudaEventQuery(cudaEvent_t) { return query("cudaEventQuery", nullptr, false); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new FEvent{});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<FEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaEventRecord", s);
  reinterpret_cast<FEvent*>(e)->capture = cap_of(s);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaStreamWaitEvent", s);
  const uint64_t c = reinterpret_cast<FEvent*>(e)->capture;
  if (c != 0 && s != nullptr) reinterpret_cast<FStream*>(s)->capture = c;  // joins the capture
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* src, size_t n, enum cudaMemcpyKind, cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaMemcpyAsync", s);
  if (cap_of(s) == 0) std::memmove(d, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu);
  rec("cudaMemsetAsync", s);
  if (cap_of(s) == 0) std::memset(d, v, n);
  return cudaSuccess;
}

// ---------------- the kernel entries ----------------

namespace rc {

namespace {
// One distinct address per ring kernel, as the real table's host stubs.
template <class T, class Fin> struct KernelTag { static const char tag; };
template <class T, class Fin> const char KernelTag<T, Fin>::tag = 0;
struct FakeKernelOf {
  template <class T, class Fin> const void* run() { return &KernelTag<T, Fin>::tag; }
  const void* none() { return nullptr; }
};
}  // namespace

const std::vector<const void*>& ring_kernels() {
  static const std::vector<const void*> all = [] {
    std::vector<const void*> v;
    for (uint32_t d = 0; d < static_cast<uint32_t>(DType::kCount); ++d) {
      for (uint32_t o = 0; o < static_cast<uint32_t>(ReduceOp::kCount); ++o) {
        FakeKernelOf k;
        const void* f = rops::dispatch_reduce(static_cast<DType>(d), static_cast<ReduceOp>(o), k);
        if (f != nullptr && std::find(v.begin(), v.end(), f) == v.end()) v.push_back(f);
      }
    }
    return v;
  }();
  return all;
}

void ring_cuda(const dev::RingArgs& a, DType dt, ReduceOp op, cudaStream_t stream) {
  Launch l;
  l.kernel = "ring";
  l.ring = a;
  l.dtype = static_cast<int>(dt);
  l.op = static_cast<int>(op);
  launch(l, stream);
}

void reduce_cuda(void*, const void*, const void*, size_t, DType dt, ReduceOp op, double, cudaStream_t stream, int) {
  Launch l;
  l.kernel = "reduce";
  l.dtype = static_cast<int>(dt);
  l.op = static_cast<int>(op);
  launch(l, stream);
}

}  // namespace rc
