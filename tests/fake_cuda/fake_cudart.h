// A fake CUDA runtime for the tests, linked in place of libcudart under the production CUDA
// sources (comm/cuda_device.cpp, comm/cuda_ring.cpp, transport/cuda_ipc*.cpp, ...) in the
// test-only module ringcomm._C_cuda_fake. Never linked into ringcomm._C or ringcomm._C_cuda.
//
// It implements the runtime calls those sources make, with one device (0), and records every
// call: its name, its stream, whether a capture was active, and for the kernel entries
// (rc::ring_cuda, rc::reduce_cuda) their arguments. Kernels do not run (the ring kernel's body is
// proved on the host by tests/device_proof/); copies do (device memory is host memory).
//  - Device memory is a memfd mapping, so that cudaIpcGetMemHandle / cudaIpcOpenMemHandle work
//    between processes (/proc/<pid>/fd/<fd>); host-mapped memory is the same pointer on both sides.
//  - Capture (fake_begin_capture / fake_end_capture, global mode): launches, event records and
//    stream waits on a capturing stream become the graph's nodes; a stream waiting on an event
//    recorded during the capture joins it; every query or synchronize while any stream captures
//    fails with cudaErrorStreamCaptureUnsupported and is recorded as such.
//  - fake_replay(graph) records the graph's launches again, as a replay would run them.
//  - The topology comes from the environment, read once: FAKE_CUDA_DEVICES (device count,
//    default 1; device d's uuid starts with d, so processes on one ordinal share a GPU),
//    FAKE_CUDA_DEVICE (the current device at start, 0), FAKE_CUDA_P2P (peer access between
//    devices, 0), FAKE_CUDA_MPS (cudaDevAttrMpsEnabled, 0), FAKE_CUDA_SMS (4) and
//    FAKE_CUDA_BLOCKS_PER_SM (what the occupancy query answers for any kernel, 2).
//  - rc::ring_kernels() is one distinct address per (dtype, op) pair of the dispatch;
//    cudaFuncGetAttributes and the occupancy query record the kernel's address (Call::arg).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "device/ring_proto.h"

namespace fake_cuda {

struct Call {
  std::string name;
  uint64_t stream = 0;     // the stream's id (0: the legacy default stream; ~0: none)
  bool capturing = false;  // a capture was active anywhere in the process
  bool replay = false;     // recorded by fake_replay
  uint64_t graph = 0;      // the capture it belongs to (0: none)
  uint64_t arg = 0;        // cudaFuncGetAttributes / the occupancy query: the kernel's address
};

struct Launch {
  std::string kernel;  // "ring" or "reduce"
  uint64_t stream = 0;
  bool replay = false;
  rc::dev::RingArgs ring{};  // kernel == "ring"
  int dtype = 0, op = 0;
};

std::vector<Call> calls();
std::vector<Launch> launches();
void clear();
uint64_t stream_id(const void* s);
/// Begin / end a capture on `s`; end returns the graph's id.
void begin_capture(void* s);
uint64_t end_capture(void* s);
/// Record the graph's kernel launches again (a replay); returns how many.
int replay(uint64_t graph);
/// A new stream (as a caller's) and a device allocation of n bytes.
void* new_stream();
void* device_alloc(uint64_t n);

}  // namespace fake_cuda
