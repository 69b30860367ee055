// The device ring: its signalling protocol and the body of the fused ring kernel, as ONE header
// that nvcc compiles for the GPU (device/ring_kernel.cu) and a host C++ compiler compiles for the
// host harness (tests/device_proof/host_harness.cpp), where blocks are threads (or coroutines under
// a deterministic scheduler) and ranks are threads or processes over shared pages. The host does
// not run a model of this code: it runs this code. What differs is confined to the platform P
// (DevicePlatform below; the harness's HostPlatform): thread index, block barrier, clock, back-off,
// and a hook called before every shared access, where the host scheduler may switch.
//
// Signals. Lane l (one block per lane) of the ring carries pieces j = l, l + nlanes, ... of the
// host's schedule: the ring (algo/ring.cpp) for all_reduce, reduce_scatter and all_gather, the
// pipelined chain along the ring (algo/chain.cpp) for broadcast and reduce, whose link into the
// chain's head carries nothing. For the link left -> this rank and lane l:
//  - head: this rank's page, head[l]; written only by the left neighbour (the sender): the number
//    of pieces it has put into this rank's slots on lane l.
//  - tail: the left neighbour's page, tail[l]; written only by this rank (the receiver): the number
//    of pieces it has consumed from its slots on lane l.
// Both are 64-bit, only increase and are never reset (not between calls either): a value seen is
// never taken back, so a fast side cannot erase what a slow side has yet to read. Each side polls
// only the words in its own page. A store is a release at system scope, made after the block's
// data writes (block barrier, then a system-scope fence, then the store); a poll is an acquire
// load at system scope, inside its spin loop (tests/test_device_sass.py checks the SASS).
// The values a lane expects (its pieces sent and received, and the collective's sequence) live in
// LaneState, in device memory, and only the kernel advances them: a captured call replayed from a
// CUDA graph expects the right values without the host.
//
// Slots. Piece number i of lane l goes to slot i % nslots of that lane in the receiver's memory.
// The sender may write slot i only once tail >= i + 1 - nslots (its previous occupant consumed),
// the receiver may read it only once head >= i + 1. Each slot starts with a SlotHeader {sequence,
// index, bytes, and the call: collective, dtype, op, root, count} that the receiver checks against
// what it expects: a lost piece, a piece overwritten before it was read, a stale slot or a
// mismatched call all show as a mismatch (Status::field names the first field that differs). A
// mismatched call is caught by the first piece a rank receives in it; a call in which no rank
// receives anything (every rank its own broadcast root, or every rank the head of its reduce
// chain) leaves pieces in the slots that the next call on that lane reports as stale.
//
// Waits. Only thread 0 of a block polls; the result reaches the block through P::all. A wait spins
// with back-off (__nanosleep on the GPU); every kCheckEvery spins it checks the host-mapped abort
// word, its own rank's status record (another lane failed) and a deadline (%globaltimer on the GPU)
// of the wait's start plus the communicator's timeout. On expiry, abort, a mismatch or an
// impossible word value, the lane writes {rank, step, peer, expected, seen, reason} into the
// rank's status record (the first failure wins) and returns; the kernel exits. It never traps.
//
// Deadlock freedom: per lane, the sequence of sends and receives is the host ring's
// (algo/ring.cpp), whose argument holds for >= 2 slots, or the host chain's (algo/chain.cpp),
// which has no cycle; lanes share no slots or words.
//
// Broken variants (Broken, a template argument; production code instantiates kNone only) exist so
// that the tests can show that their checks catch each defect (tests/test_device_proof.py).
#pragma once
#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "algo/ring_schedule.h"
#include "kernels/reduce_ops.h"

