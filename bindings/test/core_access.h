// CommCoreTestAccess: a friend of CommCore (comm/core.h) for the test modules (ringcomm._C_test,
// ringcomm._C_cuda_fake), never compiled into a product module (tests/test_build.py).
#pragma once
#include <cstdint>
#include <mutex>

#include "comm/core.h"
#include "common/errors.h"

namespace rc {

// Friend of CommCore (comm/core.h). Touches only the core's members, under its mutex mu_, as
// submit() does: the communicator may be in use by other threads. The core's layout is the same
// in every build (RINGCOMM_TEST_HOOKS changes no header), so it serves any module's core.
struct CommCoreTestAccess {
  // Number the next collective `last + 1`: exercises the board's counter wrap without 2^32
  // calls. Before the first collective only, with the same value on every rank.
  static void set_last_seq(CommCore& c, uint64_t last) {
    std::lock_guard<std::mutex> lk(c.mu_);
    RC_CHECK(c.seq_ == 0 && c.queue_.empty() && !c.busy_, Error, "set_last_seq: collectives already ran");
    c.seq_ = last;
    c.exchanges_ = last;  // the board's count too, on a device that fuses calls
  }
};

}  // namespace rc
