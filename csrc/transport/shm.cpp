#include "transport/shm.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

#include "common/knobs.h"
#include "common/errors.h"
#include "transport/futex.h"

namespace rc {

namespace {

constexpr uint64_t kMagic = 0x52494e47434f4d4dULL;  // "RINGCOMM"
constexpr uint32_t kVersion = 5;
constexpr size_t kPage = 4096;
constexpr size_t kAbortMsgBytes = 1024;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A futex word and its sleeper count on a cache line of their own.
struct alignas(64) Word {
  std::atomic<uint32_t> v;
  std::atomic<uint32_t> waiters;
};

// Publish a new value of a word and wake sleepers. The seq_cst RMW pairs with the waiter's
// seq_cst increment of `waiters` (see the header comment): no lost wake-ups.
inline void publish_add(std::atomic<uint32_t>* v, std::atomic<uint32_t>* waiters, uint32_t add) {
  v->fetch_add(add, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) futex_wake_all(v);
}

std::string random_name() {
  unsigned char buf[16];
  size_t got = 0;
  while (got < sizeof(buf)) {
    ssize_t n = getrandom(buf + got, sizeof(buf) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      RC_THROW(Error, "ringcomm: getrandom failed: " << std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", buf[i]);
  return std::string("/ringcomm-") + hex;
}

// CPUs this process may run on (its affinity mask), at least 1.
int affinity_cpus() {
  for (int n = 1024; n <= (1 << 20); n *= 4) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) break;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return std::max(1, count);
    if (errno != EINVAL) break;  // EINVAL: the kernel's mask is larger than ours; retry larger
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Involuntary context switches of the calling thread so far: the scheduler took its CPU while it
// was runnable (preemption, or a sched_yield that ran another task).
long thread_nivcsw() {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return ru.ru_nivcsw;
}

// WaitMode::kAdaptive: a wait that spun at least this long reads the thread's involuntary
// switch count before and after its spin (two getrusage calls, ~1 us: only waits already this
// long pay it).
constexpr int64_t kProbeAfterNs = 5000;
// WaitMode::kAdaptive: after a miss (a spin that ran out, or was preempted) this many waits
// yield (about 30 small collectives: header and data waits); each wait that ends within its
// spin unpreempted counts one down.
constexpr int kYieldCreditWaits = 64;

}  // namespace

int64_t deadline_after(int64_t now_ns, double seconds) {
  constexpr int64_t kFar = std::numeric_limits<int64_t>::max();
  if (!(seconds > 0)) return now_ns;
  const double ns = seconds * 1e9;
  // Compare in double before converting: a double >= 2^63 does not fit an int64 (UB).
  if (!(ns < static_cast<double>(kFar - now_ns))) return kFar;
  return now_ns + static_cast<int64_t>(ns);
}

struct BoardEntry {
  Word seq;        // the collective sequence number this entry holds (0 = none yet)
  CollHeader h;    // written before seq is published (release), read after it is acquired
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t world;
  int32_t rank;
  int32_t pid;
  uint64_t slot_bytes;
  uint32_t nslots;
  uint32_t far_nslots;
  uint64_t far_slot_bytes;
  uint64_t ll_bytes;
  char pidns[kPidNsBytes];     // the owner's PID-namespace identity (pid_namespace_id(); "" unknown)
  int64_t hb_timeout_ns;       // the owner's RINGCOMM_HEARTBEAT_TIMEOUT_MS
  int64_t hb_period_ns;        // how often the owner's heartbeat thread bumps `heartbeat`
  // Written only by the owner's heartbeat thread (relaxed increments), read by peers in other PID
  // namespaces; on a line of its own so the bumps never share a line with hot words.
  alignas(64) std::atomic<uint64_t> heartbeat;
  alignas(64) Word attached;   // peers that have mapped this segment
  alignas(64) Word state;      // PeerState; kind/msg written before state (release)
  uint32_t abort_kind;
  char abort_msg[kAbortMsgBytes];
  // 1 + the CPU the owner's last wait began on (0: none yet). Stored by the owner's waiting
  // threads only when it changed (relaxed), read by peers' waits as a placement hint: a peer
  // that waits for us on our own CPU cannot see us move while it spins (see wait_until).
  alignas(64) std::atomic<int32_t> on_cpu;
  alignas(64) Word doorbell;   // p2p activity counter (see ring_doorbell)
  alignas(64) BoardEntry board[2];
};

// One line of an LL outbox: payload first, the flag last. The owner writes the payload, then
// stores the flag (release); a reader that loads the flag equal to the collective's sequence
// (acquire) may read the payload. Only the owner writes, and only while no reader may still
// read the line's previous contents (see shm.h).
struct alignas(64) LLLine {
  static constexpr size_t kPayload = 56;
  char payload[kPayload];
  std::atomic<uint64_t> flag;
};
static_assert(sizeof(LLLine) == 64, "an LL line is one cache line");

struct ChannelCtl {
  Word head;  // written by the sender only
  Word tail;  // written by the receiver only
  // followed by SlotMeta[nslots]
};
static_assert(sizeof(ChannelCtl) == 128, "ChannelCtl is two cache lines");

ShmConfig ShmConfig::from_env(int world_size, double timeout_s) {
  ShmConfig c;
  // Slot size and count: bytes in flight per channel = slot_bytes * nslots. Slots small enough to
  // stay in L2/L3 between the sender's write and the receiver's read; enough of them to pipeline.
  int64_t slot = knob_bytes("RINGCOMM_SLOT_BYTES");
  int64_t nslots = knob_int("RINGCOMM_NSLOTS");
  RC_CHECK(slot >= 64, InvalidArgument, "RINGCOMM_SLOT_BYTES must be >= 64, got " << slot);
  // A power of two divides 2^32, so the slot index `counter % nslots` stays in step across the
  // wrap of the 32-bit head/tail counters.
  RC_CHECK(nslots >= 2 && nslots <= 1024 && (nslots & (nslots - 1)) == 0, InvalidArgument,
           "RINGCOMM_NSLOTS must be in [2, 1024] and a power of two (the ring's fused forward needs two; "
           "the slot index wraps with the 32-bit counters), got " << nslots);
  c.slot_bytes = round_up(static_cast<size_t>(slot), 64);
  c.nslots = static_cast<uint32_t>(nslots);
  c.timeout_s = timeout_s > 0 ? timeout_s : knob_double("RINGCOMM_TIMEOUT");
  RC_CHECK(c.timeout_s > 0, InvalidArgument, "timeout must be > 0 s, got " << c.timeout_s);
  // Wait policy. world_size is the number of ranks on this node (the transport spans one node);
  // against it, the CPUs this process may run on. With more ranks than CPUs the rank a waiter
  // waits for is often runnable on the waiter's own CPU: only yielding (or sleeping) lets it run,
  // and a spinning waiter steals its core, so the spin is short and yields. With a CPU per rank,
  // kAdaptive (yield only after a miss: a spin that ran out or was preempted) was meant to save
  // the sched_yield calls, but measured without SCHED_FIFO on a quiet 2-vCPU VM it made back-to-
  // back calls of 1-64 KiB 1.1-3.6x slower than kYield (docs/latency.md): auto is kYield, and
  // kAdaptive stays selectable.
  c.cpus = affinity_cpus();
  const bool oversubscribed = world_size > c.cpus;
  const std::string mode = knob_str("RINGCOMM_WAIT");
  c.wait_mode = mode == "spin"       ? WaitMode::kSpin
                : mode == "adaptive" ? WaitMode::kAdaptive
                                     : WaitMode::kYield;  // yield, and auto
  const int64_t spin_default_us = oversubscribed ? 2 : 50;
  c.spin_ns = (knob_is_set("RINGCOMM_SPIN_US") ? knob_int("RINGCOMM_SPIN_US") : spin_default_us) * 1000;
  RC_CHECK(c.spin_ns >= 0, InvalidArgument, "RINGCOMM_SPIN_US must be >= 0, got " << c.spin_ns / 1000);
  // Yielding waits spin yield_ns longer: sched_yield hands a runnable peer on our CPU the core
  // for a fraction of a futex sleep/wake's cost (~40 us here).
  c.yield_ns = knob_int("RINGCOMM_YIELD_US") * 1000;
  RC_CHECK(c.yield_ns >= 0, InvalidArgument, "RINGCOMM_YIELD_US must be >= 0, got " << c.yield_ns / 1000);
  c.yield_every_ns = std::max<int64_t>(100, knob_int("RINGCOMM_YIELD_EVERY_NS"));
  // A lost yield: under the kernel's EEVDF scheduler every sched_yield that finds another task
  // runnable moves the yielder's virtual deadline a whole slice later, so a waiter that yields
  // every few microseconds beside a CPU-bound process of another job hands it slice after slice
  // (calls of milliseconds, measured in docs/latency.md). A fellow rank given our CPU runs only
  // until it waits itself (microseconds); a yield that kept the CPU away for a slice-sized time
  // with our word still unset means such a process. Then waits stop yielding for the back-off:
  // they spin and sleep on the futex (a sleep resets the deadline; the waker's futex_wake
  // preempts the other process's task).
  c.yield_lost_ns = knob_int("RINGCOMM_YIELD_LOST_US") * 1000;
  RC_CHECK(c.yield_lost_ns > 0, InvalidArgument, "RINGCOMM_YIELD_LOST_US must be > 0, got " << c.yield_lost_ns / 1000);
  c.yield_backoff_ns = knob_int("RINGCOMM_YIELD_BACKOFF_MS") * 1000000;
  RC_CHECK(c.yield_backoff_ns >= 0, InvalidArgument,
           "RINGCOMM_YIELD_BACKOFF_MS must be >= 0, got " << c.yield_backoff_ns / 1000000);
  c.liveness_ns = knob_int("RINGCOMM_LIVENESS_MS") * 1000000;
  RC_CHECK(c.liveness_ns > 0, InvalidArgument, "RINGCOMM_LIVENESS_MS must be > 0");
  c.heartbeat_timeout_ns = knob_int("RINGCOMM_HEARTBEAT_TIMEOUT_MS") * 1000000;
  RC_CHECK(c.heartbeat_timeout_ns > 0, InvalidArgument, "RINGCOMM_HEARTBEAT_TIMEOUT_MS must be > 0");
  return c;
}

ShmConfig ShmConfig::host_from_env(int world_size, double timeout_s) {
  ShmConfig c = from_env(world_size, timeout_s);
  const int64_t far = knob_bytes("RINGCOMM_FAR_SLOT_BYTES");
  RC_CHECK(far >= 64, InvalidArgument, "RINGCOMM_FAR_SLOT_BYTES must be >= 64, got " << far);
  c.far_slot_bytes = round_up(static_cast<size_t>(far), 64);
  c.far_nslots = kFarMaxSlots;
  const int64_t ll = knob_bytes("RINGCOMM_LL_MAX_BYTES");
  RC_CHECK(ll >= 0 && ll <= (int64_t{1} << 20), InvalidArgument,
           "RINGCOMM_LL_MAX_BYTES must be in [0, 1M], got " << ll);
  c.ll_bytes = static_cast<size_t>(ll);
  return c;
}

namespace {

// The geometry every rank applies to every segment: the far one clamped to the full one, and
// uniform (far = full) up to 2 ranks, where the only peer is the ring neighbour on both sides.
ShmConfig normalized(int world, ShmConfig c) {
  if (world <= 2 || c.far_slot_bytes == 0 || c.far_nslots == 0) {
    c.far_slot_bytes = c.slot_bytes;
    c.far_nslots = c.nslots;
  }
  c.far_slot_bytes = std::min(c.far_slot_bytes, c.slot_bytes);
  c.far_nslots = std::min(c.far_nslots, c.nslots);  // both powers of two: so is the minimum
  return c;
}

// The two LL outboxes follow the segment header's pages; each holds the header and ll_bytes of data.
size_t ll_offset() { return round_up(sizeof(SegmentHeader), kPage); }
size_t ll_lines(const ShmConfig& c) {
  return (sizeof(CollHeader) + c.ll_bytes + LLLine::kPayload - 1) / LLLine::kPayload;
}
size_t ctl_offset(const ShmConfig& c) { return ll_offset() + round_up(2 * ll_lines(c) * sizeof(LLLine), kPage); }
size_t ctl_stride(const ShmConfig& c) { return sizeof(ChannelCtl) + sizeof(SlotMeta) * c.nslots; }
size_t data_offset(int world, const ShmConfig& c) {
  return round_up(ctl_offset(c) + ctl_stride(c) * kNumLanes * static_cast<size_t>(world), kPage);
}
// Uniform geometry (far = full: up to 2 ranks, the CUDA control plane, the simulation) keeps the
// plain layout: every source index, the owner's own included, has nslots full slots. Otherwise
// channel (lane, src) of `owner`'s segment has the full geometry iff it is the collective channel
// from owner's ring predecessor, and the owner's own index has no slots (nobody sends to itself).
bool uniform(const ShmConfig& c) { return c.far_slot_bytes == c.slot_bytes && c.far_nslots == c.nslots; }
bool full_channel(int world, int owner, Lane lane, int src) {
  return lane == Lane::kColl && src == (owner + world - 1) % world;
}
uint32_t chan_nslots(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  if (uniform(c)) return c.nslots;
  if (src == owner) return 0;
  return full_channel(world, owner, lane, src) ? c.nslots : c.far_nslots;
}
size_t chan_slot_stride(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  return (uniform(c) || full_channel(world, owner, lane, src) ? c.slot_bytes : c.far_slot_bytes) + kPage;
}
size_t chan_bytes(int world, int owner, Lane lane, int src, const ShmConfig& c) {
  return chan_nslots(world, owner, lane, src, c) * chan_slot_stride(world, owner, lane, src, c);
}

}  // namespace

size_t footprint_bytes(int world, const ShmConfig& cfg) {
  RC_CHECK(world >= 1, InvalidArgument, "world size must be >= 1, got " << world);
  const ShmConfig c = normalized(world, cfg);
  size_t b = data_offset(world, c);
  for (int l = 0; l < kNumLanes; ++l)
    for (int s = 0; s < world; ++s) b += chan_bytes(world, 0, static_cast<Lane>(l), s, c);
  return b;  // the same for every owner: uniform, or one full channel and the rest far
}

ShmTransport::ChanGeom ShmTransport::geom_of(int owner, Lane lane, int src) const {
  ChanGeom g;
  size_t off = data_offset_;
  for (int l = 0; l < kNumLanes; ++l)
    for (int s = 0; s < world_; ++s) {
      if (l == static_cast<int>(lane) && s == src) {
        g.data_off = off;
        g.stride = chan_slot_stride(world_, owner, lane, src, cfg_);
        g.nslots = chan_nslots(world_, owner, lane, src, cfg_);
        return g;
      }
      off += chan_bytes(world_, owner, static_cast<Lane>(l), s, cfg_);
    }
  return g;
}

ShmTransport::WaitStats ShmTransport::wait_stats() const {
  WaitStats st;
  st.slept = n_slept_.load(std::memory_order_relaxed);
  st.yields_lost = n_yields_lost_.load(std::memory_order_relaxed);
  st.colocated = n_colocated_.load(std::memory_order_relaxed);
  return st;
}

std::string ShmTransport::describe_wait() const {
  std::ostringstream o;
  o << "wait ";
  switch (cfg_.wait_mode) {
    case WaitMode::kSpin: o << "spin"; break;
    case WaitMode::kYield: o << "yield"; break;
    case WaitMode::kAdaptive: o << "adaptive"; break;
  }
  o << " (" << world_ << " ranks, " << cfg_.cpus << " CPUs): spin " << cfg_.spin_ns / 1000 << " us";
  if (cfg_.wait_mode != WaitMode::kSpin) {
    o << (cfg_.wait_mode == WaitMode::kAdaptive ? "; yielding " : ", ") << "+" << cfg_.yield_ns / 1000
      << " us with a sched_yield every " << cfg_.yield_every_ns << " ns";
    if (cfg_.wait_mode == WaitMode::kAdaptive) o << " for " << kYieldCreditWaits << " waits after a miss";
    o << " (none for " << cfg_.yield_backoff_ns / 1000000 << " ms after a yield lost the CPU "
      << cfg_.yield_lost_ns / 1000 << " us)";
  }
  o << ", then futex";
  return o.str();
}

std::string ShmTransport::describe_geometry() const {
  std::ostringstream o;
  if (uniform(cfg_)) {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " x " << kNumLanes << " lanes per peer";
  } else {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " from the ring predecessor (collectives), "
      << cfg_.far_slot_bytes << " B x " << cfg_.far_nslots << " on each of the other " << std::max(0, 2 * world_ - 3)
      << " channels";
  }
  o << "; LL outboxes " << cfg_.ll_bytes << " B";
  o << "; shared memory " << seg_bytes_ << " B per rank, " << seg_bytes_ * world_
    << " B for " << world_ << " ranks";
  return o.str();
}

std::string ShmTransport::describe_liveness() const {
  std::ostringstream o;
  o << "liveness";
  if (world_ <= 1) o << " -";
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    o << (p == (rank_ == 0 ? 1 : 0) ? ": " : ", ") << "rank " << p;
    if (!by_heartbeat_[p]) {
      o << " pid probe (same PID namespace)";
    } else {
      o << " heartbeat (PID namespace " << (pidns_[p].empty() ? "unknown" : pidns_[p]) << ", ours "
        << (pidns_[rank_].empty() ? "unknown" : pidns_[rank_]) << "; dead after " << hb_bound_ns_[p] / 1000000
        << " ms still)";
    }
  }
  return o.str();
}

ShmTransport::ShmTransport(int rank, int world, ShmConfig cfg)
    : rank_(rank), world_(world), cfg_(normalized(world, cfg)), base_(world, nullptr), pids_(world, 0),
      by_heartbeat_(world, 0), pidns_(world), hb_bound_ns_(world, 0), hb_seen_(world, 0), hb_seen_at_(world, 0),
      send_head_(kNumLanes * world, 0), recv_tail_(kNumLanes * world, 0), send_off_(kNumLanes * world, 0) {
  timeout_s_.store(cfg_.timeout_s, std::memory_order_relaxed);
  RC_CHECK(world >= 1, InvalidArgument, "world size must be >= 1, got " << world);
  RC_CHECK(rank >= 0 && rank < world, InvalidArgument, "rank " << rank << " out of range [0, " << world << ")");
  ctl_offset_ = ctl_offset(cfg_);
  ll_lines_ = ll_lines(cfg_);
  ctl_stride_ = ctl_stride(cfg_);
  data_offset_ = data_offset(world_, cfg_);
  seg_bytes_ = footprint_bytes(world_, cfg_);
  send_geom_.resize(kNumLanes * world_);
  recv_geom_.resize(kNumLanes * world_);
  for (int l = 0; l < kNumLanes; ++l)
    for (int p = 0; p < world_; ++p) {
      send_geom_[l * world_ + p] = geom_of(p, static_cast<Lane>(l), rank_);
      recv_geom_[l * world_ + p] = geom_of(rank_, static_cast<Lane>(l), p);
    }
}

ShmTransport::~ShmTransport() { close(); }

std::string ShmTransport::create() {
  RC_CHECK(base_[rank_] == nullptr, Error, "shared-memory segment already created");
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = random_name();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  RC_CHECK(fd >= 0, Error, "ringcomm: shm_open(" << name << ") failed: " << std::strerror(errno));
  own_name_ = name;
  own_unlinked_ = false;
  // Allocate every page now: a segment sized with ftruncate alone is sparse, and a /dev/shm too
  // small for it kills the rank with SIGBUS at the first touch of a missing page, mid-collective.
  int e = posix_fallocate(fd, 0, static_cast<off_t>(seg_bytes_));
  if (e == EINVAL || e == EOPNOTSUPP) e = ftruncate(fd, static_cast<off_t>(seg_bytes_)) == 0 ? 0 : errno;
  if (e != 0) {
    struct statvfs vfs;
    const bool have_vfs = fstatvfs(fd, &vfs) == 0;
    ::close(fd);
    shm_unlink(name.c_str());
    own_unlinked_ = true;
    std::ostringstream o;
    o << "ringcomm: rank " << rank_ << " cannot allocate its " << seg_bytes_ << " bytes of shared memory ("
      << std::strerror(e) << "); /dev/shm has ";
    if (have_vfs) {
      o << static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize << " bytes free of "
        << static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    } else {
      o << "an unknown amount free";
    }
    o << ", and " << world_ << " ranks need about " << static_cast<uint64_t>(seg_bytes_) * world_
      << " bytes in all (per rank: " << cfg_.nslots << " slots of " << cfg_.slot_bytes
      << " bytes from the ring predecessor, " << cfg_.far_nslots << " slots of " << cfg_.far_slot_bytes
      << " bytes on each of the other " << std::max(0, 2 * world_ - 3)
      << " channels, and two LL outboxes of " << cfg_.ll_bytes << " bytes). Fixes: a larger /dev/shm (docker run --shm-size=1g, or remount "
      << "/dev/shm with a larger size=), or smaller slots (RINGCOMM_SLOT_BYTES, RINGCOMM_FAR_SLOT_BYTES) or fewer of them "
      << "(RINGCOMM_NSLOTS)";
    throw Error(o.str());
  }
  void* p = mmap(nullptr, seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    int e = errno;
    shm_unlink(name.c_str());
    own_unlinked_ = true;
    RC_THROW(Error, "ringcomm: mmap of " << seg_bytes_ << " bytes failed: " << std::strerror(e));
  }
  base_[rank_] = static_cast<char*>(p);
  // The file is zero-filled: counters, states and boards start at 0.
  auto* h = reinterpret_cast<SegmentHeader*>(p);
  h->version = kVersion;
  h->world = world_;
  h->rank = rank_;
  h->pid = static_cast<int32_t>(getpid());
  h->slot_bytes = cfg_.slot_bytes;
  h->nslots = cfg_.nslots;
  h->far_slot_bytes = cfg_.far_slot_bytes;
  h->far_nslots = cfg_.far_nslots;
  h->ll_bytes = cfg_.ll_bytes;
  pidns_[rank_] = pid_namespace_id();
  std::memcpy(h->pidns, pidns_[rank_].c_str(), pidns_[rank_].size() + 1);
  h->hb_timeout_ns = cfg_.heartbeat_timeout_ns;
  h->hb_period_ns = std::max<int64_t>(1000000, cfg_.heartbeat_timeout_ns / 8);
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  pids_[rank_] = getpid();
  // Peers learn whether they share our PID namespace only when they map this segment, and may
  // check our heartbeat from then on: it beats from now until attach() has seen every peer.
  heartbeat_.start(&h->heartbeat, h->hb_period_ns);
  return name;
}

void ShmTransport::attach(const std::vector<std::string>& names) {
  RC_CHECK(static_cast<int>(names.size()) == world_, InvalidArgument,
           "attach needs " << world_ << " segment names, got " << names.size());
  RC_CHECK(base_[rank_] != nullptr, Error, "create() must be called before attach()");
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    int fd = shm_open(names[p].c_str(), O_RDWR, 0);
    RC_CHECK(fd >= 0, PeerFailure, "ringcomm: rank " << rank_ << " cannot open rank " << p
                                    << "'s shared memory " << names[p] << ": " << std::strerror(errno)
                                    << " (is every rank on this host, and did rank " << p << " exit?)");
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      RC_THROW(Error, "ringcomm: fstat of rank " << p << "'s shared memory " << names[p]
                      << " failed: " << std::strerror(err));
    }
    // Only a segment this user created for this purpose (0600, as create() makes them) is
    // mapped: another user's, or one others may write, could be forged or tampered with.
    if (st.st_uid != geteuid() || (st.st_mode & 07777) != 0600) {
      ::close(fd);
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      RC_THROW(Error, "ringcomm: rank " << p << "'s shared memory /dev/shm" << names[p] << " is owned by uid "
                      << st.st_uid << " with mode " << mode << "; rank " << rank_ << " (uid " << geteuid()
                      << ") maps only segments it owns with mode 0600 (is another user's job using this store?)");
    }
    if (static_cast<size_t>(st.st_size) != seg_bytes_) {
      ::close(fd);
      RC_THROW(Mismatch, "ringcomm: rank " << p << "'s segment has " << st.st_size << " bytes, rank "
                         << rank_ << " expects " << seg_bytes_
                         << " (RINGCOMM_SLOT_BYTES / RINGCOMM_NSLOTS / RINGCOMM_FAR_SLOT_BYTES / RINGCOMM_LL_MAX_BYTES must be equal on every rank)");
    }
    void* m = mmap(nullptr, seg_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    RC_CHECK(m != MAP_FAILED, Error, "ringcomm: mmap of rank " << p << "'s segment failed: " << std::strerror(errno));
    base_[p] = static_cast<char*>(m);
    auto* h = reinterpret_cast<SegmentHeader*>(m);
    uint64_t magic = reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
    RC_CHECK(magic == kMagic && h->version == kVersion && h->world == world_ && h->rank == p, Mismatch,
             "ringcomm: rank " << p << "'s segment header does not match (world " << h->world << ", rank "
                               << h->rank << ", version " << h->version << ")");
    RC_CHECK(h->slot_bytes == cfg_.slot_bytes && h->nslots == cfg_.nslots &&
                 h->far_slot_bytes == cfg_.far_slot_bytes && h->far_nslots == cfg_.far_nslots,
             Mismatch,
             "ringcomm: rank " << p << " uses " << h->nslots << " slots of " << h->slot_bytes << " bytes ("
                               << h->far_nslots << " of " << h->far_slot_bytes << " on other channels), rank "
                               << rank_ << " uses " << cfg_.nslots << " of " << cfg_.slot_bytes << " ("
                               << cfg_.far_nslots << " of " << cfg_.far_slot_bytes
                               << ") (set RINGCOMM_SLOT_BYTES / RINGCOMM_NSLOTS / RINGCOMM_FAR_SLOT_BYTES "
                               << "equally on every rank)");
    RC_CHECK(h->ll_bytes == cfg_.ll_bytes, Mismatch,
             "ringcomm: rank " << p << "'s LL outbox carries " << h->ll_bytes << " bytes, rank " << rank_ << "'s "
                               << cfg_.ll_bytes << " (set RINGCOMM_LL_MAX_BYTES equally on every rank)");
    pids_[p] = h->pid;
    pidns_[p] = std::string(h->pidns, strnlen(h->pidns, kPidNsBytes - 1));
    by_heartbeat_[p] = same_pid_namespace(pidns_[rank_], pidns_[p]) ? 0 : 1;
    hb_bound_ns_[p] = std::max<int64_t>(cfg_.heartbeat_timeout_ns, h->hb_timeout_ns);
    {
      std::lock_guard<std::mutex> lk(hb_mu_);
      hb_seen_[p] = h->heartbeat.load(std::memory_order_relaxed);
      hb_seen_at_[p] = now_ns();
    }
    publish_add(&h->attached.v, &h->attached.waiters, 1);
  }
  // The relation is symmetric (same_pid_namespace), so when every peer shares our namespace no
  // peer reads our heartbeat: stop it, and collectives run with no thread besides the core's.
  if (std::none_of(by_heartbeat_.begin(), by_heartbeat_.end(), [](char b) { return b != 0; })) heartbeat_.stop();
  // Every peer maps our segment before we unlink it; after that the name is gone and the memory
  // lives exactly as long as the mappings.
  auto* own = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  WaitCtx w;
  w.op = "init";
  w.what = "peers to map this rank's shared memory";
  const uint32_t want = static_cast<uint32_t>(world_ - 1);
  try {
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      w.peer = p;
      wait_until(&own->attached.v, &own->attached.waiters,
                 [&] { return own->attached.v.load(std::memory_order_acquire) >= want; }, w);
      break;  // one wait covers all: the counter counts every peer
    }
  } catch (...) {
    unlink_dead_peers(names);
    throw;
  }
  shm_unlink(own_name_.c_str());
  own_unlinked_ = true;
}

// A peer that died during init, before unlinking its segment, never will. Its `attached`
// counter counts the ranks that mapped it: once that is every other rank, nobody needs the name
// any more and a rank that finds the owner dead unlinks it (the last mapper does; a second
// unlink of the same name fails with ENOENT, harmlessly). Before that, a rank still reading the
// name from the store would take a missing segment for a stale key, so the name stays.
void ShmTransport::unlink_dead_peers(const std::vector<std::string>& names) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || base_[p] == nullptr || !peer_dead(p)) continue;
    auto* h = reinterpret_cast<SegmentHeader*>(base_[p]);
    if (h->attached.v.load(std::memory_order_acquire) >= static_cast<uint32_t>(world_ - 1))
      shm_unlink(names[p].c_str());
  }
}

