// How a collective runs: ONE function maps (collective, bytes, world, knobs, device capabilities)
// to (algorithm, protocol, store policy). Two named axes, as NCCL separates NCCL_ALGO_* from
// NCCL_PROTO_*:
//  - the algorithm is the schedule: who sends what to whom (ring, direct = one-shot, two_shot,
//    chain);
//  - the protocol is how bytes and readiness travel (simple: flow-controlled slots after the
//    header exchange; header_in_slot: piece 0 handed to every peer before the header is posted;
//    ll: header and data in the sender's LL outbox lines, proto/ll.h; cma: every reader copies
//    straight from the sender's own buffer with process_vm_readv, transport/shm_cma.h);
// plus the store policy: cached or streaming stores into peers' slots.
//
// all_reduce under RINGCOMM_ALGO=auto: with fewer than RINGCOMM_MODEL_MIN_WORLD ranks the
// measured size thresholds below; from there on the cost model (comm/cost_model.h) over the
// communicator's profile, which every rank must share (its hash is compared at init).
//
// The choice is made once per call, on each rank, from that rank's knobs; it travels in the
// collective's header (CollHeader::algo, proto, store) and the header exchange compares it, so
// ranks whose knobs differ raise MismatchError on every rank before any result is written
// (comm/header_exchange.h). The device only reports what it can do (DeviceCaps); every threshold
// is a named knob (SelectionKnobs). docs/algorithms.md has the table and the measurements behind
// the defaults.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/coll.h"
#include "comm/coll_header.h"
#include "comm/cost_model.h"
#include "common/knobs.h"

