// The test build's knobs (common/test_knobs.def), parsed with the rules of the knob registry
// (common/knobs.h). Compiled only into the core of ringcomm._C_test: this header is included
// only under RINGCOMM_TEST_HOOKS, so the production core neither reads these variables nor
// holds their names.
#pragma once
#ifndef RINGCOMM_TEST_HOOKS
#error "common/test_knobs.h belongs to the test build (RINGCOMM_TEST_HOOKS) only"
#endif
#include <cstdint>
#include <string>
#include <vector>

#include "common/knobs.h"

namespace rc {

/// Every test knob, in common/test_knobs.def's order.
const std::vector<KnobInfo>& test_knob_table();

/// One field per line of common/test_knobs.def.
struct TestKnobs {
#define RC_KNOB(NAME, field, kind, def, choices, doc) KnobValue<KnobType::kind>::type field{};
#include "common/test_knobs.def"
#undef RC_KNOB
  /// The environment parsed now; a malformed value throws rc::InvalidArgument naming it.
  static TestKnobs read();
};

}  // namespace rc