void ShmTransport::close(bool keep_mappings) {
  if (!own_unlinked_) {
    shm_unlink(own_name_.c_str());
    own_unlinked_ = true;
  }
  if (base_.empty()) return;
  if (base_[rank_] != nullptr) {
    auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
    uint32_t expected = static_cast<uint32_t>(PeerState::kAlive);
    h->state.v.compare_exchange_strong(expected, static_cast<uint32_t>(PeerState::kClosed),
                                       std::memory_order_seq_cst);
    if (h->state.waiters.load()) futex_wake_all(&h->state.v);
  }
  // After the state word says closed (peers then never judge us by the heartbeat), and before
  // the unmap (the thread writes our segment).
  heartbeat_.stop();
  for (auto& b : base_) {
    if (b != nullptr && !keep_mappings) munmap(b, seg_bytes_);
    b = nullptr;
  }
}

void ShmTransport::abort(uint32_t kind, const std::string& msg) {
  if (base_.empty() || base_[rank_] == nullptr) return;
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  if (h->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAlive)) return;
  if (abort_claimed_.exchange(true, std::memory_order_acq_rel)) return;
  // kind and message first, then the state with release: a peer that acquires kAborted sees them.
  h->abort_kind = kind;
  size_t n = std::min(msg.size(), kAbortMsgBytes - 1);
  std::memcpy(h->abort_msg, msg.data(), n);
  h->abort_msg[n] = '\0';
  h->state.v.store(static_cast<uint32_t>(PeerState::kAborted), std::memory_order_release);
  // Wake every sleeper in our inbox and board promptly; others notice within a liveness slice.
  futex_wake_all(&h->doorbell.v);
  for (auto& e : h->board) futex_wake_all(&e.seq.v);
}

