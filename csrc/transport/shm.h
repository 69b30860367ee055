// Host shared-memory transport: processes on one machine exchange bytes through POSIX shared
// memory in fixed-size slots, with flow control by atomic sequence counters.
//
// Layout. Every rank owns ONE segment, of a size that does not depend on the world size in the
// outbox layout (the host communicator's from 3 ranks on; see footprint_bytes):
//  - the header page (liveness, doorbell, header board) and the two LL outboxes (below);
//  - ONE push channel: the collective lane from the ring predecessor (rank-1), which carries
//    every ring and chain hand-off: `nslots` slots of `slot_bytes`. The sender writes into the
//    RECEIVER's segment ("push"; Channel protocol below);
//  - two outboxes, one per lane (collectives, point-to-point), of `far_nslots` slots of
//    `far_slot_bytes` each (RINGCOMM_OUTBOX_SLOTS, RINGCOMM_FAR_SLOT_BYTES): every other message
//    this rank sends (direct exchanges to any peer, point-to-point to any peer, the successor
//    included) is written into its OWN outbox, and its reader copies it out of this segment
//    ("pull"; Outboxes below).
// So a segment is header + LL + nslots x (slot_bytes + 4 KiB) + 2 x far_nslots x
// (far_slot_bytes + 4 KiB) + control words, the same at 3 ranks as at 128.
// The uniform layout (up to 2 ranks, where the only peer is the ring neighbour on both sides, and
// the CUDA control plane and the simulation, whose ShmConfig asks for no outbox) keeps a push
// channel of `nslots` slots of `slot_bytes` for every lane and source index, the rank's own
// included, and no outbox: its size grows with the world.
//
// Outboxes (one writer: the owner's thread of that lane). The owner numbers the messages of an
// outbox 1, 2, ... (its sequence g) and puts message g in slot g % far_nslots. The slot's `key`
// packs g and the message's reader (`dest`), or kAllDest: every rank except the owner and its
// ring successor (the successor receives its copy through the push channel: send_slot_all); the
// owner keeps each slot's reader count (1, or world - 2) in private memory.
// Publishing g: the owner writes payload and meta, resets `done`, stores key = (g, dest)
// (release), then posted = g (release), then bumps the outbox's `pub` word (seq_cst RMW, a futex
// wake if a reader sleeps on it) and, on the point-to-point lane, rings each reader's doorbell.
// Reading: a reader keeps, per owner and lane, the sequence of the last message it consumed
// (`last`). It loads posted = P (acquire): every message up to P is then visible. Its next
// message is the lowest g in (last, P] whose slot's key holds g and names it (one atomic load
// gives both, so a slot reused meanwhile is never mistaken for it); only g > P - far_nslots can
// be its, since the owner cannot publish g + far_nslots while the reader has not released g. It
// releases the slot by incrementing `done` (seq_cst RMW: its reads happen-before the owner's
// reuse) and bumps the outbox's `freed` word (and, point-to-point, the owner's doorbell). The
// owner writes g only when slot g % far_nslots is unused or its `done` equals the reader count of
// the message it held (acquire). Messages from one owner to one reader are therefore consumed in
// the order they were sent (FIFO per pair, as a push channel), and a message for every reader
// (the one-shot's and the direct broadcast's pieces, two-shot's all-gather phase) is written once.
// Waits (wait_until with a predicate) sleep on the awaited outbox's `pub` (a reader) or on its own
// outbox's `freed` (the owner): every event that can make them ready bumps that word. Their
// deadline, the local interrupt (close, abort) and the peers' states and liveness are checked as
// in every wait. Nothing is mapped or allocated after init: every pair's messages use the two
// ranks' outboxes and the one push channel.
// Progress: the owner's slots are shared by all its readers, so a message unread by one reader
// delays messages to every other. The algorithms therefore send to many peers only in rounds in
// which each message is read by its receiver at the position it was sent (algo/direct.cpp), and
// the point-to-point engine drains every message (above the eager size, only its announcement)
// into private memory when no receive for it is posted (comm/p2p_engine.h), so an outbox never
// stays full behind an absent receive.
//
// Channel protocol (one writer per word):
//   head  - written only by the sender: number of slots it has filled (wrapping uint32).
//   tail  - written only by the receiver: number of slots it has consumed.
//   Slot i = head % nslots (nslots a power of two, so the index survives the counters' wrap) is free for the sender while head - tail < nslots. The sender writes
//   the slot's data and meta, then publishes with a release increment of head; the receiver reads
//   head with acquire, so the data and meta are visible before it touches them. The receiver
//   releases a slot with a release increment of tail after it has finished reading it; the
//   sender's acquire of tail orders its next write to that slot after the receiver's reads.
//   *_waiters words implement sleeping (futex): a waiter increments waiters (seq_cst), re-checks
//   the counter, then sleeps; a publisher increments the counter with a seq_cst RMW and wakes
//   only if waiters != 0. Both sides use seq_cst RMWs, so either the waiter sees the new value
//   or the publisher sees the waiter (no lost wake-up).
//
// Header board: before each collective every rank writes a small header (sequence, collective,
// dtype, op, counts, root, and the algorithm, protocol and store policy it selected) to board[seq % 2] of its own segment and publishes seq with release;
// every rank reads every peer's header. Two entries suffice: a rank can only write the entry
// for seq+2 after it has read every peer's header for seq+1, which every peer posts only after
// finishing its reads of seq.
//
// Low-latency outbox (LL): beside the board, every segment holds two outboxes (by the parity of
// the board's sequence word, like the board entries) of 64-byte lines, each 56 payload bytes and
// an 8-byte flag. A rank writes a small collective's header and data into its OWN outbox
// (the LL protocol, proto/ll.h: payload first, then the line's flag = the collective's 64-bit
// sequence number with release), before it posts the header on the board; every peer reads the lines from the
// owner's segment (one copy however many readers: pull, not push). A reader that sees a line's
// flag equal to the sequence (acquire) sees that line's payload: data and flag travel in one
// cache line, and no head, meta or tail word is exchanged. The header is the payload's first
// bytes (line 0), so wait_header returns it from line 0 as soon as line 0 is there, without
// the board. Flags are never cleared: a line is current iff its flag equals the sequence.
// Reuse is safe without acknowledgement, by the board's argument: a rank writes outbox[s % 2]
// for collective s+2 only after it finished s+1, which needs every peer's header for s+1, which
// every peer posts only after finishing its reads of s.
//
// Liveness: each segment records its owner's pid, its PID-namespace identity, a heartbeat word
// and a state word (alive / closed / aborted + message). Every wait has a deadline; while waiting
// (after a short spin) a rank sleeps in slices and checks that no peer aborted and that every
// peer that has not closed is alive: a peer in this rank's PID namespace by its pid (kill(pid, 0)
// and /proc/<pid>/stat zombie state), a peer in another namespace (or an unknown one) by its
// heartbeat word, which that peer's background thread bumps (transport/heartbeat.h): a heartbeat
// that has not moved for the larger of both ranks' RINGCOMM_HEARTBEAT_TIMEOUT_MS means dead. A
// closed peer is never dead. A failure throws PeerFailure / TimeoutError naming op, rank, peer,
// step and sequence number.
//
// Lifetime: a segment is created with a random name (O_EXCL, mode 0600), mapped by every peer,
// and unlinked by its owner as soon as every peer has reported attaching (attach counter), so
// even kill -9 afterwards leaves nothing in /dev/shm.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/knobs.h"
#include "transport/heartbeat.h"