namespace rc {

/// X(enumerator without k, code, name). The codes travel in the header.
#define RC_ALGORITHMS(X) \
  X(None, 0, "none")     \
  X(Ring, 1, "ring")     \
  X(Direct, 2, "direct") \
  X(TwoShot, 3, "two_shot") \
  X(Chain, 4, "chain") \
  X(HalvingDoubling, 5, "halving_doubling")

#define RC_PROTOCOLS(X)  \
  X(None, 0, "none")     \
  X(Simple, 1, "simple") \
  X(HeaderInSlot, 2, "header_in_slot") \
  X(LL, 3, "ll") \
  X(CMA, 4, "cma")

#define RC_STORES(X)     \
  X(Cached, 0, "cached") \
  X(Streaming, 1, "streaming")

#define RC_SEL_ENUMERATOR_(name, code, str) k##name = code,
enum class Algo : uint8_t { RC_ALGORITHMS(RC_SEL_ENUMERATOR_) };
enum class Proto : uint8_t { RC_PROTOCOLS(RC_SEL_ENUMERATOR_) };
enum class Store : uint8_t { RC_STORES(RC_SEL_ENUMERATOR_) };
#undef RC_SEL_ENUMERATOR_

const char* algo_name(Algo a);
const char* proto_name(Proto p);
const char* store_name(Store s);
/// The names of the codes a header carries ("?" for a code no enumerator has).
const char* algo_name_of(uint8_t code);
const char* proto_name_of(uint8_t code);
const char* store_name_of(uint8_t code);

struct Selection {
  Algo algo = Algo::kNone;
  Proto proto = Proto::kNone;
  Store store = Store::kCached;
};

/// What the device part of a communicator can do (comm/device.h). The host's: everything; the
/// CUDA communicator's: the ring and the chains over slots, cached stores.
struct DeviceCaps {
  /// The direct (one-shot) and two-shot all-reduce and the direct broadcast: they need host
  /// scratch memory and host-side combines.
  bool host_algorithms = false;
  /// A channel on which piece 0 can be handed off before the header (the header_in_slot
  /// protocol; CommDevice::header_slot_channel).
  bool header_slot = false;
  /// Data bytes of this rank's LL outbox (0: no LL protocol). Equal on every rank (the transport
  /// checks it at attach).
  size_t ll_bytes = 0;
  /// Stores into peers' slots may be streaming (non-temporal).
  bool streaming_stores = false;
  /// Every rank may read every peer's memory (transport/shm_cma.h; the host device after connect).
  bool cma = false;
  /// The slot payloads the host algorithms cut messages into (the cost model's input).
  PieceSizes pieces;
};

/// The knobs of the selection, read once per communicator (SelectionKnobs::from_knobs).
struct SelectionKnobs {
  enum class Forced { kAuto, kRing, kDirect, kTwoShot, kHalvingDoubling };
  enum class Stream { kAuto, kAdapt, kOn, kOff };
  Forced algo = Forced::kAuto;     ///< RINGCOMM_ALGO (all_reduce)
  int64_t direct_max_bytes = 0;    ///< RINGCOMM_DIRECT_MAX_BYTES: bytes x (world-1) of the direct range
  int64_t two_shot_max_bytes = 0;  ///< RINGCOMM_TWO_SHOT_MAX_BYTES
  int64_t two_shot_min_world = 0;  ///< RINGCOMM_TWO_SHOT_MIN_WORLD
  int64_t model_min_world = 0;     ///< RINGCOMM_MODEL_MIN_WORLD: auto's all-reduce from the cost model
  CostProfile profile;             ///< RINGCOMM_PROFILE's, or the compiled-in defaults
  bool header_in_slot = true;      ///< RINGCOMM_HEADER_IN_SLOT
  Stream stream = Stream::kAuto;   ///< RINGCOMM_STREAM
  int64_t stream_min_bytes = 0;    ///< RINGCOMM_STREAM_MIN_BYTES
  int64_t stream_adapt_min_bytes = 0;  ///< RINGCOMM_STREAM_ADAPT_MIN_BYTES
  int64_t cma_min_bytes = 0;       ///< RINGCOMM_CMA_MIN_BYTES (0: off)
  int64_t cma_broadcast_min_bytes = 0;  ///< RINGCOMM_CMA_BROADCAST_MIN_BYTES (0: never)
  /// From the knobs `k` (and RINGCOMM_PROFILE's file, loaded now); an out-of-range value throws
  /// InvalidArgument naming it.
  static SelectionKnobs from_knobs(const Knobs& k);
};

/// THE selection. `bytes`: the collective's message size as every rank computes it alike (the
/// header's count x element size for the collectives whose count the exchange checks equal; 0
/// for all_to_all, whose per-rank sizes differ). Barrier and rejected calls: (none, none, cached).
Selection select(Coll coll, int64_t bytes, int world, const SelectionKnobs& k, const DeviceCaps& caps);

/// all_to_all under the cma protocol: whether this rank's blocks qualify for single-copy reads
/// (every block to and from every peer the same, this rank's input at least RINGCOMM_CMA_MIN_BYTES). The header
/// carries it (kHeaderCmaBlocks); the call reads in place iff every rank's header has it, so the
/// ranks decide alike although each knows only its own splits (cma_all_to_all_agreed).
bool cma_blocks_qualify(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                        size_t esize, const SelectionKnobs& k);
bool cma_all_to_all_agreed(const std::vector<CollHeader>& headers);

/// The bytes select() is given for a header (see select()).
int64_t selection_bytes(Coll coll, const CollHeader& h);
/// The largest input among the ranks' headers, in bytes (an all_to_all's size for the store
/// policy: alike on every rank once the headers are exchanged, where each rank's own differs).
int64_t largest_input_bytes(const std::vector<CollHeader>& headers);

/// One line for the INFO log: the rule select() applies for this world and these knobs.
std::string describe_selection(int world, const SelectionKnobs& k, const DeviceCaps& caps);

/// True when the rank that posted `h` (rank `poster` of `world`) handed data off before posting
/// it, by its header's protocol: every rank of a header_in_slot all_reduce and the root of a
/// header_in_slot direct broadcast (one slot to every peer: comm/header_exchange.h), every rank of
/// a header_in_slot reduce_scatter (one slot to its ring predecessor), the head of a
/// header_in_slot chain (the broadcast's root, the reduce's rank root+1) and every rank of a
/// header_in_slot all_gather whose own block is not empty (one slot to its ring successor), every
/// rank of an LL collective (its outbox lines), and every rank of a cma collective (the address of
/// the buffer its peers read, transport/shm_cma.h). Else never for an empty message.
bool sent_before_header(const CollHeader& h, int poster, int world);
/// The part of sent_before_header that leaves a slot in a peer's channel (header_in_slot),
/// which a failed exchange must drain; LL lines need no draining (never consumed).
bool slot_before_header(const CollHeader& h, int poster, int world);
/// Whether that slot is in `reader`'s channel from `poster` (of `world` ranks): every peer's for
/// all_reduce and the direct broadcast, the poster's ring predecessor's for reduce_scatter, its
/// ring successor's for a chain and the all_gather.
bool slot_before_header_for(const CollHeader& h, int poster, int reader, int world);

}  // namespace rc