void ShmTransport::drop_mappings_after_fork() {
  heartbeat_.forget_after_fork();
  own_unlinked_ = true;
  for (auto& b : base_) {
    if (b != nullptr) munmap(b, seg_bytes_);
    b = nullptr;
  }
}

void ShmTransport::set_closing() {
  int none = 0;
  interrupt_.compare_exchange_strong(none, 1, std::memory_order_acq_rel);
}

void ShmTransport::set_aborting(const std::string& msg) {
  if (interrupt_claimed_.exchange(true)) return;
  interrupt_msg_ = msg;
  int none = 0;
  interrupt_.compare_exchange_strong(none, 2, std::memory_order_acq_rel);
}

void ShmTransport::set_timeout(double seconds) {
  RC_CHECK(seconds > 0, InvalidArgument, "timeout must be > 0 s, got " << seconds);
  timeout_s_.store(seconds, std::memory_order_relaxed);
}

std::exception_ptr ShmTransport::interrupt_error(const WaitCtx& w) const {
  const int i = interrupt_.load(std::memory_order_acquire);
  if (i == 0) return nullptr;
  std::ostringstream o;
  o << "ringcomm: " << describe(w);
  if (i == 1) {
    o << ": the communicator on rank " << rank_ << " was closed while this call waited (close() from another thread)";
    return std::make_exception_ptr(Closed(o.str()));
  }
  o << ": " << interrupt_msg_;
  return std::make_exception_ptr(Error(o.str()));
}

