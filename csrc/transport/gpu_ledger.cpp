// The device ring's per-GPU ledger (see gpu_ledger.h for its invariants).
#include "transport/gpu_ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "common/errors.h"

namespace rc {

namespace {

struct Entry {
  int64_t pid = 0;
  uint64_t start = 0;  // the process's start time (/proc/<pid>/stat), against a reused pid
  uint64_t owner = 0;
  int mps = 0;
  int64_t blocks = 0;
  int rank = 0, world = 0;
  uint64_t ns = 0;  // the process's PID namespace (0: unknown): its pid means nothing in another
};

// This process's PID namespace (the inode of /proc/self/ns/pid); 0 when it cannot be read.
uint64_t pid_namespace() {
  char buf[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  if (n <= 0) return 0;
  const char* b = std::strchr(buf, '[');
  return b != nullptr ? std::strtoull(b + 1, nullptr, 10) : 0;
}

// The start time of `pid` in clock ticks since boot; 0 when there is no such process or it has
// exited (a zombie, not yet reaped, holds nothing on the GPU).
uint64_t start_time(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 1));
  std::string tok;
  // Fields after the command: state is field 3, the start time field 22.
  for (int field = 3; field <= 22 && (in >> tok); ++field) {
    if (field == 3 && (tok == "Z" || tok == "X")) return 0;
    if (field == 22) return std::strtoull(tok.c_str(), nullptr, 10);
  }
  return 0;
}

// An entry of another PID namespace (another container sharing the directory) cannot be checked
// from here and counts as alive: keeping a dead holder's blocks wastes them, dropping a live one's
// could leave a grid not resident.
bool alive(const Entry& e) {
  static const uint64_t me = pid_namespace();
  if (e.ns != 0 && me != 0 && e.ns != me) return true;
  return e.pid > 0 && start_time(e.pid) == e.start && e.start != 0;
}

// The ledger's file, opened and locked (flock, exclusive); -1 when it does not exist and
// !create. A file unlinked or replaced between open and lock is let go and the path reopened.
int open_locked(const std::string& path, bool create) {
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (fd < 0) {
      if (!create && errno == ENOENT) return -1;
      RC_THROW(Error, "ringcomm: cannot open the GPU ledger " << path << ": " << std::strerror(errno)
                          << " (RINGCOMM_CUDA_LEDGER_DIR names its directory)");
    }
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int e = errno;
        ::close(fd);
        RC_THROW(Error, "ringcomm: cannot lock the GPU ledger " << path << ": " << std::strerror(e));
      }
    }
    struct stat a, b;
    if (::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      if (create) (void)::fchmod(fd, 0666);  // every user's communicators share the GPU
      return fd;
    }
    ::close(fd);
  }
}

std::vector<Entry> read_entries(int fd) {
  std::string s;
  char buf[4096];
  off_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
    off += n;
  }
  std::vector<Entry> v;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    Entry e;
    if (l >> e.pid >> e.start >> e.owner >> e.mps >> e.blocks >> e.rank >> e.world >> e.ns) {
      if (alive(e)) v.push_back(e);
    }
  }
  return v;
}

// Rewrites the file with `v`, or unlinks it when `v` is empty (the lock is still held).
void write_entries(int fd, const std::string& path, const std::vector<Entry>& v) {
  if (v.empty()) {
    (void)::unlink(path.c_str());
    return;
  }
  std::ostringstream o;
  for (const Entry& e : v)
    o << e.pid << ' ' << e.start << ' ' << e.owner << ' ' << e.mps << ' ' << e.blocks << ' ' << e.rank << ' '
      << e.world << ' ' << e.ns << '\n';
  const std::string s = o.str();
  RC_CHECK(::ftruncate(fd, 0) == 0, Error, "ringcomm: cannot write the GPU ledger " << path << ": " << std::strerror(errno));
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::pwrite(fd, s.data() + done, s.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    RC_CHECK(n > 0, Error, "ringcomm: cannot write the GPU ledger " << path << ": " << std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

struct Locked {
  int fd;
  ~Locked() {
    if (fd >= 0) ::close(fd);  // closing the last descriptor drops the flock
  }
};

// The domain of (this process, mps): every MPS client's entry under MPS, else this process's own.
GpuLedgerLook look_at(const std::vector<Entry>& v, bool mps, uint64_t owner) {
  const int64_t me = ::getpid();
  GpuLedgerLook r;
  std::ostringstream h;
  bool first = true;
  for (const Entry& e : v) {
    if (e.pid == me && e.owner == owner) continue;
    if (mps ? e.mps == 0 : e.pid != me) continue;
    r.held += e.blocks;
    h << (first ? "" : "; ") << "pid " << e.pid << " (rank " << e.rank << " of "
      << e.world << "): " << e.blocks << " blocks";
    first = false;
  }
  r.holders = h.str();
  return r;
}

}  // namespace

GpuLedger::GpuLedger(const std::string& dir, const std::string& uuid) {
  static const char* d = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : uuid) {
    hex += d[c >> 4];
    hex += d[c & 15];
  }
  path_ = (dir.empty() ? std::string("/dev/shm") : dir) + "/ringcomm-gpu-" + hex;
}

GpuLedgerLook GpuLedger::look(bool mps, uint64_t owner) const {
  Locked l{open_locked(path_, false)};
  if (l.fd < 0) return {};
  const std::vector<Entry> v = read_entries(l.fd);
  write_entries(l.fd, path_, v);  // drops the dead holders' entries
  return look_at(v, mps, owner);
}

bool GpuLedger::reserve(uint64_t owner, bool mps, int blocks, int rank, int world, int64_t capacity,
                        GpuLedgerLook* look) {
  Locked l{open_locked(path_, true)};
  std::vector<Entry> v = read_entries(l.fd);
  const int64_t me = ::getpid();
  *look = look_at(v, mps, owner);
  const bool fits = look->held + blocks <= capacity;
  std::vector<Entry> keep;
  for (const Entry& e : v)
    if (!(e.pid == me && e.owner == owner)) keep.push_back(e);
  if (fits) {
    Entry e;
    e.pid = me;
    e.start = start_time(me);
    e.owner = owner;
    e.mps = mps ? 1 : 0;
    e.blocks = blocks;
    e.rank = rank;
    e.world = world;
    e.ns = pid_namespace();
    keep.push_back(e);
  }
  write_entries(l.fd, path_, keep);
  return fits;
}

void GpuLedger::release(uint64_t owner) {
  Locked l{open_locked(path_, false)};
  if (l.fd < 0) return;
  std::vector<Entry> v = read_entries(l.fd);
  const int64_t me = ::getpid();
  std::vector<Entry> keep;
  for (const Entry& e : v)
    if (!(e.pid == me && e.owner == owner)) keep.push_back(e);
  write_entries(l.fd, path_, keep);
}

}  // namespace rc