namespace rc {
namespace dev {

constexpr int kMaxLanes = 32;
/// Spins between two checks of the deadline and the abort word.
constexpr uint32_t kCheckEvery = 64;
/// Bytes before a slot's payload (the header, padded); the payload then starts at the residue mod
/// 16 of the piece's byte offset in the user's buffer, so that 16-byte vectors line up.
constexpr uint64_t kSlotHeaderBytes = 64;

/// Bytes between two slots of the region (header, payload, 16 bytes of alignment slack; whole lines).
RC_HD uint64_t ring_slot_stride(uint64_t slot_bytes) { return (kSlotHeaderBytes + slot_bytes + 16 + 63) / 64 * 64; }

enum class Coll : uint32_t { kAllReduce = 1, kReduceScatter = 2, kAllGather = 3, kBroadcast = 4, kReduce = 5 };
enum class Reason : uint32_t { kNone = 0, kTimeout = 1, kAbort = 2, kMismatch = 3, kCorrupt = 4 };
/// The defects the tests must catch: the flag published before the data, the words reset at the
/// end of a call, a slot released before it is read, the flag's load hoisted out of its spin.
enum class Broken : int { kNone = 0, kFlagBeforeData = 1, kWordReset = 2, kEarlyFree = 3, kHoistedLoad = 4 };
/// What the host scheduler's hook is told before a shared access.
enum class Access : int { kLoad = 0, kStore = 1, kData = 2, kSpin = 3 };
/// The slot header's field that differed (Status::field of a kMismatch).
enum class Field : uint32_t { kNone = 0, kSeq = 1, kIndex = 2, kColl = 3, kDtype = 4, kOp = 5, kRoot = 6, kCount = 7,
                              kBytes = 8 };
/// The header's op of a collective that combines nothing, and its root of one without a root.
constexpr uint32_t kNoOp = 0xffffffffu;
constexpr uint32_t kNoRoot = 0xffffffffu;

struct alignas(64) Word {  // one per cache line: words of different writers never share a line
  uint64_t v;
};

/// A rank's signal page (IPC memory on the GPU; a shared page on the host).
struct SignalPage {
  Word head[kMaxLanes];  ///< head[l]: written only by the left neighbour
  Word tail[kMaxLanes];  ///< tail[l]: written only by the right neighbour
};

/// What a slot carries before its payload; the receiver checks every field.
struct SlotHeader {
  uint64_t seq;    ///< the collective's sequence on the sending lane
  uint64_t index;  ///< the piece's number on the lane (pieces sent before it, ever)
  uint64_t bytes;  ///< payload bytes
  uint64_t count;  ///< the call's RingArgs::count
  uint32_t coll;   ///< Coll
  uint32_t dtype;  ///< the call's dtype code (ringcomm/abi.h)
  uint32_t op;     ///< the call's op code; kNoOp for all_gather and broadcast
  uint32_t root;   ///< broadcast, reduce: the root; else kNoRoot
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes, "the slot header outgrew its room");

/// A lane's expected values; device memory of its own rank, advanced only by the kernel.
struct LaneState {
  uint64_t seq;    ///< collectives this lane has run
  uint64_t sent;   ///< pieces this lane has sent (= the head value it last wrote)
  uint64_t recvd;  ///< pieces this lane has received (= the tail value it last wrote)
};

/// A rank's status record (host-mapped). `claim` goes 0 -> 1 once, by the first failing lane,
/// which fills the fields and then release-stores `reason`: a reader that acquires a non-zero
/// reason sees the fields.
struct Status {
  uint32_t claim;
  uint32_t reason;
  int32_t rank, peer, step, lane;
  uint32_t field;  ///< Field: a kMismatch's header field; else kNone
  uint32_t pad;
  uint64_t seq, expected, seen;
};

/// One call of one rank. Element counts are of the collective's dtype.
struct RingArgs {
  Coll coll;
  uint32_t dtype, op;  ///< the call's codes (ringcomm/abi.h), carried in the slot headers
  int rank, world, nlanes, nslots;
  int root;  ///< broadcast, reduce: the root rank; ignored otherwise
  /// all_reduce, reduce_scatter, broadcast, reduce: elements of the buffer(s); all_gather: elements
  /// each rank contributes.
  int64_t count;
  uint64_t slot_bytes;   ///< payload capacity of a slot
  uint64_t slot_stride;  ///< bytes between slots: kSlotHeaderBytes + slot_bytes + 16
  double scale;          ///< AVG: 1 / world (applied at a chunk's last combining step); else 1
  const void* in;  ///< broadcast: unused
  /// may equal `in` (in place) for all_reduce and reduce; all_gather: in may be out + rank's part;
  /// broadcast: the buffer (the root's is sent, the others' are written); reduce: the root's only
  void* out;
  SignalPage* self;   ///< this rank's page: head polled here, tail polled here
  SignalPage* right;  ///< the right neighbour's page: this rank writes its head
  SignalPage* left;   ///< the left neighbour's page: this rank writes its tail
  char* recv_slots;   ///< this rank's slots [lane][slot], written by the left neighbour
  char* send_slots;   ///< the right neighbour's slots, written by this rank
  LaneState* state;   ///< [nlanes], this rank's
  Status* status;     ///< this rank's
  const uint32_t* abort;  ///< host-mapped; non-zero: every wait of this rank ends (Reason::kAbort)
  uint64_t timeout_ns;
};

/// Bytes of a rank's device-ring region: its SignalPage, then its receive slots [lane][slot].
RC_HD uint64_t ring_region_bytes(uint64_t slot_bytes, uint64_t nslots, uint64_t nlanes) {
  return (sizeof(SignalPage) + 4095) / 4096 * 4096 + nlanes * nslots * ring_slot_stride(slot_bytes);
}
/// The slots of a region (after its page).
RC_HD uint64_t ring_slots_offset() { return (sizeof(SignalPage) + 4095) / 4096 * 4096; }

// ---------------- flags at system scope -------------------------------------------------------

using SysU64 = cuda::atomic_ref<uint64_t, cuda::thread_scope_system>;
using SysU32 = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;

template <class P>
RC_HD uint64_t flag_load(Word& w) {
  P::point(Access::kLoad, &w);
  return SysU64(w.v).load(cuda::std::memory_order_acquire);
}

template <class P>
RC_HD void flag_store(Word& w, uint64_t v) {
  P::point(Access::kStore, &w);
  SysU64(w.v).store(v, cuda::std::memory_order_release);
}

template <class P>
RC_HD bool stop_requested(const RingArgs& a) {
  P::point(Access::kLoad, a.abort);
  if (SysU32(*const_cast<uint32_t*>(a.abort)).load(cuda::std::memory_order_acquire) != 0) return true;
  return SysU32(a.status->claim).load(cuda::std::memory_order_relaxed) != 0;
}

/// Records a failure in the rank's status record (only the first one is kept); returns false.
template <class P>
RC_HD bool fail(const RingArgs& a, int lane, Reason why, int step, int peer, uint64_t seq, uint64_t expected,
                uint64_t seen, Field field = Field::kNone) {
  P::point(Access::kStore, a.status);
  uint32_t zero = 0;
  if (SysU32(a.status->claim).compare_exchange_strong(zero, 1u, cuda::std::memory_order_acq_rel)) {
    a.status->rank = a.rank;
    a.status->peer = peer;
    a.status->step = step;
    a.status->lane = lane;
    a.status->field = static_cast<uint32_t>(field);
    a.status->seq = seq;
    a.status->expected = expected;
    a.status->seen = seen;
    SysU32(a.status->reason).store(static_cast<uint32_t>(why), cuda::std::memory_order_release);
  }
  return false;
}

/// Thread 0's wait until w >= want. A value above `most` cannot happen in a correct run (a sender
/// more than nslots ahead, a receiver ahead of the sender): it is reported as kCorrupt.
template <class P, Broken B>
RC_HD bool wait_at_least(const RingArgs& a, int lane, Word& w, uint64_t want, uint64_t most, int step, int peer,
                         uint64_t seq) {
  uint64_t v;
  if constexpr (B == Broken::kHoistedLoad) {
    P::point(Access::kLoad, &w);
    v = *const_cast<volatile uint64_t*>(&w.v) + 0;  // read once, before the spin: the defect
  } else {
    v = flag_load<P>(w);
  }
  if (v < want) {
    const uint64_t deadline = P::now_ns() + a.timeout_ns;
    for (uint32_t spins = 1; v < want; ++spins) {
      P::backoff(spins);
      if (spins % kCheckEvery == 0) {
        if (stop_requested<P>(a)) return fail<P>(a, lane, Reason::kAbort, step, peer, seq, want, v);
        if (P::now_ns() > deadline) return fail<P>(a, lane, Reason::kTimeout, step, peer, seq, want, v);
      }
      if constexpr (B != Broken::kHoistedLoad) v = flag_load<P>(w);
    }
  }
  if (v > most) return fail<P>(a, lane, Reason::kCorrupt, step, peer, seq, most, v);
  return true;
}

// ---------------- block-wide data movement ----------------------------------------------------

/// dst[0, bytes) = src[0, bytes), shared by the block's threads; 16-byte vectors when dst and src
/// share their residue mod 16.
RC_HD void copy_range(char* dst, const char* src, uint64_t bytes, uint64_t tid, uint64_t nth) {
  const uintptr_t rd = reinterpret_cast<uintptr_t>(dst) & 15u;
  if (rd == (reinterpret_cast<uintptr_t>(src) & 15u)) {
    const uint64_t head0 = rd ? 16 - rd : 0;
    const uint64_t head = head0 < bytes ? head0 : bytes;
    for (uint64_t i = tid; i < head; i += nth) dst[i] = src[i];
    const uint64_t nv = (bytes - head) / 16;
    const uint4* sv = reinterpret_cast<const uint4*>(src + head);
    uint4* dv = reinterpret_cast<uint4*>(dst + head);
    for (uint64_t i = tid; i < nv; i += nth) dv[i] = sv[i];
    for (uint64_t i = head + nv * 16 + tid; i < bytes; i += nth) dst[i] = src[i];
  } else {
    for (uint64_t i = tid; i < bytes; i += nth) dst[i] = src[i];
  }
}

// ---------------- one lane of the ring ---------------------------------------------------------

/// One lane of one rank's call. T, Fin: the element type and the functor of (dtype, op) from
/// rops::dispatch_reduce; Step: the functor of the intermediate steps (rops::StepOf<Fin>).
template <class P, Broken B, class T, class Fin, class Step>
class RingLane {
 public:
  RC_HD RingLane(const RingArgs& a, int lane)
      : a_(a), lane_(lane), n_(a.world), r_(a.rank), tid_(P::tid()), nth_(P::nth()), fin_(a.scale), step_op_(1.0) {
    LaneState& s = a.state[lane];
    seq_ = s.seq + 1;
    sent_ = s.sent;
    recvd_ = s.recvd;
    pe_ = static_cast<int64_t>(a.slot_bytes / sizeof(T));
    if (pe_ < 1) pe_ = 1;
  }