std::string ShmTransport::own_abort_message() const {
  if (base_.empty() || base_[rank_] == nullptr) return {};
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  if (h->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAborted)) return {};
  return std::string(h->abort_msg);
}

ChannelCtl* ShmTransport::ctl(int owner, Lane lane, int src) const {
  return reinterpret_cast<ChannelCtl*>(base_[owner] + ctl_offset_ +
                                       ctl_stride_ * (static_cast<size_t>(lane) * world_ + src));
}

SlotMeta* ShmTransport::slot_meta(int owner, Lane lane, int src, uint32_t slot) const {
  return reinterpret_cast<SlotMeta*>(reinterpret_cast<char*>(ctl(owner, lane, src)) + sizeof(ChannelCtl)) + slot;
}


std::string ShmTransport::describe(const WaitCtx& w) const {
  std::ostringstream o;
  o << w.op << " (seq " << w.seq << ") on rank " << rank_;
  if (w.peer >= 0) o << ", waiting for " << (w.what && *w.what ? w.what : "peer") << " from rank " << w.peer;
  if (w.step >= 0) o << " at step " << w.step << (w.nsteps > 0 ? "/" + std::to_string(w.nsteps) : "");
  return o.str();
}

bool ShmTransport::heartbeat_stale(int peer) const {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[peer]);
  const uint64_t v = h->heartbeat.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(hb_mu_);
  const int64_t now = now_ns();
  if (v != hb_seen_[peer]) {
    hb_seen_[peer] = v;
    hb_seen_at_[peer] = now;
    return false;
  }
  return now - hb_seen_at_[peer] > hb_bound_ns_[peer];
}

