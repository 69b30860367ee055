// The one dispatch table: (collective, algorithm, protocol) -> the body that runs the collective's
// data phase, and the first hand-off that runs before the header is posted for the protocols that
// send before it (header_in_slot, ll; comm/selection.h: sent_before_header). The communicator
// core looks a call's route up once, from the selection in its header, and runs it.
#pragma once
#include <cstdint>
#include <vector>

#include "algo/context.h"
#include "comm/coll.h"
#include "comm/coll_header.h"
#include "comm/selection.h"
#include "common/dtype.h"

namespace rc {

/// A collective's arguments as the caller gave them (after the local checks).
struct CollArgs {
  const void* in = nullptr;
  void* out = nullptr;     ///< broadcast: the buffer
  int64_t count = 0;       ///< elements: all_reduce, broadcast, reduce, gather, scatter; reduce_scatter and all_gather: the input's
  int64_t out_count = 0;   ///< all_gather: the output's elements
  ReduceOp op = ReduceOp::kSum;
  int root = -1;
  std::vector<int64_t> send_counts, recv_counts;  ///< all_to_all
};

/// The data phase; `headers` are every rank's, checked to agree (all_gather reads the counts).
using BodyFn = void (*)(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>& headers);
/// The hand-off before the header `mine` (this rank's) is posted.
using FirstFn = void (*)(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine);

struct Route {
  Coll coll;
  Algo algo;
  Proto proto;
  BodyFn body;
  FirstFn first;  ///< nullptr: nothing goes before the header
};

/// The route of (coll, algo, proto); every pair select() returns has one. Throws rc::Error for
/// a pair the table lacks (a programming error).
const Route& route_of(Coll coll, Algo algo, Proto proto);

}  // namespace rc
