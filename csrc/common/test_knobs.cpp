// The test build's knob table and parser (common/test_knobs.h).
#include "common/test_knobs.h"

namespace rc {

const std::vector<KnobInfo>& test_knob_table() {
  static const std::vector<KnobInfo> t = {
#define RC_KNOB(NAME, field, kind, def, choices, doc) {#NAME, #field, KnobType::kind, def, choices, doc, false},
#include "common/test_knobs.def"
#undef RC_KNOB
  };
  return t;
}

TestKnobs TestKnobs::read() {
  TestKnobs k;
  size_t i = 0;
#define RC_KNOB(NAME, field, kind, def, choices, doc) parse_knob(test_knob_table()[i++], &k.field);
#include "common/test_knobs.def"
#undef RC_KNOB
  return k;
}

}  // namespace rc