  /// Runs the lane's pieces; false when it stopped on a failure (recorded in the status).
  RC_HD bool run() {
    bool ok = true;
    const int64_t cnt = a_.count;
    switch (a_.coll) {
      case Coll::kAllReduce: {
        const int64_t npieces = (max_chunk(true) + pe_ - 1) / pe_;
        for (int64_t j = lane_; ok && j < npieces; j += a_.nlanes) {
          ok = rs_piece(j, true, 2 * (n_ - 1)) && ag_piece(j, n_ - 1, 2 * (n_ - 1));
        }
        break;
      }
      case Coll::kReduceScatter: {
        const int64_t npieces = (max_chunk(false) + pe_ - 1) / pe_;
        for (int64_t j = lane_; ok && j < npieces; j += a_.nlanes) ok = rs_piece(j, false, n_ - 1);
        break;
      }
      case Coll::kAllGather: {
        const int64_t npieces = (cnt + pe_ - 1) / pe_;
        const T* in = static_cast<const T*>(a_.in);
        T* own = static_cast<T*>(a_.out) + r_ * cnt;
        for (int64_t j = lane_; ok && j < npieces; j += a_.nlanes) {
          int64_t o, m;
          bounds(0, cnt, j, &o, &m);
          if (own != in) copy_range(reinterpret_cast<char*>(own + o), reinterpret_cast<const char*>(in + o),
                                    static_cast<uint64_t>(m) * sizeof(T), tid_, nth_);
          ok = send_copy(in + o, r_ * cnt + o, m, 0) && ag_piece(j, 0, n_ - 1);
        }
        break;
      }
      case Coll::kBroadcast:
      case Coll::kReduce: {
        const int64_t npieces = (cnt + pe_ - 1) / pe_;
        for (int64_t j = lane_; ok && j < npieces; j += a_.nlanes) ok = chain_piece(j);
        break;
      }
    }
    P::sync();
    if (tid_ == 0) {
      LaneState& s = a_.state[lane_];
      if constexpr (B == Broken::kWordReset) {  // the defect: "clean" words for the next call
        flag_store<P>(a_.right->head[lane_], 0);
        flag_store<P>(a_.left->tail[lane_], 0);
        sent_ = recvd_ = 0;
      }
      s.seq = seq_;
      s.sent = sent_;
      s.recvd = recvd_;
    }
    return ok;
  }

