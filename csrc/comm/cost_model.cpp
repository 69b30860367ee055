#include "comm/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "algo/context.h"
#include "comm/selection.h"
#include "common/errors.h"

namespace rc {

namespace {

// The params in hash order, with their JSON names.
struct Field {
  const char* name;
  double CostProfile::*member;
};
const Field kFields[] = {
    {"alpha_s", &CostProfile::alpha_s},     {"alpha_shared_s", &CostProfile::alpha_shared_s},
    {"slot_s", &CostProfile::slot_s},
    {"copy_Bps", &CostProfile::copy_Bps},   {"reduce_Bps", &CostProfile::reduce_Bps},
    {"ll_Bps", &CostProfile::ll_Bps},       {"cpus", &CostProfile::cpus},
};

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

[[noreturn]] void bad_profile(const std::string& path, const std::string& why) {
  RC_THROW(InvalidArgument, "ringcomm: RINGCOMM_PROFILE '" << path << "': " << why
                            << " (write one with `python -m ringcomm.apps.tune -o FILE`)");
}

// The text after `"key"` and its colon, or nullptr. The profile is flat JSON written by
// ringcomm.apps.tune: each key of kFields, "version" and "hash" occurs once.
const char* value_of(const std::string& text, const char* key) {
  const std::string quoted = std::string("\"") + key + "\"";
  size_t at = text.find(quoted);
  if (at == std::string::npos) return nullptr;
  at = text.find_first_not_of(" \t\r\n", at + quoted.size());
  if (at == std::string::npos || text[at] != ':') return nullptr;
  at = text.find_first_not_of(" \t\r\n", at + 1);
  return at == std::string::npos ? nullptr : text.c_str() + at;
}

double number_of(const std::string& text, const char* key, const std::string& path) {
  const char* v = value_of(text, key);
  if (v == nullptr) bad_profile(path, std::string("no \"") + key + "\"");
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || !std::isfinite(x) || x < 0) bad_profile(path, std::string("\"") + key + "\" is not a number >= 0");
  return x;
}

double ceil_div(double a, double b) { return a <= 0 ? 0 : std::ceil(a / b); }

}  // namespace

HalvingDoublingWork halving_doubling_work_of_rank0(int world) {
  // halving_doubling's plan (algo/halving_doubling.cpp) counted for rank 0 in closed form: rank 0
  // folds the first extra rank when there is one. Chunks owned by ranks [a, b): b - a below P,
  // plus the extra chunks P + i for i in [a, b), i < q.
  HalvingDoublingWork w;
  int P = 1;
  while (P <= world / 2) P *= 2;
  const int64_t q = world - P;
  auto chunks = [&](int64_t a, int64_t b) { return (b - a) + std::max<int64_t>(0, std::min(q, b) - a); };
  // Ranks w in [0, P) with w = m (mod 2d), and their extras (w < q).
  auto held = [&](int64_t m, int64_t d2) { return P / d2 + (q > m ? (q - m + d2 - 1) / d2 : 0); };
  if (q > 0) {
    w.steps += 2;
    w.received += world;  // fold-in
    w.sent += world;      // fold-out
  }
  for (int64_t d = P / 2; d >= 1; d /= 2) {
    ++w.steps;
    w.sent += held(0, 2 * d) * chunks(d, 2 * d);
    w.received += held(d, 2 * d) * chunks(0, d);
  }
  for (int64_t d = 1; d < P; d *= 2) {
    ++w.steps;
    w.sent += chunks(0, d);
    w.received += chunks(d, 2 * d);
  }
  w.combined = chunks(0, 1);
  return w;
}

uint64_t profile_hash(const CostProfile& p) {
  uint64_t h = fnv1a(14695981039346656037ull, kProfileTag, std::strlen(kProfileTag));
  for (const Field& f : kFields) {
    const double x = p.*(f.member);
    unsigned char le[8];
    uint64_t bits;
    std::memcpy(&bits, &x, 8);
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(bits >> (8 * i));
    h = fnv1a(h, le, 8);
  }
  return h;
}

