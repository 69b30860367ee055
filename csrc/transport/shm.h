// Host shared-memory transport: processes on one machine exchange bytes through POSIX shared
// memory in fixed-size slots, with flow control by atomic sequence counters. ShmTransport is the
// composition of its parts, each a class with its own header stating who writes which words and
// with what ordering:
//   ShmSegments  (shm_segments.h)  this rank's segment and the mapped peers': lifetime, agreement
//   ShmLiveness  (shm_liveness.h)  state words, the local interrupt, peer checks and their errors
//   ShmWaits     (shm_wait.h)      every bounded wait: spin, yield, futex sleep, deadline
//   ShmDoorbell  (shm_doorbell.h)  the point-to-point activity counter
//   ShmBoard     (shm_board.h)     the header board and the LL outboxes beside it
//   ShmSlots     (shm_slots.h)     the push channels (head/tail flow control)
//   ShmOutbox    (shm_outbox.h)    the outboxes that peers read in place (pull)
// The segment's words: transport/shm_layout.h. The configuration: transport/shm_config.h.
//
// Layout. Every rank owns ONE segment, of a size that does not depend on the world size in the
// outbox layout (the host communicator's from 3 ranks on; see footprint_bytes):
//  - the header page (liveness, doorbell, header board) and the two LL outboxes;
//  - ONE push channel: the collective lane from the ring predecessor (rank-1), which carries
//    every ring and chain hand-off: `nslots` slots of `slot_bytes`. The sender writes into the
//    RECEIVER's segment ("push");
//  - two outboxes, one per lane (collectives, point-to-point), of `far_nslots` slots of
//    `far_slot_bytes` each (RINGCOMM_OUTBOX_SLOTS, RINGCOMM_FAR_SLOT_BYTES): every other message
//    this rank sends (direct exchanges to any peer, point-to-point to any peer, the successor
//    included) is written into its OWN outbox, and its reader copies it out of this segment
//    ("pull").
// So a segment is header + LL + nslots x (slot_bytes + 4 KiB) + 2 x far_nslots x
// (far_slot_bytes + 4 KiB) + control words, the same at 3 ranks as at 128.
// The uniform layout (up to 2 ranks, where the only peer is the ring neighbour on both sides, and
// the CUDA control plane and the simulation, whose ShmConfig asks for no outbox) keeps a push
// channel of `nslots` slots of `slot_bytes` for every lane and source index, the rank's own
// included, and no outbox: its size grows with the world.
//
// Routing: a slot to or from a peer is the push channel's where the pair has one (every pair in
// the uniform layout; the ring predecessor's collective lane in the outbox layout), else the
// sender's outbox. Either way the slots between one sender and one receiver on one lane are
// consumed in the order they were sent.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "transport/shm_board.h"
#include "transport/shm_config.h"
#include "transport/shm_doorbell.h"
#include "transport/shm_liveness.h"
#include "transport/shm_outbox.h"
#include "transport/shm_segments.h"
#include "transport/shm_slots.h"
#include "transport/shm_types.h"
#include "transport/shm_wait.h"

namespace rc {

class ShmTransport {
 public:
  ShmTransport(int rank, int world, ShmConfig cfg);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

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

