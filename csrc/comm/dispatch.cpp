#include "comm/dispatch.h"

#include <algorithm>

#include "comm/validation.h"
#include "common/errors.h"

namespace rc {

namespace {

const char* in_of(const CollArgs& a) { return static_cast<const char*>(a.in); }
char* out_of(const CollArgs& a) { return static_cast<char*>(a.out); }

void ar_ring(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ring_all_reduce(c, in_of(a), out_of(a), a.count, a.op);
}
void ar_ring_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ring_all_reduce(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/true);
}
void ar_ring_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) {
  ring_send_first(c, in_of(a), a.count, /*all_reduce=*/true);
}
void ar_direct(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_all_reduce(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/false);
}
void ar_direct_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_all_reduce(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/true);
}
void ar_two_shot(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  two_shot_all_reduce(c, in_of(a), out_of(a), a.count, a.op);
}
void ar_halving_doubling(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  halving_doubling_all_reduce(c, in_of(a), out_of(a), a.count, a.op);
}
void ar_ll(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ll_all_reduce(c, in_of(a), out_of(a), a.count, a.op);
}
void ar_direct_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) { direct_send_first(c, in_of(a), a.count); }
void ar_ll_first(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine) {
  ll_send_first(c, header_blob(mine), a.in, a.count);
}

void rs_ring(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ring_reduce_scatter(c, in_of(a), out_of(a), a.count, a.op);
}
void rs_ring_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ring_reduce_scatter(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/true);
}
void rs_ring_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) {
  ring_send_first(c, in_of(a), a.count, /*all_reduce=*/false);
}
void rs_direct(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_reduce_scatter(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/false);
}
void rs_direct_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_reduce_scatter(c, in_of(a), out_of(a), a.count, a.op, /*first_sent=*/true);
}
void rs_direct_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) {
  direct_reduce_scatter_send_first(c, in_of(a), a.count);
}
void rs_ll(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ll_reduce_scatter(c, in_of(a), out_of(a), a.count, a.op);
}
void rs_ll_first(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine) {
  ll_reduce_scatter_send_first(c, header_blob(mine), a.in, a.count);
}

void ag_ring(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>& hs) {
  // Every rank's contribution size is known only from the headers.
  std::vector<int64_t> counts(c.world, 0);
  for (int p = 0; p < c.world; ++p) counts[p] = hs[p].count2;
  check_all_gather_block(c.rank, a.in, a.out, counts, a.out_count, c.esize);
  ring_all_gather(c, in_of(a), out_of(a), counts);
}
void ag_ring_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>& hs) {
  std::vector<int64_t> counts(c.world, 0);
  for (int p = 0; p < c.world; ++p) counts[p] = hs[p].count2;
  check_all_gather_block(c.rank, a.in, a.out, counts, a.out_count, c.esize);
  ring_all_gather(c, in_of(a), out_of(a), counts, /*first_sent=*/true);
}
// Called iff this rank's header says its block is not empty (slot_before_header); the slot
// holds at most the input's own elements, whatever the header claims.
void ag_ring_first(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine) {
  ring_all_gather_send_first(c, in_of(a), std::min(mine.count2, a.count), mine.count);
}

void bc_chain(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  chain_broadcast(c, out_of(a), a.count, a.root);
}
void bc_chain_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  chain_broadcast(c, out_of(a), a.count, a.root, /*first_sent=*/c.rank == a.root);
}
// Only the root, the chain's head, sends first (slot_before_header).
void bc_chain_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) {
  if (c.rank == a.root) chain_send_first(c, out_of(a), a.count);
}
void bc_direct_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_broadcast(c, out_of(a), a.count, a.root, /*first_sent=*/c.rank == a.root);
}
void bc_ll(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ll_broadcast(c, out_of(a), a.count, a.root);
}
// Only the root's header_in_slot header says it sent first (slot_before_header).
void bc_direct_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) { direct_send_first(c, out_of(a), a.count); }
// Every rank writes its header to its outbox; only the root's carries the message.
void bc_ll_first(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine) {
  ll_send_first(c, header_blob(mine), a.out, c.rank == a.root ? a.count : 0);
}

void bc_cma(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  cma_broadcast(c, out_of(a), a.count, a.root);
}
// Every rank publishes its buffer; only the root's is read.
void bc_cma_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) { cma_publish(c, a.out); }