CostProfile default_profile() {
  // A many-core node with a CPU per rank: hand-offs through a spinning waiter, one core's memcpy
  // and reduce of large buffers, LL lines read from a peer's cache (lines written, flags polled
  // in the same line). The choices they give at 2-4 ranks fall in the order of the measured
  // thresholds (docs/algorithms.md), which still govern there.
  CostProfile p;
  p.alpha_s = 1.5e-6;
  p.alpha_shared_s = 4e-6;
  p.slot_s = 0.3e-6;
  p.copy_Bps = 10e9;
  p.reduce_Bps = 8e9;
  p.ll_Bps = 20e9;
  p.cpus = 0;
  p.hash = profile_hash(p);
  p.source = "defaults";
  return p;
}

CostProfile load_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) bad_profile(path, "cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const char* fmt = value_of(text, "format");
  if (fmt == nullptr || std::strncmp(fmt, "\"ringcomm-profile\"", 18) != 0) bad_profile(path, "not a ringcomm profile");
  const double version = number_of(text, "version", path);
  if (version != kProfileVersion)
    bad_profile(path, "version " + std::to_string(version) + ", this ringcomm reads version " + std::to_string(kProfileVersion));
  CostProfile p;
  for (const Field& fl : kFields) p.*(fl.member) = number_of(text, fl.name, path);
  if (p.alpha_s <= 0 || p.alpha_shared_s <= 0 || p.slot_s <= 0 || p.copy_Bps <= 0 || p.reduce_Bps <= 0 || p.ll_Bps <= 0)
    bad_profile(path, "latencies and bandwidths must be > 0");
  p.hash = profile_hash(p);
  const char* h = value_of(text, "hash");
  char want[20];
  std::snprintf(want, sizeof(want), "\"%016llx\"", static_cast<unsigned long long>(p.hash));
  if (h == nullptr || std::strncmp(h, want, 18) != 0)
    bad_profile(path, std::string("its hash is not its params' (") + want + "): edited or damaged");
  p.source = path;
  return p;
}

CostProfile profile_at(const std::string& path) {
  return path.empty() ? default_profile() : load_profile(path);
}

