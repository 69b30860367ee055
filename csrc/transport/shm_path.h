// What the two message paths of the shm transport share: the push channels (transport/shm_slots.h)
// and the outboxes (transport/shm_outbox.h) both move a sender's slots to a receiver, find the
// segments through ShmSegments, wait through ShmWaits and ring the point-to-point doorbell. The
// references are the transport's parts, which outlive the paths (transport/shm.h).
#pragma once
#include "transport/shm_config.h"
#include "transport/shm_doorbell.h"
#include "transport/shm_segments.h"
#include "transport/shm_wait.h"

namespace rc {

class ShmPath {
 protected:
  ShmPath(int rank, int world, const ShmConfig& cfg, const ShmSegments& segs, ShmWaits& waits, ShmDoorbell& bell)
      : rank_(rank), world_(world), cfg_(cfg), segs_(segs), waits_(waits), bell_(bell) {}

  int rank_;
  int world_;
  const ShmConfig& cfg_;  // normalized
  const ShmSegments& segs_;
  ShmWaits& waits_;
  ShmDoorbell& bell_;
};

}  // namespace rc
