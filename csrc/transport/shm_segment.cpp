// A rank's segment: its geometry, creation (named, allocated, 0600), attachment of every peer's
// segment with the agreement checks, the early unlink, and unmapping at close or after fork().
#include "transport/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "transport/shm_layout.h"
#include "transport/shm_wait.h"

namespace rc {

using namespace shm_detail;

namespace {

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

}  // namespace

ShmTransport::ChanGeom ShmTransport::geom_of(int owner, Lane lane, int src) const {
  ChanGeom g;
  if (!uniform(cfg_)) {  // the one push channel: collectives from the ring predecessor
    if (!push_channel(cfg_, world_, owner, lane, src)) return g;
    g.data_off = data_offset_;
    g.stride = cfg_.slot_bytes + kPage;
    g.nslots = cfg_.nslots;
    return g;
  }
  g.data_off = data_offset_ + (static_cast<size_t>(lane) * world_ + src) * cfg_.nslots * (cfg_.slot_bytes + kPage);
  g.stride = cfg_.slot_bytes + kPage;
  g.nslots = cfg_.nslots;
  return g;
}

std::string ShmTransport::describe_geometry() const {
  std::ostringstream o;
  if (uniform(cfg_)) {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " x " << kNumLanes << " lanes per peer";
  } else {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " from the ring predecessor (collectives); "
      << "outboxes of " << cfg_.far_nslots << " slots of " << cfg_.far_slot_bytes
      << " B for each lane (collectives, point-to-point), read by the peers in place";
  }
  o << "; LL outboxes " << cfg_.ll_bytes << " B";
  o << "; shared memory " << seg_bytes_ << " B per rank, " << seg_bytes_ * world_ << " B for " << world_ << " ranks";
  if (!uniform(cfg_)) {
    o << " (per rank, at any world size: " << data_offset_ << " B of header, LL outboxes and control + "
      << cfg_.nslots << " x (" << cfg_.slot_bytes << " + 4096) + " << kNumLanes << " x " << cfg_.far_nslots << " x ("
      << cfg_.far_slot_bytes << " + 4096))";
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
  outbox_ = !uniform(cfg_);
  RC_CHECK(!outbox_ || world_ <= kMaxOutboxWorld, InvalidArgument,
           "ringcomm: the shared-memory outboxes address at most " << kMaxOutboxWorld << " ranks, got " << world_);
  for (OutSend& s : out_send_) {
    s.dest.assign(cfg_.far_nslots, kAllDest);
    s.readers.assign(cfg_.far_nslots, 0);
  }
  out_last_.assign(kNumLanes * world_, 0);
  out_scanned_.assign(kNumLanes * world_, 0);
  out_cur_.assign(kNumLanes * world_, 0);
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
      << " bytes in all (per rank: " << cfg_.nslots << " slots of " << cfg_.slot_bytes << " bytes from the ring predecessor";
    if (uniform(cfg_)) {
      o << " and from every other source index and lane";
    } else {
      o << ", two outboxes of " << cfg_.far_nslots << " slots of " << cfg_.far_slot_bytes << " bytes";
    }
    o << ", and two LL outboxes of " << cfg_.ll_bytes << " bytes). Fixes: a larger /dev/shm (docker run --shm-size=1g, or remount "
      << "/dev/shm with a larger size=), or smaller slots (RINGCOMM_SLOT_BYTES, RINGCOMM_FAR_SLOT_BYTES) or fewer of them "
      << "(RINGCOMM_NSLOTS, RINGCOMM_OUTBOX_SLOTS)";
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
  pidns_[rank_] = pid_namespace_id(cfg_.test_pidns);
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
                         << " (RINGCOMM_SLOT_BYTES / RINGCOMM_NSLOTS / RINGCOMM_FAR_SLOT_BYTES / RINGCOMM_OUTBOX_SLOTS / RINGCOMM_LL_MAX_BYTES must be equal on every rank)");
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
                               << h->far_nslots << " of " << h->far_slot_bytes << " in its outboxes), rank "
                               << rank_ << " uses " << cfg_.nslots << " of " << cfg_.slot_bytes << " ("
                               << cfg_.far_nslots << " of " << cfg_.far_slot_bytes
                               << ") (set RINGCOMM_SLOT_BYTES / RINGCOMM_NSLOTS / RINGCOMM_FAR_SLOT_BYTES / RINGCOMM_OUTBOX_SLOTS "
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
    if (p == (rank_ == 0 ? 1 : 0)) {
      if (const int64_t pause_ms = cfg_.test_attach_pause_ms; pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
  }
  // The relation is symmetric (same_pid_namespace), so when every peer shares our namespace no
  // peer reads our heartbeat: stop it, and collectives run with no thread besides the core's.
  if (std::none_of(by_heartbeat_.begin(), by_heartbeat_.end(), [](char b) { return b != 0; })) heartbeat_.stop();
  // Every peer maps our segment before we unlink it; after that the name is gone and the memory
  // lives exactly as long as the mappings.
  auto* own = reinterpret_cast<SegmentHeader*>(base_[rank_]);
  WaitCtx w;
  w.op = "init";
  w.what = "every peer to map this rank's shared memory";
  // The counter has every peer as a writer, so the wait names no peer (w.peer = -1): a peer that
  // mapped us, finished its own init and closed its communicator is done with this wait, while
  // an aborted or dead one still fails it (check_peers).
  const uint32_t want = static_cast<uint32_t>(world_ - 1);
  try {
    wait_until(&own->attached.v, &own->attached.waiters,
               [&] { return own->attached.v.load(std::memory_order_acquire) >= want; }, w);
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

void ShmTransport::drop_mappings_after_fork() {
  heartbeat_.forget_after_fork();
  own_unlinked_ = true;
  for (auto& b : base_) {
    if (b != nullptr) munmap(b, seg_bytes_);
    b = nullptr;
  }
}

}  // namespace rc
