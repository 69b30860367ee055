// Single-copy reads between the ranks' processes (Linux cross-memory attach, process_vm_readv):
// a receiver copies a peer's bytes straight from the peer's own buffer into its own, one copy
// instead of the slots' two (into the sender's slot, out of it).
//
// Availability (decided at attach, alike on every rank): each rank's segment header carries a
// probe word and its owner's address of it (written before `magic`). With the protocol enabled
// (ShmConfig::cma), every rank reads every peer's probe word with process_vm_readv while mapping
// it, and writes the value back unchanged with process_vm_writev (probe()), stores its verdict in its own `cma_ok` (1: it read every peer's word and found the
// value the segment shows; 2: it could not, or the protocol is off here), and after every peer
// attached waits (bounded) until every peer stored one (agree()). The protocol is ready iff every
// verdict is 1, which every rank computes from the same words. Reasons a read fails: another uid,
// Yama's ptrace_scope (1 allows only a ptracer the target named: create() names any when scope is
// 1 and the protocol is enabled, prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY); 2 and 3 forbid it), a
// container's seccomp profile (EPERM / ENOSYS), another PID namespace (the pid in the header is
// not the reader's name for the owner: such peers are not probed).
//
// A collective (algo/cma.cpp): before posting its header, a rank stores the address of the buffer
// its peers read (publish(): cma_buf, ordered before the header by the board word's release);
// after reading the header, a reader loads it (peer_buf()) and reads with read(). The buffer must
// stay valid and unchanged until every reader is done (and, where a peer writes into it with
// write(), hold nothing this rank reads before that peer is done): finish() bumps this rank's `cma_done`
// counter (its reads of this call are over) and waits until every reader's counter reached this
// rank's count of such calls. Every rank runs the same single-copy calls (the selection travels
// in the header), so the counts pair up; a rank stores the next call's address only after
// finish() returned, when no reader still uses the previous one.
//
// Errors: a failed read first checks the peers (an aborted or dead peer raises its error, a
// PeerFailure), else raises PeerFailure with errno's words; finish()'s wait has the transport's
// deadline and liveness checks, as every wait.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/shm_config.h"
#include "transport/shm_liveness.h"
#include "transport/shm_segments.h"
#include "transport/shm_types.h"
#include "transport/shm_wait.h"

namespace rc {

class ShmCma {
 public:
  ShmCma(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, const ShmLiveness& live, ShmWaits& waits)
      : rank_(rank), world_(world), cfg_(cfg), segs_(segs), live_(live), waits_(waits) {}

  /// After create(): this rank's probe word (and, under Yama ptrace_scope 1 with the protocol
  /// enabled, any process of this uid may read this one).
  void on_created();
  /// While mapping peer `p` (before reporting the attachment): read its probe word.
  void probe(int p);
  /// After mapping every peer: store this rank's verdict.
  void post_verdict();
  /// After every peer attached: wait for every peer's verdict and decide (alike on every rank).
  void agree();
  /// Every rank may read every peer's memory (agree() decided so).
  bool ready() const { return ready_; }
  /// The decision in words, for the INFO line.
  const std::string& describe() const { return why_; }

  /// The buffer peers read in this rank's next collective (before its header is posted).
  void publish(const void* buf);
  /// `peer`'s published buffer address (after its header for the call was read).
  uint64_t peer_buf(int peer) const;
  /// This rank's own block from `src` into its output `dst` (local memory): streaming stores from
  /// RINGCOMM_LOCAL_STREAM_MIN_BYTES (fenced before return, so a later release store orders after
  /// them), else memcpy.
  void copy_own(void* dst, const void* src, size_t bytes) const;
  /// `bytes` from `peer`'s memory at its address `remote` into `dst`.
  void read(int peer, uint64_t remote, void* dst, size_t bytes, const WaitCtx& w) const;
  /// `bytes` from `src` into `peer`'s memory at its address `remote` (process_vm_writev: the
  /// same permission as a read); the peer waits for this rank's finish() before using them.
  void write(int peer, uint64_t remote, const void* src, size_t bytes, const WaitCtx& w) const;
  /// This rank's reads and writes of the current call are done; wait until every rank `r` with
  /// reads_me(r) (it reads this rank's buffer or writes into it) finished its own.
  template <class ReadsMe>
  void finish(const WaitCtx& w, ReadsMe reads_me);

 private:
  void move(int peer, uint64_t remote, void* local, size_t bytes, bool write, const WaitCtx& w) const;
  void finish_mine();
  void wait_reader(int peer, const WaitCtx& w);
  int rank_;
  int world_;
  const ShmConfig& cfg_;
  const ShmSegments& segs_;
  const ShmLiveness& live_;
  ShmWaits& waits_;
  bool probed_ok_ = true;
  bool ready_ = false;
  std::string why_ = "single-copy reads off";
  uint32_t calls_ = 0;  // single-copy calls finished (this rank's own cma_done)
};

template <class ReadsMe>
void ShmCma::finish(const WaitCtx& w, ReadsMe reads_me) {
  finish_mine();
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && reads_me(p)) wait_reader(p, w);
}

}  // namespace rc