bool ShmTransport::peer_dead(int peer) const {
  if (by_heartbeat_[peer]) return heartbeat_stale(peer);
  pid_t pid = pids_[peer];
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A killed child of someone else stays a zombie until reaped: dead for our purposes.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;  // no /proc: rely on kill()
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* rp = std::strrchr(buf, ')');
  if (rp == nullptr || rp[1] == '\0' || rp[2] == '\0') return false;
  char st = rp[2];
  return st == 'Z' || st == 'X';
}

void ShmTransport::fail_peer_state(int peer, const WaitCtx& w) {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[peer]);
  uint32_t st = h->state.v.load(std::memory_order_acquire);
  if (st == static_cast<uint32_t>(PeerState::kAborted)) {
    std::string msg(h->abort_msg, strnlen(h->abort_msg, kAbortMsgBytes));
    std::string text = "ringcomm: " + describe(w) + ": rank " + std::to_string(peer) + " failed: " + msg;
    const int code = static_cast<int>(h->abort_kind);
    throw_error(valid_error_code(code) ? static_cast<ErrorCode>(code) : ErrorCode::kPeerFailure, text);
  }
  RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer
                                     << " closed its communicator before completing this operation (rank " << peer
                                     << " closed)");
}

void ShmTransport::fail_dead(int peer, const WaitCtx& w) const {
  if (!by_heartbeat_[peer]) {
    RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer << " (pid " << pids_[peer] << ") died");
  }
  int64_t still = 0;
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    still = now_ns() - hb_seen_at_[peer];
  }
  RC_THROW(PeerFailure, "ringcomm: " << describe(w) << ": rank " << peer << " (pid " << pids_[peer]
                                     << " in PID namespace " << (pidns_[peer].empty() ? "unknown" : pidns_[peer])
                                     << ") died: its heartbeat has not moved for " << still / 1000000
                                     << " ms (RINGCOMM_HEARTBEAT_TIMEOUT_MS: " << hb_bound_ns_[peer] / 1000000
                                     << " ms)");
}

