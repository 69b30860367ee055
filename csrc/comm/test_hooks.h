// The communicator's test hook: a forged collective header, which the public API cannot produce.
// Compiled only into the core of ringcomm._C_test (RINGCOMM_TEST_HOOKS): the production core
// neither includes this header nor checks for a hook on submit.
#pragma once
#ifndef RINGCOMM_TEST_HOOKS
#error "comm/test_hooks.h belongs to the test build (RINGCOMM_TEST_HOOKS) only"
#endif
#include <cstdint>
#include <functional>

#include "comm/coll_header.h"

namespace rc {

class CommCore;

namespace test_hooks {

/// The next collective `core` submits (a rejection excepted) has its header, after the local
/// checks, rewritten by `fn`; then the rewrite is dropped. Replaces one set before.
void set_next_header(const CommCore* core, std::function<void(CollHeader&)> fn);
/// Applies and drops the rewrite set for `core`, if any (CommCore::submit).
void apply_next_header(const CommCore* core, CollHeader& hdr);
/// Drops what is set for `core` (its destructor: a later core at the same address starts clean).
void forget(const CommCore* core);
/// RINGCOMM_TEST_STORE_COST's time for a data phase of `bytes` under `streaming` stores, or
/// `measured_ns` where the knob is empty.
int64_t store_cost_ns(bool streaming, int64_t bytes, int64_t measured_ns);

}  // namespace test_hooks
}  // namespace rc