void reduce_chain(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  chain_reduce(c, in_of(a), out_of(a), a.count, a.op, a.root);
}
bool reduce_chain_head(const AlgoCtx& c, const CollArgs& a) { return c.rank == (a.root + 1) % c.world; }
void reduce_chain_after_first(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  chain_reduce(c, in_of(a), out_of(a), a.count, a.op, a.root, /*first_sent=*/reduce_chain_head(c, a));
}
// Only rank root+1, the chain's head, sends first (slot_before_header).
void reduce_chain_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) {
  if (reduce_chain_head(c, a)) chain_send_first(c, in_of(a), a.count);
}
void reduce_ll(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  ll_reduce(c, in_of(a), out_of(a), a.count, a.op, a.root);
}
// Every rank writes its header to its outbox; only the non-roots' carry their input.
void reduce_ll_first(const AlgoCtx& c, const CollArgs& a, const CollHeader& mine) {
  ll_send_first(c, header_blob(mine), a.in, c.rank == a.root ? 0 : a.count);
}
void a2a_direct(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_all_to_all(c, in_of(a), out_of(a), a.send_counts, split_offsets(a.send_counts), a.recv_counts,
                    split_offsets(a.recv_counts));
}
// Every rank's header says whether its blocks qualify; the call reads in place iff all do, else
// it is the simple protocol's exchange (the same decision on every rank, from the same headers).
void a2a_cma(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>& hs) {
  if (cma_all_to_all_agreed(hs)) {
    cma_all_to_all(c, in_of(a), out_of(a), a.send_counts[0]);
  } else {
    if (c.trace != nullptr) c.trace->proto = proto_name(Proto::kSimple);  // the trace names what ran
    a2a_direct(c, a, hs);
  }
}
void in_cma_first(const AlgoCtx& c, const CollArgs& a, const CollHeader&) { cma_publish(c, a.in); }
void ag_cma(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>& hs) {
  std::vector<int64_t> counts(c.world, 0);
  for (int p = 0; p < c.world; ++p) counts[p] = hs[p].count2;
  check_all_gather_block(c.rank, a.in, a.out, counts, a.out_count, c.esize);
  cma_all_gather(c, in_of(a), out_of(a), counts);
}
void gather_direct(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_gather(c, in_of(a), out_of(a), a.count, a.root);
}
void scatter_direct(const AlgoCtx& c, const CollArgs& a, const std::vector<CollHeader>&) {
  direct_scatter(c, in_of(a), out_of(a), a.count, a.root);
}
// Barrier and rejected calls: the header exchange is the whole call.
void nothing(const AlgoCtx&, const CollArgs&, const std::vector<CollHeader>&) {}

const Route kRoutes[] = {
    {Coll::kAllReduce, Algo::kRing, Proto::kSimple, ar_ring, nullptr},
    {Coll::kAllReduce, Algo::kRing, Proto::kHeaderInSlot, ar_ring_after_first, ar_ring_first},
    {Coll::kAllReduce, Algo::kDirect, Proto::kSimple, ar_direct, nullptr},
    {Coll::kAllReduce, Algo::kDirect, Proto::kHeaderInSlot, ar_direct_after_first, ar_direct_first},
    {Coll::kAllReduce, Algo::kDirect, Proto::kLL, ar_ll, ar_ll_first},
    {Coll::kAllReduce, Algo::kTwoShot, Proto::kSimple, ar_two_shot, nullptr},
    {Coll::kAllReduce, Algo::kHalvingDoubling, Proto::kSimple, ar_halving_doubling, nullptr},
    {Coll::kReduceScatter, Algo::kRing, Proto::kSimple, rs_ring, nullptr},
    {Coll::kReduceScatter, Algo::kRing, Proto::kHeaderInSlot, rs_ring_after_first, rs_ring_first},
    {Coll::kReduceScatter, Algo::kDirect, Proto::kSimple, rs_direct, nullptr},
    {Coll::kReduceScatter, Algo::kDirect, Proto::kHeaderInSlot, rs_direct_after_first, rs_direct_first},
    {Coll::kReduceScatter, Algo::kDirect, Proto::kLL, rs_ll, rs_ll_first},
    {Coll::kAllGather, Algo::kRing, Proto::kSimple, ag_ring, nullptr},
    {Coll::kAllGather, Algo::kRing, Proto::kHeaderInSlot, ag_ring_after_first, ag_ring_first},
    {Coll::kAllGather, Algo::kDirect, Proto::kCMA, ag_cma, in_cma_first},
    {Coll::kBroadcast, Algo::kChain, Proto::kSimple, bc_chain, nullptr},
    {Coll::kBroadcast, Algo::kChain, Proto::kHeaderInSlot, bc_chain_after_first, bc_chain_first},
    {Coll::kBroadcast, Algo::kDirect, Proto::kHeaderInSlot, bc_direct_after_first, bc_direct_first},
    {Coll::kBroadcast, Algo::kDirect, Proto::kLL, bc_ll, bc_ll_first},
    {Coll::kBroadcast, Algo::kDirect, Proto::kCMA, bc_cma, bc_cma_first},
    {Coll::kReduce, Algo::kChain, Proto::kSimple, reduce_chain, nullptr},
    {Coll::kReduce, Algo::kChain, Proto::kHeaderInSlot, reduce_chain_after_first, reduce_chain_first},
    {Coll::kReduce, Algo::kDirect, Proto::kLL, reduce_ll, reduce_ll_first},
    {Coll::kAllToAll, Algo::kDirect, Proto::kSimple, a2a_direct, nullptr},
    {Coll::kAllToAll, Algo::kDirect, Proto::kCMA, a2a_cma, in_cma_first},
    {Coll::kGather, Algo::kDirect, Proto::kSimple, gather_direct, nullptr},
    {Coll::kScatter, Algo::kDirect, Proto::kSimple, scatter_direct, nullptr},
    {Coll::kBarrier, Algo::kNone, Proto::kNone, nothing, nullptr},
    {Coll::kRejected, Algo::kNone, Proto::kNone, nothing, nullptr},
};

}  // namespace

const Route& route_of(Coll coll, Algo algo, Proto proto) {
  for (const Route& r : kRoutes)
    if (r.coll == coll && r.algo == algo && r.proto == proto) return r;
  RC_THROW(Error, "ringcomm: no route for " << coll_name(coll) << " with algorithm " << algo_name(algo)
                  << " and protocol " << proto_name(proto));
}

}  // namespace rc