namespace rc {

enum class Lane : int { kColl = 0, kP2P = 1 };
constexpr int kNumLanes = 2;

/// What a wait is for: every error raised by a wait names these.
struct WaitCtx {
  const char* op = "";     // collective / operation name
  uint64_t seq = 0;        // collective sequence number
  int peer = -1;           // the rank waited on
  int step = -1;           // algorithm step (or -1)
  int nsteps = 0;          // number of steps (for messages)
  const char* what = "";   // what is awaited: "data", "free slot", "header", ...
};

/// How a waiter spends the time before it sleeps on the futex (RINGCOMM_WAIT, resolved).
enum class WaitMode : int {
  kSpin = 0,      // pause-spin spin_ns, then sleep: never sched_yield
  kYield = 1,     // spin spin_ns + yield_ns with a sched_yield every yield_every_ns, then sleep
  kAdaptive = 2,  // kSpin; after a miss (the spin ran out, or was preempted) kYield for a while
};

struct ShmConfig {
  size_t slot_bytes = 0;     // RINGCOMM_SLOT_BYTES
  uint32_t nslots = 0;       // RINGCOMM_NSLOTS
  double timeout_s = 300;    // RINGCOMM_TIMEOUT (per communicator override)
  WaitMode wait_mode = WaitMode::kAdaptive;  // RINGCOMM_WAIT (auto resolved, see from_knobs)
  int cpus = 1;              // CPUs this process may run on (sched_getaffinity) when configured
  int64_t spin_ns = 0;       // RINGCOMM_SPIN_US, or by the CPUs (spin_ns_for)
  std::optional<int64_t> spin_us;  // RINGCOMM_SPIN_US where the environment sets it
  int64_t yield_ns = 0;      // RINGCOMM_YIELD_US: yielding waits spin this much longer
  int64_t yield_every_ns = 0;  // RINGCOMM_YIELD_EVERY_NS: yielding waits sched_yield this often
  int64_t yield_lost_ns = 0;   // RINGCOMM_YIELD_LOST_US: a sched_yield this long lost the CPU
  int64_t yield_backoff_ns = 0;  // RINGCOMM_YIELD_BACKOFF_MS: then no yields for this long (0: never)
  int64_t liveness_ns = 0;   // RINGCOMM_LIVENESS_MS: how often a sleeping waiter checks peers
  int64_t heartbeat_timeout_ns = 0;  // RINGCOMM_HEARTBEAT_TIMEOUT_MS: a still heartbeat means dead
  // The outbox layout (world >= 3; see Layout): each rank's two outboxes have far_nslots slots of
  // far_slot_bytes. Without it (uniform) far = full (slot_bytes, nslots). far_slot_bytes is
  // clamped to at most slot_bytes.
  bool outbox = false;
  size_t far_slot_bytes = 0;   // RINGCOMM_FAR_SLOT_BYTES
  uint32_t far_nslots = 0;     // RINGCOMM_OUTBOX_SLOTS
  size_t ll_bytes = 0;         // RINGCOMM_LL_MAX_BYTES: data bytes one LL outbox carries
  int64_t test_attach_pause_ms = 0;  // RINGCOMM_TEST_ATTACH_PAUSE_MS (test hook)
  std::string test_pidns;           // RINGCOMM_TEST_PIDNS (test hook; heartbeat.h)
  /// Uniform geometry (far = full) from the knobs `k` (their range checks throw
  /// InvalidArgument): what the CUDA control plane and the simulation use.
  static ShmConfig from_knobs(const Knobs& k, int world_size, double timeout_s);
  /// from_knobs plus the outboxes (world >= 3): the host communicator's transport.
  static ShmConfig host_from_knobs(const Knobs& k, int world_size, double timeout_s);
  /// The spin before a wait yields or sleeps: RINGCOMM_SPIN_US (spin_us), else short (2 us)
  /// when more ranks share this process's CPUs than there are (`cpus`: the awaited rank may
  /// need our CPU), else 50 us.
  int64_t spin_ns_for(int ranks_sharing) const;
};

/// Bytes of one rank's segment for `world` ranks with configuration `cfg` (computes only): in the
/// outbox layout the same for every world >= 3 (shm.h, Layout).
size_t footprint_bytes(int world, const ShmConfig& cfg);

/// Header posted before each collective (compared across ranks). 40 bytes: its first bytes are
/// also the payload of line 0 of an LL outbox (LLLine).
struct CollHeader {
  uint32_t coll = 0;
  uint32_t dtype = 0;
  uint32_t op = 0;
  int32_t root = -1;
  int64_t count = 0;   // element count (meaning depends on the collective)
  int64_t count2 = 0;  // a second count: all_gather's contribution of the posting rank, all_to_all's output total
  // How the collective runs, chosen by the communicator's selection (comm/selection.h) and
  // compared across ranks like the fields above: the algorithm, the protocol and the store
  // policy, as their codes.
  uint8_t algo = 0;
  uint8_t proto = 0;
  uint8_t store = 0;
  uint8_t reserved[5] = {0, 0, 0, 0, 0};
};
static_assert(sizeof(CollHeader) == 40, "CollHeader's size is part of the segment layout (LL line 0)");

/// One line of an LL outbox (see "Low-latency outbox" above): payload first, the flag last. The
/// owner writes the payload, then stores the flag (release); a reader that loads the flag equal
/// to the collective's 64-bit sequence (acquire) may read the payload. Only the owner writes, and
/// only while no reader may still read the line's previous contents. Line 0's payload starts
/// with the owner's CollHeader. The lines' contents are the LL protocol's (proto/ll.h).
struct alignas(64) LLLine {
  static constexpr size_t kPayload = 56;
  char payload[kPayload];
  std::atomic<uint64_t> flag;
};
static_assert(sizeof(LLLine) == 64, "an LL line is one cache line");

struct SlotMeta {
  uint64_t bytes;   // bytes of payload in this slot
  uint64_t total;   // total bytes of the message this slot starts (p2p), or 0
  uint64_t tag;     // message tag / sequence
  uint64_t offset;  // payload starts this many bytes into the slot (< 4096, see send_slot)
  uint64_t pad[4];
};
static_assert(sizeof(SlotMeta) == 64, "SlotMeta is one cache line");

/// The board's 32-bit sequence word for collective `seq` (seq >= 1): in [1, 2^32 - 2], never 0
/// (0 means "no header yet"). The period 2^32 - 2 is even, so the word has the parity of seq and
/// consecutive collectives alternate between the board's two entries (`word & 1`) across the wrap.
inline uint32_t board_seq_of(uint64_t seq) { return static_cast<uint32_t>((seq - 1) % 0xFFFFFFFEull) + 1; }

/// now_ns + seconds, saturated: an infinite or huge timeout gives a deadline in the far future
/// (INT64_MAX), never an overflowed one in the past; seconds <= 0 (or NaN) gives now_ns.
int64_t deadline_after(int64_t now_ns, double seconds);

enum class PeerState : uint32_t { kAlive = 0, kClosed = 1, kAborted = 2 };

namespace shm_detail {
struct ChannelCtl;  // transport/shm_layout.h
struct OutSlot;
struct OutboxCtl;
}  // namespace shm_detail

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
  void set_closing();
  /// Local, like set_closing(): every wait raises rc::Error carrying `msg` (comm.abort()).
  void set_aborting(const std::string& msg);
  /// The local interrupt (closing or aborting) as the error a wait raises, or null.
  std::exception_ptr interrupt_error(const WaitCtx& w) const;
  /// Seconds any single wait may take; set_timeout changes it for waits that start afterwards.
  double timeout_s() const { return timeout_s_.load(std::memory_order_relaxed); }
  void set_timeout(double seconds);
  /// Before attach(): how many local ranks (this one included) run on this process's CPUs, when
  /// the front knows it (it bound the ranks): the wait policy then compares it, not the world
  /// size, with the CPUs (ShmConfig::spin_ns_for). < 1: unknown, nothing changes.
  void set_ranks_sharing(int ranks_sharing);
  /// In a forked child: forget the mappings without writing to any segment (they are the
  /// parent's: its state word, board and channels) and never unlink a name. Idempotent; close()
  /// afterwards does nothing.
  void drop_mappings_after_fork();
  bool closing() const { return interrupt_.load(std::memory_order_acquire) != 0; }
  bool aborting() const { return interrupt_.load(std::memory_order_acquire) == 2; }

