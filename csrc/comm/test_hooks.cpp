// The forged-header hook of the test build (comm/test_hooks.h).
#include "comm/test_hooks.h"

#include <mutex>
#include <unordered_map>
#include <utility>

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

}  // namespace rc::test_hooks
