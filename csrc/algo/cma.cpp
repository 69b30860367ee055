// The single-copy collectives (algo/context.h; the protocol: transport/shm_cma.h). Every reader
// copies each byte once, from the owner's buffer into its output; readers start at different
// peers (rank + 1, rank + 2, ...) so that the owners' pages are not all read by everyone at once.
#include "algo/context.h"
#include "common/errors.h"
#include "transport/shm_cma.h"

namespace rc {

namespace {

WaitCtx wait_of(const AlgoCtx& c, const char* what) {
  WaitCtx w;
  w.op = c.op;
  w.seq = c.seq;
  w.what = what;
  return w;
}

ShmCma& cma_of(const AlgoCtx& c) {
  RC_CHECK(c.cma != nullptr, Error, "ringcomm: " << c.op << " (seq " << c.seq << ") on rank " << c.rank
                                                 << ": the cma protocol was selected without single-copy reads");
  return *c.cma;
}

}  // namespace

void cma_publish(const AlgoCtx& c, const void* buf) { cma_of(c).publish(buf); }

void cma_all_to_all(const AlgoCtx& c, const char* in, char* out, int64_t block) {
  ShmCma& m = cma_of(c);
  const size_t b = static_cast<size_t>(block) * c.esize;
  m.copy_own(out + static_cast<size_t>(c.rank) * b, in + static_cast<size_t>(c.rank) * b, b);
  const WaitCtx w = wait_of(c, "single-copy read");
  for (int i = 1; i < c.world; ++i) {
    const int p = (c.rank + i) % c.world;
    // Peer p's block for this rank sits at rank x block of its input (every split is `block`).
    m.read(p, m.peer_buf(p) + static_cast<uint64_t>(c.rank) * b, out + static_cast<size_t>(p) * b, b, w);
  }
  m.finish(wait_of(c, "reads of this rank's buffer"), [](int) { return true; });
}

void cma_all_gather(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts) {
  ShmCma& m = cma_of(c);
  std::vector<size_t> off(c.world + 1, 0);
  for (int p = 0; p < c.world; ++p) off[p + 1] = off[p] + static_cast<size_t>(counts[p]) * c.esize;
  const size_t own = off[c.rank + 1] - off[c.rank];
  // In place, `in` is this rank's slice of `out` already; peers read it while this rank writes
  // the other slices only.
  if (own > 0 && in != out + off[c.rank]) m.copy_own(out + off[c.rank], in, own);
  const WaitCtx w = wait_of(c, "single-copy read");
  for (int i = 1; i < c.world; ++i) {
    const int p = (c.rank + i) % c.world;
    const size_t n = off[p + 1] - off[p];
    if (n > 0) m.read(p, m.peer_buf(p), out + off[p], n, w);
  }
  m.finish(wait_of(c, "reads of this rank's buffer"), [](int) { return true; });
}

// The copying is shared out evenly: every non-root reads the first (N-1)/N of the message from
// the root's buffer, and the root writes the last 1/N into every non-root's buffer (each peer
// published its own), so every rank copies (N-1)/N of the message once. A non-root's call ends
// after the root's finish (its writes are in), the root's after every non-root's.
void cma_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root) {
  ShmCma& m = cma_of(c);
  const size_t bytes = static_cast<size_t>(count) * c.esize;
  const size_t tail = bytes / static_cast<size_t>(c.world) / 64 * 64;  // the root's share, whole lines
  const size_t head = bytes - tail;
  if (c.rank != root) {
    m.read(root, m.peer_buf(root), buf, head, wait_of(c, "single-copy read"));
  } else if (tail > 0) {
    const WaitCtx w = wait_of(c, "single-copy write");
    for (int i = 1; i < c.world; ++i) {
      const int p = (c.rank + i) % c.world;
      m.write(p, m.peer_buf(p) + head, buf + head, tail, w);
    }
  }
  const bool is_root = c.rank == root;
  m.finish(wait_of(c, "peers' copies of this rank's buffer"), [is_root, root](int p) { return is_root || p == root; });
}

}  // namespace rc
