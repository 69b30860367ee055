// Validation of one rank's collective arguments and the header it posts: one set of rules for
// every communicator (host and CUDA), run before the header exchange. A rank whose arguments
// fail them joins the exchange as a rejection (CommCore::reject), so every rank raises.
//
// Overlap rules (the algorithms rely on them: their local copies take equal or disjoint ranges):
//  - all_reduce / reduce: input and output are the same buffer or disjoint;
//  - reduce_scatter: the output is this rank's own chunk of the input, or disjoint from it;
//  - all_gather: the input is this rank's own block of the output (checked once every rank's
//    count is known: check_all_gather_block), or disjoint from it;
//  - gather (root) / scatter (root): the root's input / output is its own block, or disjoint;
//  - all_to_all: input and output are disjoint (the Python layer passes a copy otherwise).
// The memory kind of a buffer (host, or device memory of the communicator's GPU) is the one
// thing a communicator checks itself: MemoryCheck.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/coll.h"
#include "comm/coll_header.h"
#include "common/dtype.h"

namespace rc {

/// Where a communicator's buffers must live. check() throws InvalidArgument naming `what`.
class MemoryCheck {
 public:
  virtual ~MemoryCheck() = default;
  virtual void check(const void* p, const char* what, const char* op) const = 0;
};

class ArgChecks {
 public:
  ArgChecks(int rank, int world, const MemoryCheck* mem) : rank_(rank), world_(world), mem_(mem) {}

  CollHeader all_reduce(const void* in, const void* out, int64_t count, DType dt, ReduceOp op) const;
  CollHeader reduce_scatter(const void* in, const void* out, int64_t in_count, DType dt, ReduceOp op) const;
  CollHeader all_gather(const void* in, const void* out, int64_t in_count, int64_t out_count, DType dt) const;
  CollHeader broadcast(const void* buf, int64_t count, DType dt, int root) const;
  CollHeader reduce(const void* in, const void* out, int64_t count, DType dt, ReduceOp op, int root) const;
  CollHeader all_to_all(const void* in, const void* out, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts, DType dt) const;
  CollHeader gather(const void* in, const void* out, int64_t count, DType dt, int root) const;
  CollHeader scatter(const void* in, const void* out, int64_t count, DType dt, int root) const;
  /// A send or receive of `bytes` to/from `peer`.
  void p2p(const void* buf, int64_t bytes, int peer, bool is_send) const;

 private:
  void buffer(const void* p, int64_t count, const char* what, Coll coll) const;
  void root(int root, Coll coll) const;
  /// gather / scatter: `block` (count elements, every rank) is this rank's own block; `all`
  /// (count * world elements, the root only) holds every rank's block in rank order.
  CollHeader rooted(Coll coll, const void* block, const char* block_what, const void* all, const char* all_what,
                    int64_t count, DType dt, int root) const;
  int rank_, world_;
  const MemoryCheck* mem_;
};

/// all_gather, after the header exchange: an input inside the output must be exactly this rank's
/// block of it (counts: every rank's contribution). Throws InvalidArgument.
void check_all_gather_block(int rank, const void* in, const void* out, const std::vector<int64_t>& counts,
                            int64_t out_count, size_t esize);

/// Element offsets of the blocks of a split (exclusive prefix sums).
std::vector<int64_t> split_offsets(const std::vector<int64_t>& counts);

}  // namespace rc