  int rank() const { return rank_; }
  int world() const { return world_; }
  const ShmConfig& config() const { return cfg_; }
  /// Bytes of this rank's shared-memory segment (its inbox; the same on every rank).
  size_t segment_bytes() const { return seg_bytes_; }
  /// One line describing the channel geometry and the footprint (RINGCOMM_DEBUG=INFO).
  std::string describe_geometry() const;
  /// The resolved wait policy in words: mode, spin/yield budgets, ranks vs CPUs.
  std::string describe_wait() const;
  /// Counters of the waits' slow paths since creation (any thread; relaxed reads).
  struct WaitStats {
    uint64_t slept = 0;      ///< waits that went to the futex sleep
    uint64_t yields_lost = 0;  ///< sched_yields that lost the CPU (each starts the back-off)
    uint64_t colocated = 0;  ///< waits that found their peer on their own CPU (no pure spin)
  };
  WaitStats wait_stats() const;
  /// How each peer's liveness is checked, after attach(): "liveness: rank 1 pid probe (same PID
  /// namespace), rank 2 heartbeat (PID namespace ... differs; dead after N ms still)".
  std::string describe_liveness() const;
  /// Whether this rank's heartbeat thread runs (some peer is in another or an unknown namespace).
  bool heartbeat_running() const { return heartbeat_.running(); }

