// The shm transport's implementation of Channel (transport/channel.h): one lane of ShmTransport,
// memcpy and the CPU reduce kernels. Used by the host communicator (collective lane) and by the
// host simulation binding that runs the algorithms with the CUDA channel's options.
//
// Options:
//  - placement kPageOffset (host default): the payload takes the sender's source address's offset
//    within a 4 KiB page, so slot <-> user-buffer copies never have the small skew that costs
//    4K-aliasing stalls. kResidue16 (the CUDA channel's): the payload sits at the piece's full-
//    buffer byte offset mod 16 (0 for direct exchanges), and a slot carries 16 bytes less.
//    The receiver always reads the offset the sender chose from the slot's meta.
//  - forward_from_slot: see Channel.
//  - streaming (set per collective from the store policy the selection chose, comm/selection.h):
//    copies into peers' slots use non-temporal stores; a fused reduction is formed in the private scratch (one slot,
//    cache-resident) and streamed into the slot, since the reduce kernels write cached only.
// Used by one thread at a time (the one running the collective); the scratch is that thread's.
#pragma once
#include <cstddef>
#include <vector>

#include "transport/channel.h"
#include "transport/shm.h"
#include "transport/shm_types.h"

namespace rc {

struct ShmChannelOptions {
  enum class Placement { kPageOffset, kResidue16 };
  Placement placement = Placement::kPageOffset;
  bool forward_from_slot = true;
};

class ShmChannel final : public Channel {
 public:
  static constexpr size_t kResidue = 16;
  /// scratch: slot_bytes of private memory, or nullptr (streamed fused reductions then write the
  /// slot with cached stores).
  ShmChannel(ShmTransport* t, Lane lane, char* scratch, ShmChannelOptions opt = {});
  void set_streaming(bool on) { stream_ = on; }
  bool streaming() const { return stream_; }

  bool forward_from_slot() const override { return opt_.forward_from_slot; }
  /// The far geometry's payload (ShmConfig::far_slot_bytes).
  size_t far_piece_bytes() const override;
  /// The transport's outbox layout, collective lane: one outbox slot for every peer.
  bool has_send_all() const override { return lane_ == Lane::kColl && t_->has_outbox(); }
  char* send_slot_all(const WaitCtx& w, const PiecePlace& at) override;
  void send_post_all(uint64_t bytes, uint64_t total, uint64_t tag) override;
  RC_CHANNEL_PRIMITIVES(, override)

 private:
  uint32_t offset_of(const PiecePlace& at) const;
  ShmTransport* t_;
  Lane lane_;
  char* scratch_;
  ShmChannelOptions opt_;
  bool stream_ = false;
};

}  // namespace rc