 private:
  // Chunk k of the collective's split (all_reduce: ring::ar_chunk_*; else the balanced split).
  RC_HD int64_t chunk_off(int k, bool ar) const {
    return ar ? ring::ar_chunk_offset(a_.count, n_, sizeof(T), k) : ring::chunk_offset(a_.count, n_, k);
  }
  RC_HD int64_t chunk_cnt(int k, bool ar) const {
    return ar ? ring::ar_chunk_count(a_.count, n_, sizeof(T), k) : ring::chunk_count(a_.count, n_, k);
  }
  RC_HD int64_t max_chunk(bool ar) const {
    int64_t mx = 0;
    for (int k = 0; k < n_; ++k) mx = chunk_cnt(k, ar) > mx ? chunk_cnt(k, ar) : mx;
    return mx;
  }
  // Piece j of a chunk [off, off + cnt): its offset and size (algo/pieces.h's piece_bounds).
  RC_HD void bounds(int64_t off, int64_t cnt, int64_t j, int64_t* o, int64_t* m) const {
    const int64_t start = j * pe_;
    *o = off + start;
    const int64_t left = cnt - start;
    *m = left <= 0 ? 0 : (left < pe_ ? left : pe_);
  }
  RC_HD char* slot(char* base, uint64_t index) const {
    return base + (static_cast<uint64_t>(lane_) * a_.nslots + index % a_.nslots) * a_.slot_stride;
  }
  // The payload of the piece at element offset o of the full buffer: at the residue of its bytes.
  RC_HD static char* payload(char* s, int64_t o) {
    return s + kSlotHeaderBytes + ((static_cast<uint64_t>(o) * sizeof(T)) & 15u);
  }