  // ---- channel, sender side ----
  /// Wait for a free slot in `peer`'s inbox; returns where to write the payload (the channel's
  /// slot bytes: config().slot_bytes to the ring successor on the collective lane, else
  /// config().far_slot_bytes). With `like` the payload gets like's offset within a 4 KiB page: copies between the
  /// slot and user buffers (which numpy/torch place at small in-page offsets) then never have a
  /// small destination-minus-source skew, which costs 4K-aliasing stalls.
  char* send_slot(int peer, Lane lane, const WaitCtx& w, const void* like = nullptr);
  /// send_slot with the payload `offset` (< 4096) bytes into the slot, chosen by the caller.
  char* send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset);
  /// Non-blocking: nullptr when no slot is free.
  char* try_send_slot(int peer, Lane lane, const void* like = nullptr);
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

  // ---- header board ----
  /// Post this rank's header for collective `seq` (>= 1) on its board (after its LL lines, if any).
  void post_header(uint64_t seq, const CollHeader& h);
  /// `peer`'s header for collective `seq`: from line 0 of its LL outbox when it wrote one for
  /// `seq` (*ll = true), else from its board once posted (*ll = false).
  CollHeader wait_header(int peer, uint64_t seq, const WaitCtx& w, bool* ll = nullptr);

  // ---- low-latency outbox region (see the header comment; its protocol: proto/ll.h) ----
  /// Data bytes an LL outbox carries (ShmConfig::ll_bytes); 0: there is none.
  size_t ll_max_bytes() const { return cfg_.ll_bytes; }
  /// The lines of `owner`'s outbox for collective `seq` (the one of its two outboxes that the
  /// board entry for `seq` pairs with): ll_line_count() lines, written only by `owner`.
  LLLine* ll_outbox(int owner, uint64_t seq) const;
  size_t ll_line_count() const { return ll_lines_; }
  /// Wait (bounded, checking peers) until `flag` holds `seq` or `peer` has posted its header for
  /// `seq`, whichever comes first: a reader of `peer`'s outbox line waits so, since the owner
  /// posts its header only after its last line.
  void wait_line_or_header(int peer, uint64_t seq, const std::atomic<uint64_t>& flag, const WaitCtx& w);

  // ---- p2p doorbell: rings when a p2p slot to us is filled or a p2p slot we sent is freed ----
  uint32_t doorbell_value() const;
  /// Ring `owner`'s doorbell (also used to wake this rank's own p2p thread).
  void ring_doorbell(int owner);
  /// Sleep until the doorbell differs from `seen` or ns elapse; checks aborts and liveness.
  void doorbell_wait(uint32_t seen, int64_t ns);

  /// Throw if a peer aborted or died (used by pollers such as the p2p engine).
  void check_peers(const WaitCtx& w, bool check_liveness);
  /// The abort message this rank posted (empty if none).
  std::string own_abort_message() const;

 private:
  template <class Ready>
  void wait_until(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters, Ready ready,
                  const WaitCtx& w);
  [[noreturn]] void fail_peer_state(int peer, const WaitCtx& w);
  [[noreturn]] void fail_closing(const WaitCtx& w);
  /// In a failed attach(): unlink the names of peers that died before unlinking their own,
  /// once every other rank has mapped them.
  void unlink_dead_peers(const std::vector<std::string>& names);
  bool peer_dead(int peer) const;
  // The heartbeat half of peer_dead: whether `peer`'s heartbeat word has stayed at one value for
  // longer than its bound since this rank first saw that value.
  bool heartbeat_stale(int peer) const;
  [[noreturn]] void fail_dead(int peer, const WaitCtx& w) const;
  // Where one channel's slots sit in its owner's segment.
  struct ChanGeom {
    size_t data_off = 0;   // first slot, from the segment's base
    size_t stride = 0;     // slot bytes + one page of slack for the payload offset
    uint32_t nslots = 0;   // a power of two (0: the owner's own source index)
  };
  ChanGeom geom_of(int owner, Lane lane, int src) const;
  // ---- outboxes (transport/shm_outbox.cpp; see "Outboxes") ----
  bool pushes(int peer, Lane lane) const;    // this rank sends to peer through a push channel
  bool pulls(int peer, Lane lane) const;     // this rank receives from peer through its outbox
  shm_detail::OutSlot* out_slot(int owner, Lane lane, uint64_t g) const;
  char* out_data(int owner, Lane lane, uint64_t g) const;
  shm_detail::OutboxCtl* outbox(int owner, Lane lane) const;
  // The next slot of this rank's outbox for `dest` (or kAllDest), waiting (w) or not (nullptr).
  char* out_reserve(Lane lane, int dest, uint32_t offset, const WaitCtx* w);
  void out_post(Lane lane, uint64_t bytes, uint64_t total, uint64_t tag);
  const char* out_find(int peer, Lane lane, const SlotMeta** meta);
  void out_release(int peer, Lane lane);
  shm_detail::ChannelCtl* ctl(int owner, Lane lane, int src) const;
  SlotMeta* slot_meta(int owner, Lane lane, int src, uint32_t slot) const;
  std::string describe(const WaitCtx& w) const;

  int rank_;
  int world_;
  ShmConfig cfg_;
  size_t seg_bytes_ = 0;
  size_t ctl_offset_ = 0, ctl_stride_ = 0, data_offset_ = 0;
  size_t ll_lines_ = 0;  // lines per LL outbox
  // The channels this rank uses, [lane * world + peer]: sending into peer's segment, receiving
  // in its own. Fixed at construction.
  std::vector<ChanGeom> send_geom_, recv_geom_;
  std::string own_name_;
  bool own_unlinked_ = true;
  std::vector<char*> base_;          // mapped segments, by owner rank
  std::vector<pid_t> pids_;
  // Liveness mode per peer, fixed when attach() maps the peer: true = heartbeat (another or an
  // unknown PID namespace), false = pid probe. Read-only afterwards.
  std::vector<char> by_heartbeat_;
  std::vector<std::string> pidns_;        // every rank's PID-namespace identity (own included)
  std::vector<int64_t> hb_bound_ns_;      // max(own, peer's) heartbeat timeout
  // What this rank last saw of each peer's heartbeat and when (steady clock): written by any
  // thread that checks liveness (waiters, the p2p thread), under hb_mu_.
  mutable std::mutex hb_mu_;
  mutable std::vector<uint64_t> hb_seen_;
  mutable std::vector<int64_t> hb_seen_at_;
  Heartbeat heartbeat_;  // bumps this rank's own heartbeat word (see transport/heartbeat.h)
  // Sender-local head and receiver-local tail copies (each word has exactly one writer).
  std::vector<uint32_t> send_head_;  // [lane * world + peer]
  std::vector<uint32_t> recv_tail_;  // [lane * world + peer]
  std::vector<uint32_t> send_off_;   // payload offset chosen by send_slot, published by send_post
  // Outbox state (outbox layout only). Sender side, per lane, touched by that lane's thread only:
  // the next sequence number, the reserved slot's reader (kNoReserve: none), and per slot the
  // reader count of the message it holds. Receiver side, [lane * world + peer], by that lane's
  // thread: the last message consumed, how far its scan found nothing more, the message being read.
  bool outbox_ = false;
  static constexpr int kNoReserve = -2;
  struct OutSend {
    uint64_t next = 1;
    int reserved = kNoReserve;
    uint32_t offset = 0;
    std::vector<int32_t> dest;
    std::vector<uint32_t> readers;
  };
  OutSend out_send_[kNumLanes];
  std::vector<uint64_t> out_last_, out_scanned_, out_cur_;
  // Local interrupt of every wait: 0 none, 1 closing, 2 aborting (interrupt_msg_ is written
  // before the release store of 2 and never again). Read by every waiting thread.
  std::atomic<int> interrupt_{0};
  std::string interrupt_msg_;
  std::atomic<bool> interrupt_claimed_{false};  // one writer of interrupt_msg_
  // One writer of this rank's abort kind and message in its segment: the first abort() wins, a
  // concurrent one returns without touching them (else two threads could interleave the text).
  std::atomic<bool> abort_claimed_{false};
  std::atomic<double> timeout_s_;
  // WaitMode::kAdaptive: how many more waits yield while spinning. Set by a waiter whose spin
  // ran out or was preempted, counted down by waits that ended within their spin unpreempted. Any
  // waiting thread reads and writes it (relaxed: a hint, it orders nothing).
  std::atomic<int> yield_credit_{0};
  // Yielding waits: until this CLOCK_MONOTONIC time no wait calls sched_yield (it spins, then
  // sleeps). Set by a waiter whose sched_yield lost the CPU for yield_lost_ns or more without its
  // word becoming ready: another process's task, not a rank, ran a whole slice on our CPU. Any
  // waiting thread reads and writes it (relaxed: a hint, it orders nothing).
  std::atomic<int64_t> no_yield_until_{0};
  // WaitStats, bumped (relaxed) by waiting threads on the slow paths only.
  std::atomic<uint64_t> n_slept_{0}, n_yields_lost_{0}, n_colocated_{0};
};

}  // namespace rc