  // ---- channel, sender side ----
  /// Wait for a free slot in `peer`'s inbox; returns where to write the payload (the channel's
  /// slot bytes: config().slot_bytes to the ring successor on the collective lane, else
  /// config().far_slot_bytes). With `like` the payload gets like's offset within a 4 KiB page: copies between the
  /// slot and user buffers (which numpy/torch place at small in-page offsets) then never have a
  /// small destination-minus-source skew, which costs 4K-aliasing stalls.
  char* send_slot(int peer, Lane lane, const WaitCtx& w, const void* like = nullptr) {
    return send_slot_at(peer, lane, w, page_offset(like));
  }
  /// send_slot with the payload `offset` (< 4096) bytes into the slot, chosen by the caller.
  char* send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset);
  /// Non-blocking: nullptr when no slot is free.
  char* try_send_slot(int peer, Lane lane, const void* like = nullptr) {
    return try_send_slot_at(peer, lane, page_offset(like));
  }
  char* try_send_slot_at(int peer, Lane lane, uint32_t offset);
  /// The offset of `like` within its 4 KiB page (0 for nullptr).
  static uint32_t page_offset(const void* like) {
    return like ? static_cast<uint32_t>(reinterpret_cast<uintptr_t>(like) & 4095u) : 0u;
  }
  /// Publish the slot obtained by send_slot/try_send_slot.
  void send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag);
  /// Whether this transport has outboxes (the outbox layout): then send_slot_all exists, and a
  /// slot to any peer but the collective lane's ring successor is one of this rank's outbox slots.
  bool has_outbox() const { return outbox_; }
  /// Outbox layout, collective lane: one slot that every peer receives as its next message from
  /// this rank (the ring successor through its push channel: send_post_all copies the payload
  /// there). At most one unpublished outbox slot per lane at a time.
  char* send_slot_all(const WaitCtx& w, uint32_t offset);
  void send_post_all(uint64_t bytes, uint64_t total, uint64_t tag);

  // ---- channel, receiver side ----
  /// Wait for the next filled slot from `peer`; returns its payload and meta.
  const char* recv_slot(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta);
  const char* try_recv_slot(int peer, Lane lane, const SlotMeta** meta);
  /// Release the slot returned by recv_slot/try_recv_slot.
  void recv_done(int peer, Lane lane);

  // ---- header board (transport/shm_board.h) ----
  /// Post this rank's header for collective `seq` (>= 1) on its board (after its LL lines, if any).
  void post_header(uint64_t seq, const HeaderBlob& h) { board_.post(seq, h); }
  /// `peer`'s header for collective `seq`: from line 0 of its LL outbox when it wrote one for
  /// `seq` (*ll = true), else from its board once posted (*ll = false).
  HeaderBlob wait_header(int peer, uint64_t seq, const WaitCtx& w, bool* ll = nullptr) {
    return board_.wait(peer, seq, w, ll);
  }

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

  // ---- p2p doorbell (transport/shm_doorbell.h) ----
  uint32_t doorbell_value() const { return bell_.value(); }
  /// Ring `owner`'s doorbell (also used to wake this rank's own p2p thread).
  void ring_doorbell(int owner) { bell_.ring(owner); }
  /// Sleep until the doorbell differs from `seen` or ns elapse; the caller checks the peers
  /// (check_peers) between sleeps.
  void doorbell_wait(uint32_t seen, int64_t ns) { bell_.wait(seen, ns); }

  /// Throw if a peer aborted or died (used by pollers such as the p2p engine).
  void check_peers(const WaitCtx& w, bool check_liveness) { live_.check_peers(w, check_liveness); }

 private:
  bool pushes(int peer, Lane lane) const;  // this rank sends to peer through a push channel
  bool pulls(int peer, Lane lane) const;   // this rank receives from peer through its outbox
  // After mapping every peer: the local ranks whose CPUs meet this rank's (0: not known).
  int ranks_on_own_cpus() const;
  // What the front said (set_ranks_sharing): attach() keeps the larger of it and the masks' count.
  int front_sharing_ = 0;
  int node_ranks_ = 0;
  // In a failed attach(): unlink the names of peers that died before unlinking their own, once
  // every other rank has mapped them.
  void unlink_dead_peers(const std::vector<std::string>& names);

  int rank_;
  int world_;
  // The one normalized configuration every part reads (by reference); set_ranks_sharing and
  // attach() change its CPU-sharing fields before any wait of a collective.
  ShmConfig cfg_;
  bool outbox_;
  // The parts, in dependency order (each refers only to those above it).
  ShmSegments segs_;
  ShmLiveness live_;
  ShmWaits waits_;
  ShmDoorbell bell_;
  ShmBoard board_;
  ShmSlots slots_;
  ShmOutbox out_;
};

}  // namespace rc