double model_seconds(const CostProfile& p, Algo algo, Proto proto, int64_t bytes, int world, const PieceSizes& ps) {
  RC_CHECK(world >= 1 && bytes >= 0 && ps.ring > 0 && ps.far > 0 && ps.far_depth > 0, InvalidArgument,
           "ringcomm: the cost model needs world >= 1, bytes >= 0 and positive piece sizes and outbox depth (world "
               << world << ", bytes " << bytes << ", pieces " << ps.ring << "/" << ps.far << ", depth " << ps.far_depth
               << ")");
  const double M = static_cast<double>(bytes), n = world, pf = static_cast<double>(ps.far),
               pr = static_cast<double>(ps.ring);
  // H steps (hand-offs on the critical path); S slots handed over; C, R, L bytes copied, reduced,
  // moved through LL lines. "+ 1": the header exchange where the data does not carry the header.
  // E: the rounds of switches later pieces add where ranks share CPUs (cost_model.h).
  const bool shared = p.cpus > 0 && n > p.cpus;
  const double depth = static_cast<double>(std::max<int64_t>(1, ps.far_depth));
  auto refills = [&](double slots) { return std::max(0.0, ceil_div(slots, depth) - 1); };
  double H = 0, S = 0, C = 0, R = 0, L = 0, E = 0;
  if (algo == Algo::kDirect && proto == Proto::kLL) {
    H = 1;
    L = n * M;                // own lines written, every peer's read
    R = (n - 1) * M;
  } else if (algo == Algo::kDirect && (proto == Proto::kHeaderInSlot || proto == Proto::kSimple)) {
    const bool fused = proto == Proto::kHeaderInSlot;
    H = fused ? 1 : 2;
    S = (n - 1) * std::max(1.0, ceil_div(M, pf));
    E = refills(ceil_div(M, pf));
    C = (n - 1) * M;          // the input into every peer's slot
    R = (n - 1) * M;          // every rank combines every element
  } else if (algo == Algo::kTwoShot && proto == Proto::kSimple) {
    // Iteration j (piece j of every chunk) takes every peer's phase-1 piece and then every peer's
    // reduced piece before iteration j + 1 sends anything. Where ranks share CPUs, a rank that
    // runs later in a round finds its peers' phase-1 pieces and posts its reduced piece in the
    // same turn, so each later iteration waits for one round (not one per phase); within one, the
    // N - 1 phase-1 pieces wait a round per outbox-full after the first.
    const double pieces = ceil_div(M / n, pf);
    H = 3;                    // header, reduce-scatter, all-gather
    S = 2 * (n - 1) * pieces;
    E = std::max(0.0, pieces - 1) + pieces * refills(n - 1);
    // Bytes copied: chunks out, the reduced chunk out, the others' in. The reduced chunk is
    // written once (one slot every peer reads); with a CPU per rank its N - 1 reads cross cores
    // and are priced as copies (3(N-1)/N in all). Where ranks share CPUs the model charges their
    // work in turn and a reader finds what its CPU just wrote: the copies alone ((2N-1)/N).
    C = (shared ? 2 * n - 1 : 3 * (n - 1)) / n * M;
    R = (n - 1) / n * M;
  } else if (algo == Algo::kRing && (proto == Proto::kHeaderInSlot || proto == Proto::kSimple)) {
    // With the header in the slot, reduce-scatter step 0's first piece travels with the header.
    H = 2 * (n - 1) + (proto == Proto::kHeaderInSlot ? 0 : 1);
    S = 2 * (n - 1) * ceil_div(M / n, pr);
    E = 2 * (n - 1) * std::max(0.0, ceil_div(M / n, pr) - 1);
    C = (2 * n - 1) / n * M;  // reduce-scatter's first send, all-gather's sends and copies out
    R = (n - 1) / n * M;      // fused into the sends, and the last step
  } else if (algo == Algo::kHalvingDoubling && proto == Proto::kSimple) {
    const HalvingDoublingWork w = halving_doubling_work_of_rank0(world);
    const double units = M / n;  // a unit is one chunk's bytes when the message fits one iteration
    H = w.steps + 1;
    // Each step packs its units into far slots: about its bytes / pf slots, at least one.
    S = std::max(static_cast<double>(w.steps), ceil_div(static_cast<double>(w.sent) * units, pf));
    E = std::max(0.0, ceil_div(S, depth) - w.steps);
    C = static_cast<double>(w.sent + w.received) * units;
    R = static_cast<double>(w.combined) * (n - 1) * units;
  } else {
    RC_THROW(Error, "ringcomm: the cost model has no entry for " << algo_name(algo) << "/" << proto_name(proto));
  }
  const double f = shared ? n / p.cpus : 1.0;
  const double latency = shared ? (H + E) * p.alpha_shared_s * f : H * p.alpha_s;
  return latency + f * (S * p.slot_s + C / p.copy_Bps + R / p.reduce_Bps + L / p.ll_Bps);
}

ModelChoice model_choose(const CostProfile& p, int64_t bytes, int world, const PieceSizes& ps, int64_t ll_bytes,
                         bool header_in_slot) {
  const ModelChoice candidates[] = {
      {Algo::kDirect, Proto::kLL},
      {Algo::kDirect, header_in_slot ? Proto::kHeaderInSlot : Proto::kSimple},
      {Algo::kTwoShot, Proto::kSimple},
      {Algo::kRing, header_in_slot ? Proto::kHeaderInSlot : Proto::kSimple},
      {Algo::kHalvingDoubling, Proto::kSimple},
  };
  ModelChoice best = candidates[1];
  double best_s = -1;
  for (const ModelChoice& c : candidates) {
    if (c.proto == Proto::kLL && !(bytes > 0 && bytes <= ll_bytes)) continue;
    const double s = model_seconds(p, c.algo, c.proto, bytes, world, ps);
    if (best_s < 0 || s < best_s) {
      best = c;
      best_s = s;
    }
  }
  return best;
}

}  // namespace rc