void ShmTransport::fail_closing(const WaitCtx& w) { std::rethrow_exception(interrupt_error(w)); }

void ShmTransport::check_peers(const WaitCtx& w, bool check_liveness) {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    auto* h = reinterpret_cast<SegmentHeader*>(base_[p]);
    uint32_t st = h->state.v.load(std::memory_order_acquire);
    if (st == static_cast<uint32_t>(PeerState::kAborted)) fail_peer_state(p, w);
    // A peer that closed cleanly may have exited: it is closed, never dead. A wait on it raises
    // "closed" (wait_until's state check); other waits go on.
    if (st == static_cast<uint32_t>(PeerState::kClosed)) continue;
    if (check_liveness && peer_dead(p)) fail_dead(p, w);
  }
}

template <class Ready>
void ShmTransport::wait_until(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters, Ready ready,
                              const WaitCtx& w) {
  if (ready()) return;
  const int64_t t0 = now_ns();
  // Placement: publish the CPU this wait runs on, and read the awaited peer's. When the peer last
  // waited on this same CPU it is (almost always: migrations are rare) queued behind us, and no
  // spin of ours can end before the scheduler runs it: give the CPU up at once (a yield, or the
  // futex sleep; the peer's store's futex_wake wakes us).
  // Only where sharing is expected (ranks outnumber CPUs, or another process's load was seen):
  // with a CPU per rank, the load balancer separates two ranks that meet on one CPU only if both
  // stay runnable there, which a spinning waiter does and one that gives the CPU up does not.
  const int64_t no_yield_until = no_yield_until_.load(std::memory_order_relaxed);
  bool colocated = false;
  if (const int cpu = sched_getcpu(); cpu >= 0) {
    auto* own = reinterpret_cast<SegmentHeader*>(base_[rank_]);
    if (own->on_cpu.load(std::memory_order_relaxed) != cpu + 1) own->on_cpu.store(cpu + 1, std::memory_order_relaxed);
    if ((world_ > cfg_.cpus || t0 < no_yield_until) && w.peer >= 0 && w.peer != rank_ && base_[w.peer] != nullptr)
      colocated = reinterpret_cast<SegmentHeader*>(base_[w.peer])->on_cpu.load(std::memory_order_relaxed) == cpu + 1;
    if (colocated) n_colocated_.fetch_add(1, std::memory_order_relaxed);
  }
  // Spin phase: poll the word with `pause`. A yielding wait (WaitMode::kYield, or kAdaptive after
  // a miss) also hands the CPU to whoever else is runnable on it every yield_every_ns,
  // and spins yield_ns longer: when the peer sits runnable on OUR CPU (ranks outnumber CPUs, or
  // another process shares the CPU) only that lets it run before our spin budget is gone.
  const WaitMode mode = cfg_.wait_mode;
  const bool adaptive = mode == WaitMode::kAdaptive;
  const bool yielding = (mode == WaitMode::kYield ||
                         (adaptive && yield_credit_.load(std::memory_order_relaxed) > 0)) &&
                        t0 >= no_yield_until;
  // Co-located with the peer: no pure spin. A yielding wait yields at once (the cheapest way to
  // hand the peer our CPU while no other process competes for it); any other sleeps at once.
  const bool active = !colocated || yielding;
  const int64_t active_end = t0 + (colocated ? 0 : cfg_.spin_ns) + (yielding ? cfg_.yield_ns : 0);
  int64_t next_yield = t0 + (colocated ? 0 : cfg_.yield_every_ns);
  long nivcsw0 = -1;  // kAdaptive: involuntary switches when the probe started (-1: not yet)
  bool done = false;
  while (active) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (ready()) {
        done = true;
        break;
      }
    }
    if (done) break;
    const int64_t now = now_ns();
    if (yielding && now >= next_yield) {
      sched_yield();
      if (ready()) {
        done = true;
        break;
      }
      const int64_t back = now_ns();
      if (back - now >= cfg_.yield_lost_ns) {
        // A lost yield (see ShmConfig::from_env): stop yielding, and sleep now.
        n_yields_lost_.fetch_add(1, std::memory_order_relaxed);
        if (cfg_.yield_backoff_ns > 0) no_yield_until_.store(back + cfg_.yield_backoff_ns, std::memory_order_relaxed);
        break;
      }
      next_yield = back + cfg_.yield_every_ns;
    }
    if (now >= active_end) break;
    if (closing()) fail_closing(w);
    if (adaptive && nivcsw0 < 0 && now - t0 >= kProbeAfterNs) nivcsw0 = thread_nivcsw();
  }
  if (adaptive && active) {
    // A miss: the spin ran out (the peer did not get to run within our budget: on a shared CPU it
    // may be queued behind us), or this thread was preempted while spinning (its CPU is shared
    // right now). Then the next waits yield while they spin. A wait that ended within its spin
    // unpreempted counts the credit down: back to pure spinning once the sharing stops.
    const bool preempted = nivcsw0 >= 0 && thread_nivcsw() > nivcsw0;
    if (!done || preempted) {
      yield_credit_.store(kYieldCreditWaits, std::memory_order_relaxed);
    } else if (yield_credit_.load(std::memory_order_relaxed) > 0) {
      yield_credit_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (done) return;
  n_slept_.fetch_add(1, std::memory_order_relaxed);
  // Sleep phase: futex in slices, checking peers and the deadline between slices.
  const int64_t deadline = deadline_after(t0, timeout_s());
  int64_t next_liveness = t0;
  for (;;) {
    uint32_t seen = word->load(std::memory_order_acquire);
    if (ready()) return;
    waiters->fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) {
      int64_t slice = std::min<int64_t>(cfg_.liveness_ns, deadline - now_ns());
      futex_wait(word, seen, std::max<int64_t>(slice, 1000));
    }
    waiters->fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    if (closing()) fail_closing(w);
    const int64_t now = now_ns();
    const bool live_check = now >= next_liveness;
    if (live_check) next_liveness = now + cfg_.liveness_ns;
    if (w.peer >= 0 && w.peer != rank_) {
      auto* h = reinterpret_cast<SegmentHeader*>(base_[w.peer]);
      if (h->state.v.load(std::memory_order_acquire) != static_cast<uint32_t>(PeerState::kAlive)) {
        if (ready()) return;  // it finished its part before closing
        fail_peer_state(w.peer, w);
      }
    }
    check_peers(w, live_check);
    if (now >= deadline) {
      if (ready()) return;
      RC_THROW(TimeoutError, "ringcomm: " << describe(w) << ": timed out after " << timeout_s()
                                          << " s (RINGCOMM_TIMEOUT / timeout=)");
    }
  }
}

