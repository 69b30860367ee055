// A rank's segment (transport/shm_segments.h): creation (named, allocated, 0600), mapping of
// every peer's segment with the agreement checks, the early unlink, and unmapping at close or
// after fork().
#include "transport/shm_segments.h"

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
#ifdef RINGCOMM_TEST_HOOKS
#include "common/test_knobs.h"
#endif

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

std::string ShmSegments::describe_geometry() const {
  std::ostringstream o;
  if (uniform(cfg_)) {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " x " << kNumLanes << " lanes per peer";
  } else {
    o << "slots " << cfg_.slot_bytes << " B x " << cfg_.nslots << " from the ring predecessor (collectives); "
      << "outboxes of " << cfg_.far_nslots << " slots of " << cfg_.far_slot_bytes
      << " B for each lane (collectives, point-to-point), read by the peers in place";
  }
  o << "; LL outboxes " << cfg_.ll_bytes << " B";
  o << "; shared memory " << bytes_ << " B per rank, " << bytes_ * world_ << " B for " << world_ << " ranks";
  if (!uniform(cfg_)) {
    o << " (per rank, at any world size: " << data_offset(world_, cfg_) << " B of header, LL outboxes and control + "
      << cfg_.nslots << " x (" << cfg_.slot_bytes << " + 4096) + " << kNumLanes << " x " << cfg_.far_nslots << " x ("
      << cfg_.far_slot_bytes << " + 4096))";
  }
  return o.str();
}

ShmSegments::ShmSegments(int rank, int world, const ShmConfig& cfg)
    : rank_(rank), world_(world), cfg_(cfg), bytes_(footprint_bytes(world, cfg)), base_(world, nullptr) {}

std::string ShmSegments::create(const std::string& pidns) {
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
  int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
  if (e == EINVAL || e == EOPNOTSUPP) e = ftruncate(fd, static_cast<off_t>(bytes_)) == 0 ? 0 : errno;
  if (e != 0) {
    struct statvfs vfs;
    const bool have_vfs = fstatvfs(fd, &vfs) == 0;
    ::close(fd);
    shm_unlink(name.c_str());
    own_unlinked_ = true;
    std::ostringstream o;
    o << "ringcomm: rank " << rank_ << " cannot allocate its " << bytes_ << " bytes of shared memory ("
      << std::strerror(e) << "); /dev/shm has ";
    if (have_vfs) {
      o << static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize << " bytes free of "
        << static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    } else {
      o << "an unknown amount free";
    }
    o << ", and " << world_ << " ranks need about " << static_cast<uint64_t>(bytes_) * world_
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
  // MAP_POPULATE: this process's page tables for the allocated pages are filled now, so no call
  // pays a page fault at its first touch of a page (a slot place the walk reaches first after
  // hundreds of calls: transport/shm_slots.h). Peers' segments are mapped the same way.
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    int e = errno;
    shm_unlink(name.c_str());
    own_unlinked_ = true;
    RC_THROW(Error, "ringcomm: mmap of " << bytes_ << " bytes failed: " << std::strerror(e));
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
  std::memcpy(h->pidns, pidns.c_str(), pidns.size() + 1);
  h->hb_timeout_ns = cfg_.heartbeat_timeout_ns;
  h->hb_period_ns = std::max<int64_t>(1000000, cfg_.heartbeat_timeout_ns / 8);
  h->cpu_mask_known = affinity_mask(h->cpu_mask) ? 1 : 0;
  h->cma_probe_addr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&h->cma_probe));
  h->cma_probe = cma_probe_value(h->pid, h->cma_probe_addr);
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  return name;
}

void ShmSegments::map_peers(const std::vector<std::string>& names,
                            const std::function<void(int, const SegmentHeader*)>& on_mapped) {
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
    if (static_cast<size_t>(st.st_size) != bytes_) {
      ::close(fd);
      RC_THROW(Mismatch, "ringcomm: rank " << p << "'s segment has " << st.st_size << " bytes, rank "
                         << rank_ << " expects " << bytes_
                         << " (RINGCOMM_SLOT_BYTES / RINGCOMM_NSLOTS / RINGCOMM_FAR_SLOT_BYTES / RINGCOMM_OUTBOX_SLOTS / RINGCOMM_LL_MAX_BYTES must be equal on every rank)");
    }
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
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
    on_mapped(p, h);
    publish_add(&h->attached.v, &h->attached.waiters, 1);
#ifdef RINGCOMM_TEST_HOOKS
    if (p == (rank_ == 0 ? 1 : 0)) {
      if (const int64_t pause_ms = TestKnobs::read().test_attach_pause_ms; pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
#endif
  }
}

void ShmSegments::unlink_own() {
  if (!own_unlinked_) {
    shm_unlink(own_name_.c_str());
    own_unlinked_ = true;
  }
}

void ShmSegments::unmap(bool keep_mappings) {
  for (auto& b : base_) {
    if (b != nullptr && !keep_mappings) munmap(b, bytes_);
    b = nullptr;
  }
}

void ShmSegments::forget_after_fork() {
  own_unlinked_ = true;
  for (auto& b : base_) {
    if (b != nullptr) munmap(b, bytes_);
    b = nullptr;
  }
}

}  // namespace rc
