// The fused device ring kernel: device/ring_proto.h's RingLane on DevicePlatform, one block per
// lane, instantiated for every (dtype, op) pair through THE dtype x op switch
// (kernels/reduce_ops.h's dispatch_reduce). Built with --fmad=false like reduce.cu, so that its
// arithmetic is the CPU kernels' bit for bit.
//
// RC_RING_BROKEN (a Broken value, default none) builds a broken variant instead: only the SASS
// check (tests/test_device_sass.py) does that, to show that its check fails on a hoisted load.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/errors.h"
#include "device/ring_cuda.h"

#ifndef RC_RING_BROKEN
#define RC_RING_BROKEN 0
#endif

namespace rc {
namespace {

constexpr dev::Broken kVariant = static_cast<dev::Broken>(RC_RING_BROKEN);

template <class T, class Fin>
__global__ void __launch_bounds__(kRingThreads) ring_kernel(dev::RingArgs a) {
  dev::ring_lane<dev::DevicePlatform, kVariant, T, Fin>(a, static_cast<int>(blockIdx.x));
}

using RingLaunch = void (*)(const dev::RingArgs&, cudaStream_t);

template <class T, class Fin>
void launch_ring(const dev::RingArgs& a, cudaStream_t s) {
  ring_kernel<T, Fin><<<a.nlanes, kRingThreads, 0, s>>>(a);
}

// RC_RING_SASS_SUBSET: float32 SUM only (a quick build for the SASS check; never in a module).
template <class T, class Fin>
constexpr bool kBuilt =
#ifdef RC_RING_SASS_SUBSET
    std::is_same_v<T, float> && std::is_same_v<Fin, rops::SumF>;
#else
    true;
#endif

struct RingOf {
  template <class T, class Fin> RingLaunch run() {
    if constexpr (kBuilt<T, Fin>) return &launch_ring<T, Fin>;
    else return nullptr;
  }
  RingLaunch none() { return nullptr; }
};

// The kernel each (dtype, op) pair launches, through the same dispatch as RingOf.
struct RingKernelOf {
  template <class T, class Fin> const void* run() {
    if constexpr (kBuilt<T, Fin>) return reinterpret_cast<const void*>(&ring_kernel<T, Fin>);
    else return nullptr;
  }
  const void* none() { return nullptr; }
};

}  // namespace

void ring_cuda(const dev::RingArgs& a, DType dt, ReduceOp op, cudaStream_t stream) {
  // all_gather and broadcast combine nothing: any supported pair of the dtype moves its bytes (MAX:
  // every dtype).
  const bool moves = a.coll == dev::Coll::kAllGather || a.coll == dev::Coll::kBroadcast;
  const ReduceOp eff = moves ? ReduceOp::kMax : op;
  RingOf v;
  const RingLaunch f = rops::dispatch_reduce(dt, eff, v);
  if (!f) RC_THROW(Unsupported, "ringcomm: reduce op " << op_name(op) << " is not supported for dtype " << dtype_name(dt));
  RC_CHECK(a.world >= 2 && a.nlanes >= 1 && a.nlanes <= dev::kMaxLanes && a.nslots >= 2 && a.slot_bytes >= 16 &&
               a.slot_stride >= dev::kSlotHeaderBytes + a.slot_bytes + 16 && a.slot_stride % 64 == 0 &&
               a.dtype == static_cast<uint32_t>(dt) && (moves || a.op == static_cast<uint32_t>(op)) &&
               ((a.coll != dev::Coll::kBroadcast && a.coll != dev::Coll::kReduce) || (a.root >= 0 && a.root < a.world)),
           InvalidArgument,
           "ringcomm: ring kernel arguments out of range (world " << a.world << ", lanes " << a.nlanes << ", slots "
                                                                  << a.nslots << ", slot bytes " << a.slot_bytes
                                                                  << ", root " << a.root << ")");
  f(a, stream);
  RC_CUDA(cudaGetLastError(), " launching the " << dtype_name(dt) << " " << op_name(op) << " ring kernel");
}

const std::vector<const void*>& ring_kernels() {
  static const std::vector<const void*> all = [] {
    std::vector<const void*> v;
    for (uint32_t d = 0; d < static_cast<uint32_t>(DType::kCount); ++d) {
      for (uint32_t o = 0; o < static_cast<uint32_t>(ReduceOp::kCount); ++o) {
        RingKernelOf k;
        const void* f = rops::dispatch_reduce(static_cast<DType>(d), static_cast<ReduceOp>(o), k);
        if (f != nullptr && std::find(v.begin(), v.end(), f) == v.end()) v.push_back(f);
      }
    }
    return v;
  }();
  return all;
}

}  // namespace rc