  // The call's identity as the slot headers carry it (the same on every rank of a matching call).
  RC_HD bool rooted() const { return a_.coll == Coll::kBroadcast || a_.coll == Coll::kReduce; }
  RC_HD uint32_t call_op() const {
    return a_.coll == Coll::kAllGather || a_.coll == Coll::kBroadcast ? kNoOp : a_.op;
  }
  RC_HD uint32_t call_root() const { return rooted() ? static_cast<uint32_t>(a_.root) : kNoRoot; }

  // ---- sending: claim the slot, fill it, publish it ----
  RC_HD char* send_begin(int step) {
    bool ok = true;
    if (tid_ == 0) {
      const uint64_t want = sent_ + 1 > static_cast<uint64_t>(a_.nslots) ? sent_ + 1 - a_.nslots : 0;
      ok = wait_at_least<P, B>(a_, lane_, a_.self->tail[lane_], want, sent_, step, ring::right(r_, n_), seq_);
    }
    return P::all(ok) ? slot(a_.send_slots, sent_) : nullptr;
  }
  RC_HD void send_header(char* s, uint64_t index, int64_t m) {
    if (tid_ != 0) return;
    P::point(Access::kData, s);
    SlotHeader* h = reinterpret_cast<SlotHeader*>(s);
    h->seq = seq_;
    h->index = index;
    h->bytes = static_cast<uint64_t>(m) * sizeof(T);
    h->count = static_cast<uint64_t>(a_.count);
    h->coll = static_cast<uint32_t>(a_.coll);
    h->dtype = a_.dtype;
    h->op = call_op();
    h->root = call_root();
  }
  // Data, then (block barrier, system fence) the head: the receiver that acquires it sees the data.
  RC_HD void publish() {
    P::sync();
    ++sent_;
    if (tid_ == 0) {
      cuda::atomic_thread_fence(cuda::std::memory_order_release, cuda::thread_scope_system);
      flag_store<P>(a_.right->head[lane_], sent_);
    }
  }
  // The next slot to the right = src (b == nullptr) or src (step op) b, over m elements at element
  // offset o of the full buffer; published. Nothing for m == 0.
  RC_HD bool send_piece(const T* src, const T* b, int64_t o, int64_t m, int step) {
    if (m == 0) return true;
    char* s = send_begin(step);
    if (!s) return false;
    const uint64_t index = sent_;
    if constexpr (B == Broken::kFlagBeforeData) publish();
    send_header(s, index, m);
    P::point(Access::kData, s + kSlotHeaderBytes);
    char* dst = payload(s, o);
    if (b == nullptr) {
      copy_range(dst, reinterpret_cast<const char*>(src), static_cast<uint64_t>(m) * sizeof(T), tid_, nth_);
    } else {
      rops::reduce_range(reinterpret_cast<T*>(dst), src, b, static_cast<size_t>(m), step_op_, tid_, nth_);
    }
    if constexpr (B != Broken::kFlagBeforeData) publish();
    return true;
  }
  RC_HD bool send_copy(const T* src, int64_t o, int64_t m, int step) { return send_piece(src, nullptr, o, m, step); }
  RC_HD bool send_reduced(const T* a, const T* b, int64_t o, int64_t m, int step) { return send_piece(a, b, o, m, step); }

