#include "comm/header_exchange.h"

#include <limits>
#include <sstream>

#include "comm/coll.h"
#include "comm/selection.h"
#include "common/dtype.h"
#include "transport/shm_types.h"

namespace rc {

uint32_t abort_kind_of(ErrorCode code) {
  // A peer's Mismatch or Timeout is the same kind on every rank; any other failure is, seen from
  // the peers, a failed peer.
  const bool shared = code == ErrorCode::kMismatch || code == ErrorCode::kTimeout;
  return static_cast<uint32_t>(shared ? code : ErrorCode::kPeerFailure);
}

std::string describe_header(const CollHeader& h) {
  std::ostringstream o;
  Coll c = static_cast<Coll>(h.coll);
  o << coll_name(c);
  if (c == Coll::kBarrier || c == Coll::kRejected) return o.str();
  o << "(count=" << h.count;
  if (c == Coll::kAllGather || c == Coll::kAllToAll) o << ", count2=" << h.count2;
  o << ", dtype=" << dtype_name(static_cast<DType>(h.dtype));
  if (coll_reduces(c)) o << ", op=" << op_name(static_cast<ReduceOp>(h.op));
  if (h.root >= 0) o << ", root=" << h.root;
  o << ", algo=" << algo_name_of(h.algo) << ", proto=" << proto_name_of(h.proto) << ", store=" << store_name_of(h.store);
  o << ")";
  return o.str();
}

void exchange_headers(ShmControl& t, int rank, int world, uint64_t seq, Coll coll, const CollHeader& mine,
                      std::vector<CollHeader>& all, const HeaderHooks& hooks, ExchangeSeq xs) {
  all.assign(static_cast<size_t>(world), CollHeader{});
  all[rank] = mine;
  if (world == 1) {
    if (coll == Coll::kRejected) throw HeaderMismatch("ringcomm: rejected call");
    return;
  }
  if (hooks.before_post) hooks.before_post();
  const uint64_t board_seq = xs.board_seq != 0 ? xs.board_seq : seq;
  t.post_header(board_seq, header_blob(mine));
  WaitCtx w;
  w.op = coll_name(coll);
  w.seq = seq;
  auto routed = [&](const std::string& why) {
    std::ostringstream o;
    o << "ringcomm: " << coll_name(coll) << " (seq " << seq << ") on rank " << rank << ": " << why
      << "; the ranks are out of step and the communicator is broken";
    throw RoutingMismatch(o.str());
  };
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    bool fused = false;
    all[p] = coll_header(t.wait_header(p, board_seq, w, nullptr, xs.watch_fused ? seq : 0, &fused));
    if (fused) {
      const std::string here = coll == Coll::kRejected
                                   ? "rejected its arguments (its own error says why)"
                                   : "called " + describe_header(mine) + " on the host-ordered path";
      routed("rank " + std::to_string(p) + " ran this call on the device ring without a header exchange while this "
             "rank " + here + " (different collectives, or an all_gather whose contributions differ between ranks)");
    }
  }
  for (int p = 0; p < world; ++p) {
    if (all[p].seq != static_cast<uint32_t>(seq)) {
      routed("rank " + std::to_string(p) + " posted its header for collective seq " + std::to_string(all[p].seq) +
             " (mod 2^32) against this rank's " + std::to_string(static_cast<uint32_t>(seq)) +
             ": a call ran on the device ring on some ranks only");
    }
  }
  auto fail = [&](const std::string& why) {
    std::ostringstream o;
    o << "ringcomm: " << coll_name(coll) << " (seq " << seq << ") on rank " << rank << ": " << why;
    if (hooks.on_mismatch) hooks.on_mismatch(all);
    throw HeaderMismatch(o.str());
  };
  for (int p = 0; p < world; ++p) {
    if (static_cast<Coll>(all[p].coll) == Coll::kRejected) {
      fail("rank " + std::to_string(p) + " rejected its arguments (its own error says why); every rank raises");
    }
  }
  // Range checks of every field a peer sent, before any of them is used: counts non-negative and
  // small enough that sums and byte sizes cannot overflow, roots within the world. Every rank
  // checks the same headers, so every rank raises alike.
  constexpr int64_t kMaxCount = (std::numeric_limits<int64_t>::max() / 16) / 65536;
  for (int p = 0; p < world; ++p) {
    const CollHeader& h = all[p];
    const bool ok = h.count >= 0 && h.count <= kMaxCount && h.count2 >= 0 && h.count2 <= kMaxCount &&
                    h.root >= -1 && h.root < world;
    if (!ok) {
      fail("rank " + std::to_string(p) + "'s header is out of range: " + describe_header(h) +
           " (counts must be in [0, " + std::to_string(kMaxCount) + "], root in [-1, " + std::to_string(world) +
           "))");
    }
  }
  const CollHeader& h0 = all[0];
  const Coll c0 = static_cast<Coll>(h0.coll);
  for (int p = 1; p < world; ++p) {
    const CollHeader& h = all[p];
    bool same = h.coll == h0.coll && h.dtype == h0.dtype && h.op == h0.op && h.root == h0.root &&
                h.algo == h0.algo && h.proto == h0.proto && h.store == h0.store;
    if (same && c0 != Coll::kAllToAll) same = h.count == h0.count;
    if (!same) {
      fail("ranks called different collectives or arguments: rank 0 called " + describe_header(h0) + ", rank " +
           std::to_string(p) + " called " + describe_header(h));
    }
  }
  if (c0 == Coll::kAllGather) {
    int64_t sum = 0;
    for (auto& h : all) sum += h.count2;
    if (sum != h0.count) {
      fail("all_gather inputs total " + std::to_string(sum) + " elements across ranks but the output holds " +
           std::to_string(h0.count));
    }
  } else if (c0 == Coll::kAllToAll) {
    int64_t in = 0, out = 0;
    for (auto& h : all) {
      in += h.count;
      out += h.count2;
    }
    if (in != out) {
      fail("all_to_all inputs total " + std::to_string(in) + " elements across ranks but outputs total " +
           std::to_string(out));
    }
  }
}

}  // namespace rc
