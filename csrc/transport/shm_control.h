// The shared-memory transport's control plane: everything but the slots. Its parts, each a class
// with its own header stating who writes which words and with what ordering:
//   ShmSegments  (shm_segments.h)  this rank's segment and the mapped peers': lifetime, agreement
//   ShmLiveness  (shm_liveness.h)  state words, the local interrupt, peer checks and their errors
//   ShmWaits     (shm_wait.h)      every bounded wait: spin, yield, futex sleep, deadline
//   ShmDoorbell  (shm_doorbell.h)  the point-to-point activity counter
//   ShmBoard     (shm_board.h)     the header board and the LL outboxes beside it
//   ShmCma       (shm_cma.h)       single-copy reads of peers' buffers: probe, agreement, completion
// The data plane (the push channels and the outboxes, and the routing between them) is
// ShmTransport (transport/shm.h), which is a control plane with slots: the segments it maps hold
// both. A user of the board, the doorbell, the liveness checks or the timeouts only (the
// communicator core, the header exchange, the LL protocol, the CUDA device) holds a ShmControl&.
// The segment's words: transport/shm_layout.h. The configuration: transport/shm_config.h.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "transport/shm_board.h"
#include "transport/shm_cma.h"
#include "transport/shm_config.h"
#include "transport/shm_doorbell.h"
#include "transport/shm_liveness.h"
#include "transport/shm_segments.h"
#include "transport/shm_types.h"
#include "transport/shm_wait.h"

namespace rc {

class ShmControl {
 public:
  ShmControl(const ShmControl&) = delete;
  ShmControl& operator=(const ShmControl&) = delete;

  /// Step 1 of setup: create this rank's segment; returns its name for the rendezvous.
  std::string create();
  /// Step 2: map every rank's segment (names in rank order), report attachment to each owner,
  /// wait until every peer attached ours, then unlink ours. Bounded by the timeout.
  void attach(const std::vector<std::string>& names);
  /// Mark this rank closed (peers waiting on it get PeerFailure) and unmap everything.
  /// keep_mappings: forget the segments but leave them mapped until exit, so that their
  /// addresses are never mapped again (device copies still in flight may use them through host
  /// registrations: transport/cuda_ipc.cpp, transport/pin_registry.h).
  void close(bool keep_mappings = false);
  /// close()'s first step alone: mark this rank closed (peers waiting on it get PeerFailure; an
  /// aborted rank stays aborted), keeping every mapping and slot usable, for a transport that
  /// still exchanges goodbyes on them before close(). Idempotent.
  void mark_closed() { live_.close(); }
  /// Mark this rank aborted with a reason; peers' waits raise the ErrorCode `kind` (see
  /// abort_kind_of) carrying it.
  void abort(uint32_t kind, const std::string& msg);
  /// Local (this process only): every wait of this transport, on any thread, raises Closed
  /// within one liveness slice from now on, naming what it waited for. Set by the core's close()
  /// before it waits for the calls inside it to leave; the mappings stay until close().
  void set_closing() { live_.set_closing(); }
  /// Local, like set_closing(): every wait raises rc::Error carrying `msg` (comm.abort()).
  void set_aborting(const std::string& msg) { live_.set_aborting(msg); }
  /// The local interrupt (closing or aborting) as the error a wait raises, or null.
  std::exception_ptr interrupt_error(const WaitCtx& w) const { return live_.interrupt_error(w); }
  /// Seconds any single wait may take; set_timeout changes it for waits that start afterwards.
  double timeout_s() const { return waits_.timeout_s(); }
  void set_timeout(double seconds) { waits_.set_timeout(seconds); }
  /// Before attach(): how many local ranks (this one included) run on this process's CPUs, when
  /// the front knows it (it bound the ranks): the wait policy then compares it, not the world
  /// size, with the CPUs (ShmConfig::set_ranks_sharing). < 1: unknown, nothing changes. attach()
  /// sets it again from every rank's affinity mask.
  /// `node_ranks`: the ranks on this node, of every group (0: not known); more of them than the
  /// node's online CPUs means some share CPUs, whatever this communicator's masks say.
  void set_ranks_sharing(int ranks_sharing, int node_ranks = 0);
  /// In a forked child: forget the mappings without writing to any segment (they are the
  /// parent's: its state word, board and channels) and never unlink a name. Idempotent; close()
  /// afterwards does nothing.
  void drop_mappings_after_fork();
  bool closing() const { return live_.closing(); }
  bool aborting() const { return live_.aborting(); }

