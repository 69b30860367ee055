#include "comm/selection.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "algo/ring_schedule.h"
#include "common/dtype.h"
#include "common/errors.h"

namespace rc {

#define RC_SEL_NAME_CASE_(name, code, str) \
  case code:                               \
    return str;
const char* algo_name_of(uint8_t code) {
  switch (code) { RC_ALGORITHMS(RC_SEL_NAME_CASE_) }
  return "?";
}
const char* proto_name_of(uint8_t code) {
  switch (code) { RC_PROTOCOLS(RC_SEL_NAME_CASE_) }
  return "?";
}
const char* store_name_of(uint8_t code) {
  switch (code) { RC_STORES(RC_SEL_NAME_CASE_) }
  return "?";
}
#undef RC_SEL_NAME_CASE_
const char* algo_name(Algo a) { return algo_name_of(static_cast<uint8_t>(a)); }
const char* proto_name(Proto p) { return proto_name_of(static_cast<uint8_t>(p)); }
const char* store_name(Store s) { return store_name_of(static_cast<uint8_t>(s)); }

SelectionKnobs SelectionKnobs::from_knobs(const Knobs& env) {
  SelectionKnobs k;
  const std::string& algo = env.algo;
  k.algo = algo == "ring" ? Forced::kRing : algo == "direct" ? Forced::kDirect
         : algo == "two_shot" ? Forced::kTwoShot : algo == "halving_doubling" ? Forced::kHalvingDoubling
         : Forced::kAuto;
  k.direct_max_bytes = env.direct_max_bytes;
  k.two_shot_max_bytes = env.two_shot_max_bytes;
  k.two_shot_min_world = env.two_shot_min_world;
  k.model_min_world = env.model_min_world;
  RC_CHECK(k.model_min_world >= 2, InvalidArgument,
           "ringcomm: RINGCOMM_MODEL_MIN_WORLD must be >= 2, got " << k.model_min_world);
  k.profile = profile_at(env.profile);
  RC_CHECK(k.direct_max_bytes >= 0, InvalidArgument,
           "ringcomm: RINGCOMM_DIRECT_MAX_BYTES must be >= 0, got " << k.direct_max_bytes);
  RC_CHECK(k.two_shot_max_bytes >= 0, InvalidArgument,
           "ringcomm: RINGCOMM_TWO_SHOT_MAX_BYTES must be >= 0, got " << k.two_shot_max_bytes);
  k.header_in_slot = env.header_in_slot == "on";
  const std::string& stream = env.stream;
  k.stream = stream == "on"      ? Stream::kOn
             : stream == "off"   ? Stream::kOff
             : stream == "adapt" ? Stream::kAdapt
                                 : Stream::kAuto;
  k.cma_min_bytes = env.cma_min_bytes;
  RC_CHECK(k.cma_min_bytes >= 0, InvalidArgument,
           "ringcomm: RINGCOMM_CMA_MIN_BYTES must be >= 0, got " << k.cma_min_bytes);
  k.cma_broadcast_min_bytes = env.cma_broadcast_min_bytes;
  RC_CHECK(k.cma_broadcast_min_bytes >= 0, InvalidArgument,
           "ringcomm: RINGCOMM_CMA_BROADCAST_MIN_BYTES must be >= 0, got " << k.cma_broadcast_min_bytes);
  k.stream_min_bytes = env.stream_min_bytes;
  RC_CHECK(k.stream_min_bytes >= 0, InvalidArgument,
           "ringcomm: RINGCOMM_STREAM_MIN_BYTES must be >= 0, got " << k.stream_min_bytes);
  k.stream_adapt_min_bytes = env.stream_adapt_min_bytes;
  RC_CHECK(k.stream_adapt_min_bytes > 0, InvalidArgument,
           "ringcomm: RINGCOMM_STREAM_ADAPT_MIN_BYTES must be > 0, got " << k.stream_adapt_min_bytes);
  return k;
}

namespace {

// The all-reduce algorithm over slots: forced by RINGCOMM_ALGO, or auto's size rule (the measured
// thresholds; the cost model replaces it for all_reduce from RINGCOMM_MODEL_MIN_WORLD ranks). The
// direct range is bytes x (world-1) <= RINGCOMM_DIRECT_MAX_BYTES (the bytes each rank copies in
// and combines beyond its own), written as a division so that it cannot overflow.
Algo all_reduce_algo(int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  if (!caps.host_algorithms) return Algo::kRing;
  switch (k.algo) {
    case SelectionKnobs::Forced::kRing: return Algo::kRing;
    case SelectionKnobs::Forced::kDirect: return Algo::kDirect;
    case SelectionKnobs::Forced::kTwoShot: return Algo::kTwoShot;
    case SelectionKnobs::Forced::kHalvingDoubling: return Algo::kHalvingDoubling;
    case SelectionKnobs::Forced::kAuto: break;
  }
  if (world <= 1 || bytes <= k.direct_max_bytes / (world - 1)) return Algo::kDirect;
  if (world >= k.two_shot_min_world && bytes <= k.two_shot_max_bytes) return Algo::kTwoShot;
  return Algo::kRing;
}

// The direct reduce_scatter: forced by RINGCOMM_ALGO=direct, or under auto where the bytes each
// rank copies in, bytes x (world-1) / world, are within RINGCOMM_DIRECT_MAX_BYTES (the all-reduce
// direct range's measure); every other RINGCOMM_ALGO forces the ring.
bool reduce_scatter_direct(int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  if (!caps.host_algorithms) return false;
  switch (k.algo) {
    case SelectionKnobs::Forced::kDirect: return true;
    case SelectionKnobs::Forced::kAuto: break;
    default: return false;
  }
  return world <= 1 || bytes / world * (world - 1) <= k.direct_max_bytes;
}

bool fits_ll(int64_t bytes, int world, const DeviceCaps& caps) {
  return world >= 2 && bytes > 0 && bytes <= static_cast<int64_t>(caps.ll_bytes);
}

// Single-copy reads for a message of `bytes` (the whole message: every rank reads all of it but
// its own part).
bool fits_cma(int64_t bytes, const SelectionKnobs& k, const DeviceCaps& caps) {
  return caps.cma && k.cma_min_bytes > 0 && bytes >= k.cma_min_bytes;
}
bool broadcast_fits_cma(int64_t bytes, const SelectionKnobs& k, const DeviceCaps& caps) {
  return caps.cma && k.cma_min_bytes > 0 && k.cma_broadcast_min_bytes > 0 && bytes >= k.cma_broadcast_min_bytes;
}

bool header_in_slot(int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  return k.header_in_slot && caps.header_slot && world > 1 && bytes > 0;
}

// The chains and the reduce_scatter's ring: the head's (every rank's, for the ring) first piece
// goes to its ring successor before the header wherever the header slot is on.
Proto chain_proto(int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  return header_in_slot(bytes, world, k, caps) ? Proto::kHeaderInSlot : Proto::kSimple;
}

bool all_gather_in_slot(int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  return header_in_slot(bytes, world, k, caps) && bytes / world * (world - 1) <= k.direct_max_bytes;
}

Store store_of(Coll coll, int64_t bytes, const SelectionKnobs& k, const DeviceCaps& caps) {
  if (!caps.streaming_stores || coll == Coll::kBarrier || coll == Coll::kRejected) return Store::kCached;
  // all_to_all's per-rank sizes differ: its size for the rule is 0 on every rank.
  if (coll == Coll::kAllToAll) bytes = 0;
  switch (k.stream) {
    case SelectionKnobs::Stream::kOn: return Store::kStreaming;
    case SelectionKnobs::Stream::kOff: return Store::kCached;
    case SelectionKnobs::Stream::kAdapt: return Store::kCached;  // until CommCore's StoreAdapt picks
    case SelectionKnobs::Stream::kAuto: break;
  }
  return bytes > 0 && bytes >= k.stream_min_bytes ? Store::kStreaming : Store::kCached;
}

const char* all_reduce_algo_name(SelectionKnobs::Forced f) {
  switch (f) {
    case SelectionKnobs::Forced::kRing: return "ring";
    case SelectionKnobs::Forced::kDirect: return "direct";
    case SelectionKnobs::Forced::kTwoShot: return "two_shot";
    case SelectionKnobs::Forced::kHalvingDoubling: return "halving_doubling";
    case SelectionKnobs::Forced::kAuto: break;
  }
  return "auto";
}

}  // namespace

Selection select(Coll coll, int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  Selection s;
  s.store = store_of(coll, bytes, k, caps);
  switch (coll) {
    case Coll::kAllReduce:
      if (k.algo == SelectionKnobs::Forced::kAuto && caps.host_algorithms && world >= k.model_min_world) {
        const ModelChoice m = model_choose(k.profile, bytes, world, caps.pieces, fits_ll(bytes, world, caps) ? bytes : 0,
                                           header_in_slot(bytes, world, k, caps));
        s.algo = m.algo;
        s.proto = m.proto;
        break;
      }
      // The LL outbox only under auto: RINGCOMM_ALGO=ring|direct|two_shot|halving_doubling forces
      // the schedule over slots.
      if (k.algo == SelectionKnobs::Forced::kAuto && fits_ll(bytes, world, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kLL;
        break;
      }
      s.algo = all_reduce_algo(bytes, world, k, caps);
      s.proto = (s.algo == Algo::kDirect || s.algo == Algo::kRing) && header_in_slot(bytes, world, k, caps)
                    ? Proto::kHeaderInSlot
                    : Proto::kSimple;
      break;
    case Coll::kBroadcast:
      // Direct (the root copies the message once per peer) wherever the direct all_reduce would
      // run, always with the header in the root's first slot; the pipelined chain above.
      if (fits_ll(bytes, world, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kLL;
      } else if (broadcast_fits_cma(bytes, k, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kCMA;
      } else if (header_in_slot(bytes, world, k, caps) && all_reduce_algo(bytes, world, k, caps) == Algo::kDirect) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kHeaderInSlot;
      } else {
        s.algo = Algo::kChain;
        s.proto = chain_proto(bytes, world, k, caps);
      }
      break;
    case Coll::kReduceScatter:
      // The LL outbox (every rank's input goes out with its header; each reads its own
      // chunk from every peer) under auto, as all_reduce's; the direct exchange (each rank's
      // chunk from every peer, the header with the first piece) in its range; the ring above.
      if (k.algo == SelectionKnobs::Forced::kAuto && fits_ll(bytes, world, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kLL;
      } else if (reduce_scatter_direct(bytes, world, k, caps)) {
        s.algo = Algo::kDirect;
        s.proto = header_in_slot(bytes, world, k, caps) ? Proto::kHeaderInSlot : Proto::kSimple;
      } else {
        s.algo = Algo::kRing;
        s.proto = chain_proto(bytes, world, k, caps);
      }
      break;
    case Coll::kAllGather:
      // The ring's first send (this rank's piece 0 to its successor) depends on nothing: it goes
      // with the header in the direct range's measure (what each rank receives, B x (N-1) / N).
      // Above it the ring sends each piece from the input and copies it into place while it is
      // in cache, which a send before the header would split by the header exchange.
      if (fits_cma(bytes, k, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kCMA;
      } else {
        s.algo = Algo::kRing;
        s.proto = all_gather_in_slot(bytes, world, k, caps) ? Proto::kHeaderInSlot : Proto::kSimple;
      }
      break;
    case Coll::kReduce:
      // The LL outbox (one hand-off: the root reads every input in place), the chain above.
      if (fits_ll(bytes, world, caps)) {
        s.algo = Algo::kDirect;
        s.proto = Proto::kLL;
      } else {
        s.algo = Algo::kChain;
        s.proto = chain_proto(bytes, world, k, caps);
      }
      break;
    case Coll::kAllToAll:
      // Its per-rank sizes differ (bytes is 0): cma wherever the reads are possible, and each
      // call reads in place only when every rank's blocks qualify (cma_all_to_all_agreed), else
      // moves through slots as the simple protocol does.
      s.algo = Algo::kDirect;
      s.proto = caps.cma && k.cma_min_bytes > 0 ? Proto::kCMA : Proto::kSimple;
      break;
    case Coll::kGather:
    case Coll::kScatter:
      s.algo = Algo::kDirect;
      s.proto = Proto::kSimple;
      break;
    case Coll::kBarrier:
    case Coll::kRejected:
      break;
  }
  return s;
}

bool cma_blocks_qualify(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                        size_t esize, const SelectionKnobs& k) {
  if (k.cma_min_bytes <= 0 || send_counts.empty() || recv_counts.size() != send_counts.size()) return false;
  const int64_t block = send_counts[0];
  for (int64_t c : send_counts)
    if (c != block) return false;
  for (int64_t c : recv_counts)
    if (c != block) return false;
  return block > 0 && block * static_cast<int64_t>(send_counts.size()) * static_cast<int64_t>(esize) >= k.cma_min_bytes;
}

bool cma_all_to_all_agreed(const std::vector<CollHeader>& headers) {
  // Every rank's splits even and every rank's totals equal: one block size everywhere. (Ranks
  // whose splits disagree take the slots, which check every block's size.)
  for (const CollHeader& h : headers)
    if ((h.flags & kHeaderCmaBlocks) == 0 || h.count != headers[0].count || h.count2 != headers[0].count) return false;
  return true;
}

int64_t selection_bytes(Coll coll, const CollHeader& h) {
  switch (coll) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter:
    case Coll::kAllGather:
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kGather:
    case Coll::kScatter:
      return h.count > 0 ? h.count * static_cast<int64_t>(dtype_size(static_cast<DType>(h.dtype))) : 0;
    default:
      return 0;
  }
}

int64_t largest_input_bytes(const std::vector<CollHeader>& headers) {
  int64_t most = 0;
  for (const CollHeader& h : headers)
    most = std::max(most, h.count > 0 ? h.count * static_cast<int64_t>(dtype_size(static_cast<DType>(h.dtype))) : 0);
  return most;
}

std::string describe_selection(int world, const SelectionKnobs& k, const DeviceCaps& caps) {
  std::ostringstream o;
  const int64_t direct_bytes = world > 1 ? k.direct_max_bytes / (world - 1) : k.direct_max_bytes;
  const bool inslot = k.header_in_slot && caps.header_slot;
  o << "all_reduce ";
  if (!caps.host_algorithms) {
    o << "ring";
  } else if (k.algo != SelectionKnobs::Forced::kAuto) {
    o << all_reduce_algo_name(k.algo) << " (RINGCOMM_ALGO)";
  } else if (world >= k.model_min_world) {
    char hash[20];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(k.profile.hash));
    o << "auto (cost model, profile " << k.profile.source << " hash " << hash << ")";
  } else {
    o << "auto (";
    if (caps.ll_bytes > 0) o << "direct/ll up to " << caps.ll_bytes << " B, ";
    o << "direct/" << (inslot ? "header_in_slot" : "simple") << " up to " << direct_bytes << " B, then ";
    if (world >= k.two_shot_min_world) {
      o << "two_shot/simple up to " << k.two_shot_max_bytes << " B, ";
    } else {
      o << "no two_shot below " << k.two_shot_min_world << " ranks, ";
    }
    o << "ring/" << (inslot ? "header_in_slot" : "simple") << " above)";
  }
  o << "; broadcast ";
  if (caps.ll_bytes > 0) o << "direct/ll up to " << caps.ll_bytes << " B, ";
  if (inslot && caps.host_algorithms) o << "direct/header_in_slot in all_reduce's direct range, ";
  if (caps.cma && k.cma_min_bytes > 0 && k.cma_broadcast_min_bytes > 0)
    o << "direct/cma from " << k.cma_broadcast_min_bytes << " B, ";
  o << "chain/" << (inslot ? "header_in_slot" : "simple") << " above; reduce_scatter ";
  if (caps.ll_bytes > 0 && k.algo == SelectionKnobs::Forced::kAuto)
    o << "direct/ll up to " << caps.ll_bytes << " B, ";
  if (caps.host_algorithms && k.algo == SelectionKnobs::Forced::kDirect) {
    o << "direct/" << (inslot ? "header_in_slot" : "simple") << " (RINGCOMM_ALGO); all_gather ";
  } else {
    if (caps.host_algorithms && k.algo == SelectionKnobs::Forced::kAuto)
      o << "direct/" << (inslot ? "header_in_slot" : "simple") << " while bytes x (N-1) / N <= " << k.direct_max_bytes
        << " B, ";
    o << "ring/" << (inslot ? "header_in_slot" : "simple") << "; all_gather ";
  }
  if (inslot) o << "ring/header_in_slot while bytes x (N-1) / N <= " << k.direct_max_bytes << " B, ";
  if (caps.cma && k.cma_min_bytes > 0) o << "direct/cma from " << k.cma_min_bytes << " B, ";
  o << "ring/simple; all_to_all direct/";
  if (caps.cma && k.cma_min_bytes > 0) {
    o << "cma (inputs of " << k.cma_min_bytes << " B or more, even splits on every rank; else through slots)";
  } else {
    o << "simple";
  }
  o << "; reduce ";
  if (caps.ll_bytes > 0) o << "direct/ll up to " << caps.ll_bytes << " B, ";
  o << "chain/" << (inslot ? "header_in_slot" : "simple") << " above; store ";
  if (!caps.streaming_stores || k.stream == SelectionKnobs::Stream::kOff) {
    o << "cached";
  } else if (k.stream == SelectionKnobs::Stream::kOn) {
    o << "streaming";
  } else if (k.stream == SelectionKnobs::Stream::kAdapt) {
    o << "adapt (cached or streaming from " << k.stream_adapt_min_bytes << " B, by the ranks' timings)";
  } else {
    o << "auto (streaming from " << k.stream_min_bytes << " B)";
  }
  return o.str();
}

bool slot_before_header(const CollHeader& h, int poster, int world) {
  if (h.count <= 0 || h.proto != static_cast<uint8_t>(Proto::kHeaderInSlot)) return false;
  switch (static_cast<Coll>(h.coll)) {
    case Coll::kAllReduce:
    case Coll::kReduceScatter: {
      if (h.algo != static_cast<uint8_t>(Algo::kRing)) return true;  // direct: always one message
      // The ring's RS step 0 (chunk poster-1 to the successor), where that chunk is not empty.
      // A header with an unknown dtype never sent (it fails the exchange; no throw here).
      if (h.dtype >= static_cast<uint32_t>(DType::kCount)) return false;
      const int k0 = ring::rs_send(poster, 0, world);
      const int64_t es = static_cast<int64_t>(dtype_size(static_cast<DType>(h.dtype)));
      return static_cast<Coll>(h.coll) == Coll::kAllReduce ? ring::ar_chunk_count(h.count, world, es, k0) > 0
                                                            : ring::chunk_count(h.count, world, k0) > 0;
    }
    case Coll::kBroadcast: return h.root == poster;
    case Coll::kAllGather: return h.count2 > 0;  // the poster's own block
    case Coll::kReduce: return world > 1 && poster == ring::right(static_cast<int>(h.root), world);
    default: return false;
  }
}

bool slot_before_header_for(const CollHeader& h, int poster, int reader, int world) {
  if (!slot_before_header(h, poster, world)) return false;
  switch (static_cast<Coll>(h.coll)) {
    // The direct reduce_scatter's first piece goes to the poster's ring predecessor only, the
    // rings' to its successor.
    case Coll::kReduceScatter:
      return reader == (h.algo == static_cast<uint8_t>(Algo::kRing) ? ring::right(poster, world) : ring::left(poster, world));
    case Coll::kAllReduce: return h.algo != static_cast<uint8_t>(Algo::kRing) || reader == ring::right(poster, world);
    // The direct broadcast's to every peer; a chain's and the all_gather ring's to the successor.
    case Coll::kBroadcast: return h.algo == static_cast<uint8_t>(Algo::kDirect) || reader == ring::right(poster, world);
    case Coll::kAllGather:
    case Coll::kReduce: return reader == ring::right(poster, world);
    default: return true;
  }
}

bool sent_before_header(const CollHeader& h, int poster, int world) {
  if (h.proto == static_cast<uint8_t>(Proto::kCMA)) return true;
  if (h.count <= 0) return false;
  if (h.proto == static_cast<uint8_t>(Proto::kLL)) {
    const Coll c = static_cast<Coll>(h.coll);
    return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kBroadcast || c == Coll::kReduce;
  }
  return slot_before_header(h, poster, world);
}

}  // namespace rc