// ---------------- channels ----------------


char* ShmTransport::try_send_slot(int peer, Lane lane, const void* like) {
  return try_send_slot_at(peer, lane, page_offset(like));
}

char* ShmTransport::try_send_slot_at(int peer, Lane lane, uint32_t offset) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  uint32_t head = send_head_[ch];
  // acquire: the receiver's reads of the slot happen-before our writes into it.
  uint32_t tail = c->tail.v.load(std::memory_order_acquire);
  if (head - tail >= g.nslots) return nullptr;
  send_off_[ch] = offset;
  return base_[peer] + g.data_off + (head % g.nslots) * g.stride + send_off_[ch];
}

char* ShmTransport::send_slot(int peer, Lane lane, const WaitCtx& w, const void* like) {
  return send_slot_at(peer, lane, w, page_offset(like));
}

char* ShmTransport::send_slot_at(int peer, Lane lane, const WaitCtx& w, uint32_t offset) {
  RC_CHECK(offset < kPage, InvalidArgument, "ringcomm: slot payload offset " << offset << " is not below " << kPage);
  const size_t ch = static_cast<size_t>(lane) * world_ + peer;
  ChannelCtl* c = ctl(peer, lane, rank_);
  const ChanGeom& g = send_geom_[ch];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel to itself");
  const uint32_t head = send_head_[ch];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "a free slot";
  wait_until(&c->tail.v, &c->tail.waiters,
             [&] { return head - c->tail.v.load(std::memory_order_acquire) < g.nslots; }, ww);
  send_off_[ch] = offset;
  return base_[peer] + g.data_off + (head % g.nslots) * g.stride + send_off_[ch];
}

void ShmTransport::send_post(int peer, Lane lane, uint64_t bytes, uint64_t total, uint64_t tag) {
  ChannelCtl* c = ctl(peer, lane, rank_);
  uint32_t& head = send_head_[static_cast<size_t>(lane) * world_ + peer];
  SlotMeta* m = slot_meta(peer, lane, rank_, head % send_geom_[static_cast<size_t>(lane) * world_ + peer].nslots);
  m->bytes = bytes;
  m->total = total;
  m->tag = tag;
  m->offset = send_off_[static_cast<size_t>(lane) * world_ + peer];
  ++head;
  // seq_cst RMW: releases the slot's data and meta to the receiver, and orders against its
  // waiter registration (no lost wake-up).
  publish_add(&c->head.v, &c->head.waiters, 1);
  if (lane == Lane::kP2P) ring_doorbell(peer);
}

const char* ShmTransport::try_recv_slot(int peer, Lane lane, const SlotMeta** meta) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  if (c->head.v.load(std::memory_order_acquire) == tail) return nullptr;
  uint32_t slot = tail % g.nslots;
  *meta = slot_meta(rank_, lane, peer, slot);
  return base_[rank_] + g.data_off + slot * g.stride + (*meta)->offset;
}

const char* ShmTransport::recv_slot(int peer, Lane lane, const WaitCtx& w, const SlotMeta** meta) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  const ChanGeom& g = recv_geom_[static_cast<size_t>(lane) * world_ + peer];
  RC_CHECK(g.nslots > 0, InvalidArgument, "ringcomm: rank " << rank_ << " has no channel from itself");
  const uint32_t tail = recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "data";
  wait_until(&c->head.v, &c->head.waiters,
             [&] { return c->head.v.load(std::memory_order_acquire) != tail; }, ww);
  uint32_t slot = tail % g.nslots;
  *meta = slot_meta(rank_, lane, peer, slot);
  return base_[rank_] + g.data_off + slot * g.stride + (*meta)->offset;
}