  int rank() const { return rank_; }
  int world() const { return world_; }
  const ShmConfig& config() const { return cfg_; }
  /// Whether the segments have the outbox layout (transport/shm.h, Layout): then a slot to any
  /// peer but the collective lane's ring successor is one of the sender's outbox slots.
  bool has_outbox() const { return cfg_.outbox; }
  /// One line describing the channel geometry and the footprint (RINGCOMM_DEBUG=INFO).
  std::string describe_geometry() const { return segs_.describe_geometry(); }
  /// The resolved wait policy in words: mode, spin/yield budgets, ranks vs CPUs.
  std::string describe_wait() const { return waits_.describe(); }
  /// Counters of the waits' slow paths since creation (any thread; relaxed reads).
  using WaitStats = ShmWaitStats;
  WaitStats wait_stats() const { return waits_.stats(); }
  /// How each peer's liveness is checked, after attach(): "liveness: rank 1 pid probe (same PID
  /// namespace), rank 2 heartbeat (PID namespace ... differs; dead after N ms still)".
  std::string describe_liveness() const { return live_.describe_liveness(); }

  // ---- header board (transport/shm_board.h) ----
  /// Post this rank's header for collective `seq` (>= 1) on its board (after its LL lines, if any).
  void post_header(uint64_t seq, const HeaderBlob& h) { board_.post(seq, h); }
  /// `peer`'s header for collective `seq`: from line 0 of its LL outbox when it wrote one for
  /// `seq` (*ll = true), else from its board once posted (*ll = false).
  /// fused_from > 0: the wait also ends, with *fused = true, when `peer` ran collective
  /// fused_from (or a later one) without posting this header (mark_fused).
  HeaderBlob wait_header(int peer, uint64_t seq, const WaitCtx& w, bool* ll = nullptr, uint64_t fused_from = 0,
                         bool* fused = nullptr) {
    return board_.wait(peer, seq, w, ll, fused_from, fused);
  }
  /// This rank ran collective `call_seq` without a header exchange (a local store, no wait).
  void mark_fused(uint64_t call_seq) { board_.mark_fused(call_seq); }
  /// Headers this rank has posted so far (relaxed).
  uint64_t headers_posted() const { return board_.posted(); }

  // ---- low-latency outbox region (transport/shm_board.h; its protocol: proto/ll.h) ----
  /// Data bytes an LL outbox carries (ShmConfig::ll_bytes); 0: there is none.
  size_t ll_max_bytes() const { return cfg_.ll_bytes; }
  /// The lines of `owner`'s outbox for collective `seq`: ll_line_count() lines, written only by
  /// `owner`.
  LLLine* ll_outbox(int owner, uint64_t seq) const { return board_.ll_outbox(owner, seq); }
  size_t ll_line_count() const { return board_.line_count(); }
  /// Wait (bounded, checking peers) until `flag` holds `seq` or `peer` has posted its header for
  /// `seq`, whichever comes first.
  void wait_line_or_header(int peer, uint64_t seq, const std::atomic<uint64_t>& flag, const WaitCtx& w) {
    board_.wait_line_or_header(peer, seq, flag, w);
  }

  // ---- single-copy reads (transport/shm_cma.h) ----
  /// The part itself: ready() after attach() when every rank may read every peer's memory.
  ShmCma& cma() { return cma_; }
  const ShmCma& cma() const { return cma_; }

  // ---- p2p doorbell (transport/shm_doorbell.h) ----
  uint32_t doorbell_value() const { return bell_.value(); }
  /// Ring `owner`'s doorbell (also used to wake this rank's own p2p thread).
  void ring_doorbell(int owner) { bell_.ring(owner); }
  /// Sleep until the doorbell differs from `seen` or ns elapse; the caller checks the peers
  /// (check_peers) between sleeps.
  void doorbell_wait(uint32_t seen, int64_t ns) { bell_.wait(seen, ns); }

  /// Throw if a peer aborted or died (used by pollers such as the p2p engine).
  void check_peers(const WaitCtx& w, bool check_liveness) { live_.check_peers(w, check_liveness); }

 protected:
  // Only as a part of a ShmTransport (transport/shm.h): the segments a control plane creates and
  // maps hold the slots too, so the transport that owns them is the one object to create and
  // destroy. Never deleted through a ShmControl* (the destructor is not virtual).
  ShmControl(int rank, int world, ShmConfig cfg);
  ~ShmControl();

  int rank_;
  int world_;
  // The one normalized configuration every part reads (by reference); set_ranks_sharing and
  // attach() change its CPU-sharing fields before any wait of a collective.
  ShmConfig cfg_;
  // The parts, in dependency order (each refers only to those above it).
  ShmSegments segs_;
  ShmLiveness live_;
  ShmWaits waits_;
  ShmDoorbell bell_;
  ShmBoard board_;
  ShmCma cma_;

 private:
  // After mapping every peer: the local ranks whose CPUs meet this rank's (0: not known).
  int ranks_on_own_cpus() const;
  // In a failed attach(): unlink the names of peers that died before unlinking their own, once
  // every other rank has mapped them.
  void unlink_dead_peers(const std::vector<std::string>& names);
  // What the front said (set_ranks_sharing): attach() keeps the larger of it and the masks' count.
  int front_sharing_ = 0;
  int node_ranks_ = 0;
};

}  // namespace rc
