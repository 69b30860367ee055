// What an algorithm needs to run one collective: the channel (transport/channel.h), who we are,
// the collective's sequence number (tags every slot), the dtype and the piece size. Algorithms
// move data only through the channel's slots and transform it only through its reduce/copy
// primitives, so each collective exists once for every transport (host shm, CUDA IPC).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/trace_record.h"
#include "common/dtype.h"
#include "transport/channel.h"
#include "transport/shm_types.h"

namespace rc {

class LLProtocol;  // proto/ll.h
class ShmCma;      // transport/shm_cma.h

struct AlgoCtx {
  Channel* ch = nullptr;
  int rank = 0;
  int world = 1;
  uint64_t seq = 0;
  const char* op = "";
  DType dtype = DType::kFloat32;
  size_t esize = 4;
  /// piece_bytes of private memory the channel's reduce can write (direct all-reduce's
  /// accumulator with 3 or more ranks); nullptr where the channel offers none.
  char* scratch = nullptr;
  /// Private memory the algorithm may grow (halving_doubling's staged inputs), kept by the device
  /// between calls and used by the executing thread only; nullptr where the device has none.
  std::vector<char>* staging = nullptr;
  /// The LL protocol over this rank's outbox (proto/ll.h), where the device has one; the LL
  /// collectives run only where it does (comm/selection.h).
  LLProtocol* ll = nullptr;
  /// Single-copy reads of peers' buffers (transport/shm_cma.h), where every rank may read every
  /// peer's memory; the cma collectives run only where it is (comm/selection.h).
  ShmCma* cma = nullptr;
  /// The collective's per-phase record (algo/trace_record.h) when RINGCOMM_TRACE is on, else nullptr.
  TraceRecord* trace = nullptr;
  /// Elements per piece: one slot's payload (at least 1).
  int64_t piece_elems() const { return elems_of(ch->piece_bytes()); }
  /// Elements per piece of the direct exchanges, whose channels may be smaller (at least 1).
  int64_t far_piece_elems() const { return elems_of(ch->far_piece_bytes()); }
  int64_t elems_of(size_t bytes) const {
    const int64_t p = static_cast<int64_t>(bytes / esize);
    return p > 0 ? p : 1;
  }
};

/// Ring collectives (algo/ring.cpp). in/out may be the same buffer (in place); any other overlap
/// is refused by the communicator's validation (comm/validation.h).
/// first_sent: ring_send_first already handed RS step 0's piece 0 to the right neighbour.
void ring_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, bool first_sent = false);
/// Reduce-scatter over the balanced chunks of `count`: rank r receives chunk r into `out`.
void ring_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op,
                         bool first_sent = false);
/// RS step 0's piece 0 (chunk r-1's, of the all-reduce's chunks or, for the reduce_scatter, the
/// balanced ones) to the right neighbour, where that piece is not empty: the header_in_slot
/// ring's send before the header.
void ring_send_first(const AlgoCtx& c, const char* in, int64_t count, bool all_reduce);
/// All-gather: rank k contributes counts[k] elements (its `in`); out holds all, in rank order.
/// first_sent: ring_all_gather_send_first already handed this rank's piece 0 to its ring successor.
void ring_all_gather(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts,
                     bool first_sent = false);
/// Piece 0 of this rank's `count` input elements to its ring successor, one slot even for count 0
/// (nothing for a world of one): the header_in_slot all_gather's send before the header, made
/// where the header says this rank's block is not empty. `total` (the output's elements) places
/// the piece as the ring does when every rank contributes `count`.
void ring_all_gather_send_first(const AlgoCtx& c, const char* in, int64_t count, int64_t total);

/// Direct all-reduce (algo/direct.cpp): every rank sends its input to every peer and combines
/// all contributions itself, in the ring's order (so every rank computes bit-identical results,
/// equal to the ring's). One hand-off instead of the ring's 2(N-1): the small-message algorithm.
/// first_sent: direct_send_first already handed piece 0 to every peer (the header-in-slot
/// path, comm/header_exchange.h).
void direct_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op,
                       bool first_sent = false);
/// Two-shot all-reduce (algo/direct.cpp): a direct reduce-scatter over the all-reduce chunks
/// (ring::ar_chunk_*; rank k receives chunk k from every peer and combines it in the ring's
/// order), then a direct all-gather of the reduced chunks. Two hand-offs instead of the ring's
/// 2(N-1), and each rank combines 1/N of the message instead of all of it: bit-identical to the
/// ring and the one-shot. in == out allowed.
void two_shot_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
/// Direct reduce-scatter (algo/direct.cpp): the two-shot's first phase over reduce_scatter's
/// chunks (balanced_chunks): rank r receives chunk r from every peer and combines it in the
/// ring's order, bit-identical to ring_reduce_scatter; one hand-off instead of the ring's N-1.
/// first_sent: direct_reduce_scatter_send_first already handed round 1's piece 0 (chunk r-1's, to
/// rank r-1) over, before the header. out may be this rank's own chunk of in.
void direct_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op,
                           bool first_sent);
