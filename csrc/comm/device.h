// What a communicator core (comm/core.h) asks of its device part: the one place where the host
// and the CUDA communicator differ. Everything else - sequence numbers, the broken/abort state,
// the header exchange, argument checks, the queue, the point-to-point engine - is the core's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "algo/context.h"
#include "comm/coll.h"
#include "comm/coll_header.h"
#include "comm/dispatch.h"
#include "comm/selection.h"
#include "comm/validation.h"
#include "comm/work.h"
#include "common/function_ref.h"
#include "transport/channel.h"
#include "transport/shm_control.h"

namespace rc {

class CommDevice {
 public:
  virtual ~CommDevice() = default;
  /// "communicator" / "CUDA communicator", for messages.
  virtual const char* name() const = 0;
  /// The host control plane: header board, abort flags, doorbell, liveness, timeouts.
  virtual ShmControl& control() = 0;
  /// Whether control() exists yet (a CUDA device creates it in create(); the host's always is).
  virtual bool has_control() const { return true; }
  /// Where buffers must live (nullptr: host memory, not checkable).
  virtual const MemoryCheck* memory() const = 0;
  /// What this device can run (comm/selection.h): the selection reads it once, when the core is
  /// created; the device never chooses an algorithm or protocol itself.
  virtual DeviceCaps caps() const { return {}; }
  /// The channel the header_in_slot protocol hands piece 0 off on before the header is posted
  /// (comm/header_exchange.h: the control plane's collective lane), or nullptr where there is
  /// none (caps().header_slot is then false). The core uses it outside execute() only to drain it.
  virtual Channel* header_slot_channel() { return nullptr; }
  /// Post this rank's abort on the control plane (kind: abort_kind_of).
  virtual void abort(uint32_t kind, const std::string& msg) = 0;

  /// Run the data phase of one collective: fill in c.ch (the collective lane's channel for
  /// `stream`, set to the store policy h.store says), c.scratch and c.ll, call body(c), and return the fence of whatever the body left
  /// running on the device (nullptr: nothing). Called by one thread at a time.
  virtual std::shared_ptr<DeviceFence> execute(Coll coll, const CollHeader& h, void* stream, AlgoCtx& c,
                                               FunctionRef<void(const AlgoCtx&)> body) = 0;
  /// Inside execute()'s body, after the header exchange and before any slot is written: set the
  /// channel's store policy to `s` instead of h.store (an all_to_all's store is decided from
  /// every rank's header: comm/core.cpp). A device without streaming stores ignores it.
  virtual void set_store(Store s) {}

  /// On the caller's thread, when a collective is submitted (before it is numbered): throw what
  /// the device cannot run now (the CUDA device: a call that would wait on the host while the
  /// caller's stream is being captured into a CUDA graph). A throw here rejects the call on this
  /// rank only, before any header is posted.
  virtual void check_submit(Coll coll, const CollHeader& h, const CollArgs& a, void* stream) {}
  /// Whether the device runs `coll` itself as one fused launch (run_fused) without a header
  /// exchange nor a data phase through the channel. Decided from this rank's call alone (h, a),
  /// so alike on every rank whose calls match; a rank that decides otherwise for the same call
  /// is caught by the peers' header waits (comm/header_exchange.h, RoutingMismatch) or by the
  /// device's own checks of what arrives.
  virtual bool fused(Coll coll, const CollHeader& h, const CollArgs& a) const { return false; }
  /// Whether any call may run fused: the header waits then watch for a peer that did.
  virtual bool may_fuse() const { return false; }
  /// Enqueue a fused call (no header exchange); returns its fence (nullptr: none to wait for).
  virtual std::shared_ptr<DeviceFence> run_fused(Coll coll, const CollHeader& h, const CollArgs& a, void* stream,
                                                 uint64_t seq) {
    return nullptr;
  }

  // ---- point-to-point (the core's p2p engine, its thread only, except p2p_prepare) ----
  /// The point-to-point lane's channel.
  virtual Channel& p2p_channel() = 0;
  /// Whether the p2p lane's slots are host memory the engine may memcpy from (it then buffers
  /// messages that arrive before a receive with their tag is posted).
  virtual bool p2p_slots_in_host_memory() const { return true; }
  /// On the p2p thread, before anything else.
  virtual void p2p_thread_start() {}
  /// On the caller's thread when a send/recv is posted: a token ordering the operation after the
  /// caller's stream (nullptr: nothing to order).
  virtual void* p2p_prepare(void* stream) { return nullptr; }
  /// Before the operation's first piece moves.
  virtual void p2p_begin(void* token) {}
  /// After its last piece (ok) or on failure (!ok): releases the token; returns the fence of
  /// the copies still running (nullptr: none).
  virtual std::shared_ptr<DeviceFence> p2p_end(void* token, bool ok) { return nullptr; }

  /// In a forked child (the core's threads do not exist there): drop this process's mappings
  /// without touching the parent's shared state.
  virtual void forget_after_fork() {
    if (has_control()) control().drop_mappings_after_fork();
  }

  /// After the core's threads stopped: release the transport. `broken`: after a data-phase failure
  /// (device work may still run).
  virtual void close(bool broken) = 0;
};

}  // namespace rc