  // ---- receiving: wait for the piece, check its header, read it, release the slot ----
  RC_HD const T* recv_begin(int64_t o, int64_t m, int step) {
    bool ok = true;
    const int peer = ring::left(r_, n_);
    if (tid_ == 0) {
      ok = wait_at_least<P, B>(a_, lane_, a_.self->head[lane_], recvd_ + 1, recvd_ + a_.nslots, step, peer, seq_);
      if (ok) {
        const SlotHeader* h = reinterpret_cast<const SlotHeader*>(slot(a_.recv_slots, recvd_));
        P::point(Access::kData, h);
        // The call's fields before bytes: a mismatched call is named by what differs, not by a size.
        const uint64_t want[] = {seq_,
                                 recvd_,
                                 static_cast<uint64_t>(a_.coll),
                                 a_.dtype,
                                 call_op(),
                                 call_root(),
                                 static_cast<uint64_t>(a_.count),
                                 static_cast<uint64_t>(m) * sizeof(T)};
        const uint64_t seen[] = {h->seq, h->index, h->coll, h->dtype, h->op, h->root, h->count, h->bytes};
        for (int f = 0; ok && f < 8; ++f) {
          if (seen[f] != want[f])
            ok = fail<P>(a_, lane_, Reason::kMismatch, step, peer, seq_, want[f], seen[f], static_cast<Field>(f + 1));
        }
      }
    }
    if (!P::all(ok)) return nullptr;
    char* s = slot(a_.recv_slots, recvd_);
    if constexpr (B == Broken::kEarlyFree) release();
    P::point(Access::kData, s + kSlotHeaderBytes);
    return reinterpret_cast<const T*>(payload(s, o));
  }
  // After every thread's last read of the slot (block barrier): the tail, so the sender may reuse it.
  RC_HD void release() {
    P::sync();
    ++recvd_;
    if (tid_ == 0) flag_store<P>(a_.left->tail[lane_], recvd_);
  }
  RC_HD void recv_done() {
    if constexpr (B != Broken::kEarlyFree) release();
  }