void ShmTransport::recv_done(int peer, Lane lane) {
  ChannelCtl* c = ctl(rank_, lane, peer);
  ++recv_tail_[static_cast<size_t>(lane) * world_ + peer];
  // seq_cst RMW: our reads of the slot happen-before the sender's next write into it.
  publish_add(&c->tail.v, &c->tail.waiters, 1);
  if (lane == Lane::kP2P) ring_doorbell(peer);
}

// ---------------- header board ----------------

void ShmTransport::post_header(uint64_t seq, const CollHeader& h) {
  const uint32_t bs = board_seq_of(seq);
  auto* sh = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  BoardEntry& e = sh->board[bs & 1u];
  e.h = h;
  e.seq.v.store(bs, std::memory_order_seq_cst);
  if (e.seq.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&e.seq.v);
}

CollHeader ShmTransport::wait_header(int peer, uint64_t seq, const WaitCtx& w, bool* ll) {
  const uint32_t bs = board_seq_of(seq);
  auto* sh = reinterpret_cast<SegmentHeader*>(base_[peer]);
  BoardEntry& e = sh->board[bs & 1u];
  const LLLine& line0 = ll_outbox(peer, bs)[0];
  auto ll_ready = [&] { return line0.flag.load(std::memory_order_acquire) == seq; };
  WaitCtx ww = w;
  ww.peer = peer;
  ww.what = "the collective's header (did every rank call the same collective?)";
  // The board word is the futex word: a rank that wrote its outbox posts its board right after,
  // so a sleeper is woken either way; line 0 lets a spinning reader start one publication sooner.
  wait_until(&e.seq.v, &e.seq.waiters,
             [&] { return ll_ready() || e.seq.v.load(std::memory_order_acquire) == bs; }, ww);
  // The board's release of bs came after every line the poster wrote for seq: line 0 is current
  // now iff the poster wrote its outbox for seq.
  const bool from_ll = ll_ready();
  if (ll) *ll = from_ll;
  if (!from_ll) return e.h;
  CollHeader h;
  std::memcpy(&h, line0.payload, sizeof(h));
  return h;
}

// ---------------- low-latency outbox ----------------

LLLine* ShmTransport::ll_outbox(int owner, uint32_t board_seq) const {
  return reinterpret_cast<LLLine*>(base_[owner] + ll_offset()) + (board_seq & 1u) * ll_lines_;
}

void ShmTransport::ll_write(uint64_t seq, const CollHeader& h, const void* data, size_t bytes) {
  RC_CHECK(bytes <= cfg_.ll_bytes, InvalidArgument,
           "ringcomm: " << bytes << " bytes do not fit the LL outbox (" << cfg_.ll_bytes << " bytes)");
  LLLine* lines = ll_outbox(rank_, board_seq_of(seq));
  // The payload stream is the header, then the data; line i carries stream bytes [56 i, 56 i + 56).
  constexpr size_t kHead = sizeof(CollHeader);
  const char* src = static_cast<const char*>(data);
  const size_t first = std::min(bytes, LLLine::kPayload - kHead);
  std::memcpy(lines[0].payload, &h, kHead);
  if (first > 0) std::memcpy(lines[0].payload + kHead, src, first);
  lines[0].flag.store(seq, std::memory_order_release);
  size_t done = first;
  size_t i = 1;
  // Whole lines with a fixed-size copy (inlined: a few vector moves), then the last one.
  for (; bytes - done >= LLLine::kPayload; ++i, done += LLLine::kPayload) {
    std::memcpy(lines[i].payload, src + done, LLLine::kPayload);
    lines[i].flag.store(seq, std::memory_order_release);
  }
  if (done < bytes) {
    std::memcpy(lines[i].payload, src + done, bytes - done);
    lines[i].flag.store(seq, std::memory_order_release);
  }
}

void ShmTransport::ll_read(int peer, uint64_t seq, void* dst, size_t bytes, const WaitCtx& w) {
  RC_CHECK(bytes <= cfg_.ll_bytes, InvalidArgument,
           "ringcomm: " << bytes << " bytes do not fit the LL outbox (" << cfg_.ll_bytes << " bytes)");
  const uint32_t bs = board_seq_of(seq);
  const LLLine* lines = ll_outbox(peer, bs);
  BoardEntry& e = reinterpret_cast<SegmentHeader*>(base_[peer])->board[bs & 1u];
  constexpr size_t kHead = sizeof(CollHeader);
  char* out = static_cast<char*>(dst);
  size_t done = 0;
  for (size_t i = 0; i == 0 || done < bytes; ++i) {
    const LLLine& line = lines[i];
    if (line.flag.load(std::memory_order_acquire) != seq) {
      // The owner is still writing (it posts its board after its last line), or never will.
      bool ready = false;
      for (int k = 0; k < 256 && !ready; ++k) {
        cpu_relax();
        ready = line.flag.load(std::memory_order_acquire) == seq;
      }
      if (!ready) {
        WaitCtx ww = w;
        ww.peer = peer;
        ww.what = "LL data";
        wait_until(&e.seq.v, &e.seq.waiters,
                   [&] { return line.flag.load(std::memory_order_acquire) == seq ||
                                e.seq.v.load(std::memory_order_acquire) == bs; }, ww);
        if (line.flag.load(std::memory_order_acquire) != seq) {
          RC_THROW(Error, "ringcomm: " << describe(ww) << ": line " << i << " of rank " << peer
                          << "'s LL outbox holds seq " << line.flag.load(std::memory_order_relaxed)
                          << " after it posted its header (the ranks' streams diverged)");
        }
      }
    }
    const size_t at = i == 0 ? kHead : 0;
    const size_t n = std::min(bytes - done, LLLine::kPayload - at);
    if (n == LLLine::kPayload) {
      std::memcpy(out + done, line.payload, LLLine::kPayload);  // fixed size: inlined
    } else if (n > 0) {
      std::memcpy(out + done, line.payload + at, n);
    }
    done += n;
  }
}

// ---------------- doorbell ----------------

void ShmTransport::ring_doorbell(int owner) {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[owner]);
  publish_add(&h->doorbell.v, &h->doorbell.waiters, 1);
}

uint32_t ShmTransport::doorbell_value() const {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  return h->doorbell.v.load(std::memory_order_acquire);
}

void ShmTransport::doorbell_wait(uint32_t seen, int64_t ns) {
  auto* h = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  h->doorbell.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (h->doorbell.v.load(std::memory_order_seq_cst) == seen) futex_wait(&h->doorbell.v, seen, ns);
  h->doorbell.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace rc
