// ShmCma (transport/shm_cma.h): the probe, the agreement, the reads and the completion counter.
#include "transport/shm_cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "kernels/copy_cpu.h"
#include "transport/shm_layout.h"
#ifdef RINGCOMM_TEST_HOOKS
#include "common/test_knobs.h"
#endif

namespace rc {

using namespace shm_detail;

namespace {

// Yama's ptrace_scope (-1: no Yama).
int yama_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int v = -1;
  if (!(f >> v)) return -1;
  return v;
}

// One process_vm_readv (or, `write`, process_vm_writev) of up to `bytes`; returns the bytes moved
// or -1 with errno set.
ssize_t move_once(int pid, uint64_t remote, void* local_buf, size_t bytes, bool write = false) {
#ifdef RINGCOMM_TEST_HOOKS
  if (TestKnobs::read().test_cma_deny != 0) {
    errno = EPERM;
    return -1;
  }
#endif
  struct iovec local = {local_buf, bytes};
  struct iovec far = {reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
  return write ? process_vm_writev(pid, &local, 1, &far, 1, 0) : process_vm_readv(pid, &local, 1, &far, 1, 0);
}

}  // namespace

void ShmCma::on_created() {
  // The probe word itself is written by ShmSegments::create, before `magic`.
  if (cfg_.cma && world_ > 1 && yama_scope() == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

void ShmCma::probe(int p) {
  if (!cfg_.cma || !probed_ok_) return;
  std::ostringstream o;
  if (!live_.same_pid_namespace_as(p)) {
    o << "single-copy reads off: rank " << p << " runs in another PID namespace";
    probed_ok_ = false;
    why_ = o.str();
    return;
  }
  const SegmentHeader* h = segs_.header(p);
  uint64_t got = 0;
  const ssize_t n = move_once(h->pid, h->cma_probe_addr, &got, sizeof(got));
  ssize_t wn = -1;
  // The root of a broadcast writes into its peers' buffers (process_vm_writev): the same value
  // written back proves that too.
  if (n == static_cast<ssize_t>(sizeof(got)) && got == h->cma_probe) {
    wn = move_once(h->pid, h->cma_probe_addr, &got, sizeof(got), true);
    if (wn == static_cast<ssize_t>(sizeof(got))) return;
  }
  const int err = errno;
  o << "single-copy reads off: rank " << rank_ << " cannot read or write rank " << p
    << "'s memory with process_vm_readv / process_vm_writev (";
  if (n < 0 || (n == static_cast<ssize_t>(sizeof(got)) && got == h->cma_probe && wn < 0)) {
    o << std::strerror(err);
    if (err == EPERM) {
      const int scope = yama_scope();
      o << "; Yama ptrace_scope " << scope;
      if (scope >= 2) o << " forbids it";
      o << "; a container may forbid it too";
    }
  } else {
    o << "read " << n << " bytes, value " << (got == h->cma_probe ? "right" : "wrong");
  }
  o << ")";
  probed_ok_ = false;
  why_ = o.str();
}

void ShmCma::post_verdict() {
  SegmentHeader* own = segs_.header(rank_);
  const uint32_t v = cfg_.cma && probed_ok_ && world_ > 1 ? 1u : 2u;
  own->cma_ok.v.store(v, std::memory_order_seq_cst);
  if (own->cma_ok.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&own->cma_ok.v);
}

void ShmCma::agree() {
  if (!cfg_.cma || world_ <= 1) return;  // nothing to wait for: this rank reads nobody
  bool all = probed_ok_;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    SegmentHeader* h = segs_.header(p);
    WaitCtx w;
    w.op = "init";
    w.peer = p;
    w.what = "the peer's single-copy verdict";
    waits_.until(&h->cma_ok.v, &h->cma_ok.waiters, [&] { return h->cma_ok.v.load(std::memory_order_acquire) != 0; }, w);
    if (h->cma_ok.v.load(std::memory_order_acquire) != 1 && all) {
      all = false;
      if (probed_ok_) why_ = "single-copy reads off: rank " + std::to_string(p) + " cannot read every peer's memory (or has them off)";
    }
  }
  ready_ = all;
  if (ready_) why_ = "single-copy reads (process_vm_readv) between every pair of ranks";
}

void ShmCma::publish(const void* buf) {
  segs_.header(rank_)->cma_buf.store(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buf)), std::memory_order_release);
}

uint64_t ShmCma::peer_buf(int peer) const { return segs_.header(peer)->cma_buf.load(std::memory_order_acquire); }

void ShmCma::copy_own(void* dst, const void* src, size_t bytes) const {
  const bool stream = cfg_.local_stream_min_bytes > 0 && bytes >= cfg_.local_stream_min_bytes;
  copy_to_peer(dst, src, bytes, stream);
}

void ShmCma::read(int peer, uint64_t remote, void* dst, size_t bytes, const WaitCtx& w) const {
  move(peer, remote, dst, bytes, false, w);
}

void ShmCma::write(int peer, uint64_t remote, const void* src, size_t bytes, const WaitCtx& w) const {
  move(peer, remote, const_cast<void*>(src), bytes, true, w);
}

void ShmCma::move(int peer, uint64_t remote, void* local, size_t bytes, bool write, const WaitCtx& w) const {
  const int pid = segs_.header(peer)->pid;
  char* d = static_cast<char*>(local);
  while (bytes > 0) {
    const ssize_t n = move_once(pid, remote, d, bytes, write);
    if (n <= 0) {
      const int err = n < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      live_.check_peers(w, true);  // an aborted or dead peer raises its own error
      RC_THROW(PeerFailure, "ringcomm: " << w.op << " (seq " << w.seq << ") on rank " << rank_
                                         << ": " << (write ? "process_vm_writev" : "process_vm_readv") << " of " << bytes << " bytes from rank " << peer
                                         << " (pid " << pid << ") failed: " << std::strerror(err));
    }
    d += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void ShmCma::finish_mine() {
#ifdef RINGCOMM_TEST_HOOKS
  if (TestKnobs::read().test_cma_exit != 0) _exit(3);
#endif
  ++calls_;
  Word& done = segs_.header(rank_)->cma_done;
  publish_add(&done.v, &done.waiters, 1);
}

void ShmCma::wait_reader(int peer, const WaitCtx& w0) {
  WaitCtx w = w0;
  w.peer = peer;
  w.what = "the peer's single-copy reads of this rank's buffer";
  Word& done = segs_.header(peer)->cma_done;
  const uint32_t want = calls_;
  waits_.until(&done.v, &done.waiters,
               [&] { return static_cast<int32_t>(done.v.load(std::memory_order_acquire) - want) >= 0; }, w);
}

}  // namespace rc