  // ---- the host ring's phases (algo/ring.cpp: rs_piece, ag_piece_recv), piece j ----
  RC_HD bool rs_piece(int64_t j, bool ar, int total_steps) {
    const T* in = static_cast<const T*>(a_.in);
    T* out = static_cast<T*>(a_.out);
    int64_t o, m;
    const int k0 = ring::rs_send(r_, 0, n_);
    bounds(chunk_off(k0, ar), chunk_cnt(k0, ar), j, &o, &m);
    if (!send_copy(in + o, o, m, 0)) return false;
    const int64_t own_off = ar ? 0 : chunk_off(r_, false);
    for (int s = 0; s < n_ - 1; ++s) {
      const int k = ring::rs_recv(r_, s, n_);
      bounds(chunk_off(k, ar), chunk_cnt(k, ar), j, &o, &m);
      if (m == 0) continue;
      const T* src = recv_begin(o, m, s);
      if (!src) return false;
      if (s < n_ - 2) {
        if (!send_reduced(in + o, src, o, m, s)) return false;
      } else {
        T* dst = out + (o - own_off);
        rops::reduce_range(dst, in + o, src, static_cast<size_t>(m), fin_, tid_, nth_);
        if (ar) {
          P::sync();  // dst complete before the block reads it back to send it
          if (!send_copy(dst, o, m, n_ - 1)) return false;
        }
      }
      recv_done();
    }
    (void)total_steps;
    return true;
  }
  // All-gather steps 0..n-2 receiving, forwarding from the slot first (the next link starts sooner).
  RC_HD bool ag_piece(int64_t j, int step_base, int total_steps) {
    T* out = static_cast<T*>(a_.out);
    const bool ar = a_.coll == Coll::kAllReduce;
    for (int s = 0; s < n_ - 1; ++s) {
      const int k = ring::ag_recv(r_, s, n_);
      int64_t o, m;
      if (ar) bounds(chunk_off(k, true), chunk_cnt(k, true), j, &o, &m);
      else bounds(static_cast<int64_t>(k) * a_.count, a_.count, j, &o, &m);
      if (m == 0) continue;
      const T* src = recv_begin(o, m, step_base + s);
      if (!src) return false;
      if (s < n_ - 2 && !send_copy(src, o, m, step_base + s)) return false;
      copy_range(reinterpret_cast<char*>(out + o), reinterpret_cast<const char*>(src),
                 static_cast<uint64_t>(m) * sizeof(T), tid_, nth_);
      recv_done();
    }
    (void)total_steps;
    return true;
  }

  // The host chain's piece j (algo/chain.cpp): broadcast flows root -> root+1 -> ... -> root-1, the
  // buffer being `out`; reduce flows root+1 -> ... -> root, each rank combining its input into the
  // passing piece (in (op) incoming), the root's last combine into `out`. Step: the chain position.
  RC_HD bool chain_piece(int64_t j) {
    const bool bc = a_.coll == Coll::kBroadcast;
    const int pos = static_cast<int>(ring::mod(bc ? r_ - a_.root : r_ - a_.root - 1, n_));
    const T* in = static_cast<const T*>(bc ? a_.out : a_.in);
    int64_t o, m;
    bounds(0, a_.count, j, &o, &m);
    if (pos == 0) return send_copy(in + o, o, m, 0);
    const T* src = recv_begin(o, m, pos);
    if (!src) return false;
    if (bc) {
      // Forwarded from the slot first (the next link starts sooner), as ag_piece.
      if (pos < n_ - 1 && !send_copy(src, o, m, pos)) return false;
      copy_range(reinterpret_cast<char*>(static_cast<T*>(a_.out) + o), reinterpret_cast<const char*>(src),
                 static_cast<uint64_t>(m) * sizeof(T), tid_, nth_);
    } else if (pos < n_ - 1) {
      if (!send_reduced(in + o, src, o, m, pos)) return false;
    } else {
      rops::reduce_range(static_cast<T*>(a_.out) + o, in + o, src, static_cast<size_t>(m), fin_, tid_, nth_);
    }
    recv_done();
    return true;
  }

  const RingArgs& a_;
  const int lane_, n_, r_;
  const uint64_t tid_, nth_;
  const Fin fin_;
  const Step step_op_;
  uint64_t seq_, sent_, recvd_;
  int64_t pe_;
};

template <class P, Broken B, class T, class Fin>
RC_HD bool ring_lane(const RingArgs& a, int lane) {
  RingLane<P, B, T, Fin, typename rops::StepOf<Fin>::type> l(a, lane);
  return l.run();
}

// ---------------- the GPU's platform -----------------------------------------------------------
#if defined(__CUDACC__)
struct DevicePlatform {
  __device__ static uint64_t tid() { return threadIdx.x; }
  __device__ static uint64_t nth() { return blockDim.x; }
  __device__ static void sync() { __syncthreads(); }
  /// Thread 0's `v`, for every thread of the block.
  __device__ static bool all(bool v) {
    __shared__ int s;
    if (threadIdx.x == 0) s = v ? 1 : 0;
    __syncthreads();
    const bool r = s != 0;
    __syncthreads();
    return r;
  }
  __device__ static uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ static void backoff(uint32_t spins) { __nanosleep(spins < 32 ? 64 : 1024); }
  __device__ static void point(Access, const void*) {}
};
#endif

}  // namespace dev
}  // namespace rc
