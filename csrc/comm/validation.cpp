#include "comm/validation.h"

#include "algo/ring_schedule.h"
#include "common/errors.h"
#include "kernels/reduce_cpu.h"

namespace rc {

namespace {

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

size_t nbytes(int64_t count, DType dt) { return static_cast<size_t>(count) * dtype_size(dt); }

CollHeader header(Coll coll, DType dt, uint32_t op, int root, int64_t count, int64_t count2) {
  CollHeader h;
  h.coll = static_cast<uint32_t>(coll);
  h.dtype = static_cast<uint32_t>(dt);
  h.op = op;
  h.root = root;
  h.count = count;
  h.count2 = count2;
  return h;
}

}  // namespace

void ArgChecks::buffer(const void* p, int64_t count, const char* what, Coll coll) const {
  RC_CHECK(count >= 0, InvalidArgument, "ringcomm: " << coll_name(coll) << ": negative element count " << count);
  if (count == 0) return;
  RC_CHECK(p != nullptr, InvalidArgument, "ringcomm: " << coll_name(coll) << ": " << what << " buffer is null");
  if (mem_ != nullptr) mem_->check(p, what, coll_name(coll));
}

void ArgChecks::root(int root, Coll coll) const {
  RC_CHECK(root >= 0 && root < world_, InvalidArgument,
           "ringcomm: " << coll_name(coll) << ": root " << root << " is out of range [0, " << world_ << ")");
}

CollHeader ArgChecks::all_reduce(const void* in, const void* out, int64_t count, DType dt, ReduceOp op) const {
  dtype_size(dt);
  buffer(in, count, "input", Coll::kAllReduce);
  buffer(out, count, "output", Coll::kAllReduce);
  check_reduce_supported(dt, op);
  const size_t b = nbytes(count, dt);
  RC_CHECK(in == out || !overlaps(in, b, out, b), InvalidArgument,
           "ringcomm: all_reduce: input and output overlap partially");
  return header(Coll::kAllReduce, dt, static_cast<uint32_t>(op), -1, count, 0);
}

CollHeader ArgChecks::reduce_scatter(const void* in, const void* out, int64_t in_count, DType dt, ReduceOp op) const {
  dtype_size(dt);
  const int64_t own = in_count >= 0 ? ring::chunk_count(in_count, world_, rank_) : 0;
  buffer(in, in_count, "input", Coll::kReduceScatter);
  buffer(out, own, "output", Coll::kReduceScatter);
  check_reduce_supported(dt, op);
  const char* own_in = static_cast<const char*>(in) + ring::chunk_offset(in_count, world_, rank_) * dtype_size(dt);
  RC_CHECK(out == own_in || !overlaps(in, nbytes(in_count, dt), out, nbytes(own, dt)), InvalidArgument,
           "ringcomm: reduce_scatter: the output overlaps the input (it may only be this rank's own chunk of it)");
  return header(Coll::kReduceScatter, dt, static_cast<uint32_t>(op), -1, in_count, 0);
}

CollHeader ArgChecks::all_gather(const void* in, const void* out, int64_t in_count, int64_t out_count,
                                 DType dt) const {
  dtype_size(dt);
  buffer(in, in_count, "input", Coll::kAllGather);
  buffer(out, out_count, "output", Coll::kAllGather);
  RC_CHECK(in_count <= out_count, InvalidArgument,
           "ringcomm: all_gather: input has " << in_count << " elements but the output only " << out_count);
  const size_t es = dtype_size(dt);
  if (overlaps(in, nbytes(in_count, dt), out, nbytes(out_count, dt))) {
    // In place: the input must be an element-aligned slice of the output (its own block, checked
    // against every rank's count once the headers are in: check_all_gather_block).
    const uintptr_t d = reinterpret_cast<uintptr_t>(in) - reinterpret_cast<uintptr_t>(out);
    RC_CHECK(in >= out && d % es == 0 && d / es + static_cast<uint64_t>(in_count) <= static_cast<uint64_t>(out_count),
             InvalidArgument, "ringcomm: all_gather: the input overlaps the output without being a slice of it");
  }
  return header(Coll::kAllGather, dt, 0, -1, out_count, in_count);
}

CollHeader ArgChecks::broadcast(const void* buf, int64_t count, DType dt, int root) const {
  dtype_size(dt);
  buffer(buf, count, "the", Coll::kBroadcast);
  this->root(root, Coll::kBroadcast);
  return header(Coll::kBroadcast, dt, 0, root, count, 0);
}

CollHeader ArgChecks::reduce(const void* in, const void* out, int64_t count, DType dt, ReduceOp op, int root) const {
  dtype_size(dt);
  buffer(in, count, "input", Coll::kReduce);
  this->root(root, Coll::kReduce);
  if (rank_ == root) {
    buffer(out, count, "output", Coll::kReduce);
    const size_t b = nbytes(count, dt);
    RC_CHECK(in == out || !overlaps(in, b, out, b), InvalidArgument,
             "ringcomm: reduce: input and output overlap partially");
  }
  check_reduce_supported(dt, op);
  return header(Coll::kReduce, dt, static_cast<uint32_t>(op), root, count, 0);
}

CollHeader ArgChecks::all_to_all(const void* in, const void* out, const std::vector<int64_t>& send_counts,
                                 const std::vector<int64_t>& recv_counts, DType dt) const {
  dtype_size(dt);
  RC_CHECK(static_cast<int>(send_counts.size()) == world_ && static_cast<int>(recv_counts.size()) == world_,
           InvalidArgument, "ringcomm: all_to_all: split lists need " << world_ << " entries, got "
                                                                       << send_counts.size() << " and "
                                                                       << recv_counts.size());
  int64_t in_total = 0, out_total = 0;
  for (int p = 0; p < world_; ++p) {
    RC_CHECK(send_counts[p] >= 0 && recv_counts[p] >= 0, InvalidArgument, "ringcomm: all_to_all: negative split size");
    in_total += send_counts[p];
    out_total += recv_counts[p];
  }
  // The block to itself is copied locally: its two sizes must agree. Raised as Mismatch before
  // the header exchange (this rank joins it as a rejection), so every rank raises MismatchError
  // and no slot moves: the communicator stays usable.
  RC_CHECK(send_counts[rank_] == recv_counts[rank_], Mismatch,
           "ringcomm: all_to_all on rank " << rank_ << ": sends " << send_counts[rank_]
                                           << " elements to itself but expects " << recv_counts[rank_]
                                           << " (input_splits[rank] must equal output_splits[rank])");
  buffer(in, in_total, "input", Coll::kAllToAll);
  buffer(out, out_total, "output", Coll::kAllToAll);
  RC_CHECK(!overlaps(in, nbytes(in_total, dt), out, nbytes(out_total, dt)), InvalidArgument,
           "ringcomm: all_to_all: input and output overlap (pass a copy of the input)");
  return header(Coll::kAllToAll, dt, 0, -1, in_total, out_total);
}

CollHeader ArgChecks::rooted(Coll coll, const void* block, const char* block_what, const void* all,
                             const char* all_what, int64_t count, DType dt, int root) const {
  dtype_size(dt);
  buffer(block, count, block_what, coll);
  this->root(root, coll);
  if (rank_ == root) {
    buffer(all, count * world_, all_what, coll);
    const size_t b = nbytes(count, dt);
    const char* own = static_cast<const char*>(all) + rank_ * b;
    RC_CHECK(block == own || !overlaps(block, b, all, b * world_), InvalidArgument,
             "ringcomm: " << coll_name(coll) << ": the " << block_what << " overlaps the " << all_what
                          << " without being the root's own block");
  }
  return header(coll, dt, 0, root, count, 0);
}

CollHeader ArgChecks::gather(const void* in, const void* out, int64_t count, DType dt, int root) const {
  return rooted(Coll::kGather, in, "input", out, "output", count, dt, root);
}

CollHeader ArgChecks::scatter(const void* in, const void* out, int64_t count, DType dt, int root) const {
  return rooted(Coll::kScatter, out, "output", in, "input", count, dt, root);
}

void ArgChecks::p2p(const void* buf, int64_t bytes, int peer, bool is_send) const {
  const char* name = is_send ? "send" : "recv";
  // A receive may name peer -1: any source (P2PEngine's kAnySource).
  RC_CHECK((peer >= 0 && peer < world_ && peer != rank_) || (!is_send && peer == -1), InvalidArgument,
           "ringcomm: " << name << ": peer " << peer << " is not another rank of this communicator (rank " << rank_
                        << ", world size " << world_ << ")");
  RC_CHECK(bytes >= 0 && (bytes == 0 || buf != nullptr), InvalidArgument, "ringcomm: " << name << ": bad buffer");
  if (bytes > 0 && mem_ != nullptr) mem_->check(buf, "message", name);
}

void check_all_gather_block(int rank, const void* in, const void* out, const std::vector<int64_t>& counts,
                            int64_t out_count, size_t esize) {
  int64_t before = 0;
  for (int p = 0; p < rank; ++p) before += counts[p];
  const int64_t in_count = counts[rank];
  if (overlaps(in, static_cast<size_t>(in_count) * esize, out, static_cast<size_t>(out_count) * esize) &&
      static_cast<const char*>(in) != static_cast<const char*>(out) + before * esize) {
    RC_THROW(InvalidArgument, "ringcomm: all_gather on rank " << rank << ": the input is a slice of the output but "
                                                             << "not this rank's block (elements " << before << ".."
                                                             << before + in_count << ")");
  }
}

std::vector<int64_t> split_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t p = 1; p < counts.size(); ++p) off[p] = off[p - 1] + counts[p - 1];
  return off;
}

}  // namespace rc