/// Piece 0 of chunk r-1 of `in` to rank r-1, one slot even when that piece is empty (nothing for
/// count 0 or a world of one): the header_in_slot reduce_scatter's send before the header.
void direct_reduce_scatter_send_first(const AlgoCtx& c, const char* in, int64_t count);
/// Recursive halving / doubling all-reduce (algo/halving_doubling.cpp): 2 log2(P) hand-offs (P the
/// largest power of two <= N; 2 more when N is not one: the extra ranks fold into ranks 0..N-P-1).
/// The halving moves raw inputs, so that each chunk's owner combines all N of them in the ring's
/// order: bit-identical to the ring for every dtype and op. Host channels only (staging memory).
void halving_doubling_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
/// What rank `rank` of a halving_doubling all-reduce over `world` ranks does, in chunk-sized
/// units (a chunk is 1/world of the message): the cost model's input (comm/cost_model.h).
struct HalvingDoublingWork {
  int steps = 0;         ///< hand-offs (exchanges) on this rank's path
  int64_t sent = 0;      ///< units copied into slots
  int64_t received = 0;  ///< units copied out of slots
  int64_t combined = 0;  ///< chunks this rank combines (each from world inputs)
};
HalvingDoublingWork halving_doubling_work(int rank, int world);
/// Piece 0 of `in` to every peer (one slot each; nothing for count 0 or a world of one): the
/// first sends of direct_all_reduce, and of direct_broadcast's root, made before the header.
void direct_send_first(const AlgoCtx& c, const char* in, int64_t count);
/// Direct broadcast (algo/direct.cpp): the root sends every piece to every peer, each peer reads
/// its pieces from the root's slots. One hand-off instead of the chain's N-1; the root copies
/// the message N-1 times (the small-message algorithm). first_sent (the root only):
/// direct_send_first already handed piece 0 to every peer.
void direct_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root, bool first_sent);

/// Low-latency collectives (algo/ll.cpp), for messages the LL outbox (c.ll) holds: the first
/// phase, ll_send_first, writes this rank's header `h` and `count` elements of `data` into its
/// LL outbox before the header is posted (the all_reduce's input on every rank, the broadcast's
/// message on its root, nothing on the other ranks); then every rank reads what it needs from its
/// peers' outboxes. Results bit-identical to the ring's and the direct all-reduce's.
void ll_send_first(const AlgoCtx& c, const HeaderBlob& h, const void* data, int64_t count);
void ll_all_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
void ll_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root);
/// The root reads every peer's input from its outbox and combines them in the chain reduce's
/// order (bit-identical to chain_reduce); the other ranks' part was ll_send_first.
void ll_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root);
/// Every rank's input went out with its header (ll_reduce_scatter_send_first); each rank reads its own
/// chunk (balanced_chunks) of every peer's input and combines it in the ring's order (combine_chunk_in_ring_order): bit-identical to ring_reduce_scatter.
void ll_reduce_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op);
/// ll_send_first of a reduce_scatter's input: its own chunk's lines, which no peer reads, unwritten.
void ll_reduce_scatter_send_first(const AlgoCtx& c, const HeaderBlob& h, const void* data, int64_t count);

/// Pipelined chains (algo/chain.cpp). first_sent (the chain's head only: the broadcast's root,
/// the reduce's rank root+1): chain_send_first already handed piece 0 to the head's successor.
void chain_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root, bool first_sent = false);
void chain_reduce(const AlgoCtx& c, const char* in, char* out, int64_t count, ReduceOp op, int root,
                  bool first_sent = false);
/// Piece 0 of `src` (`count` elements) to the ring successor: the header_in_slot chain head's send
/// before the header (the caller sends only on the head; nothing for count 0 or a world of one).
void chain_send_first(const AlgoCtx& c, const char* src, int64_t count);

/// Single-copy collectives (algo/cma.cpp; the cma protocol, transport/shm_cma.h): cma_publish,
/// before the header is posted, stores the address of the buffer this rank's peers read (the
/// all_to_all's and all_gather's input, the broadcast's buffer); after the exchange every rank
/// reads what it needs straight from its peers' buffers into its output, then waits until every
/// peer that reads its buffer is done. Results bit-equal to the slot paths' (pure copies).
void cma_publish(const AlgoCtx& c, const void* buf);
/// all_to_all with every block `block` elements (cma_blocks_qualify on every rank).
void cma_all_to_all(const AlgoCtx& c, const char* in, char* out, int64_t block);
/// all_gather: rank k contributes counts[k] elements; in may be this rank's slice of out.
void cma_all_gather(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& counts);
void cma_broadcast(const AlgoCtx& c, char* buf, int64_t count, int root);

/// Direct exchanges (algo/direct.cpp). Counts and offsets in elements, one per peer.
void direct_all_to_all(const AlgoCtx& c, const char* in, char* out, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& send_offs, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& recv_offs);
void direct_gather(const AlgoCtx& c, const char* in, char* out, int64_t count, int root);
void direct_scatter(const AlgoCtx& c, const char* in, char* out, int64_t count, int root);

}  // namespace rc
