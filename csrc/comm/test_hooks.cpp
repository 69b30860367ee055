// The forged-header hook of the test build (comm/test_hooks.h).
#include "comm/test_hooks.h"

#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common/errors.h"
#include "common/test_knobs.h"

namespace rc::test_hooks {

namespace {

// Rewrites by core; any thread may set one while the core's own threads submit.
struct Rewrites {
  std::mutex mu;
  std::unordered_map<const CommCore*, std::function<void(CollHeader&)>> next;
};

Rewrites& rewrites() {
  static Rewrites r;
  return r;
}

}  // namespace

void set_next_header(const CommCore* core, std::function<void(CollHeader&)> fn) {
  Rewrites& r = rewrites();
  std::lock_guard<std::mutex> lk(r.mu);
  r.next[core] = std::move(fn);
}

void apply_next_header(const CommCore* core, CollHeader& hdr) {
  std::function<void(CollHeader&)> fn;
  {
    Rewrites& r = rewrites();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.next.find(core);
    if (it == r.next.end()) return;
    fn = std::move(it->second);
    r.next.erase(it);
  }
  fn(hdr);
}

void forget(const CommCore* core) {
  Rewrites& r = rewrites();
  std::lock_guard<std::mutex> lk(r.mu);
  r.next.erase(core);
}

int64_t store_cost_ns(bool streaming, int64_t bytes, int64_t measured_ns) {
  const std::string& spec = TestKnobs::read().test_store_cost;
  if (spec.empty()) return measured_ns;
  std::istringstream in(spec);
  double cached = 0, stream = 0;
  char comma = 0;
  RC_CHECK((in >> cached >> comma >> stream) && comma == ',' && cached > 0 && stream > 0, InvalidArgument,
           "RINGCOMM_TEST_STORE_COST=" << spec << ": expected 'C,S' (ns per byte, both > 0)");
  return static_cast<int64_t>((streaming ? stream : cached) * static_cast<double>(bytes));
}

}  // namespace rc::test_hooks
