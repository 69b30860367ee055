// Host harness of the device ring (csrc/device/ring_proto.h): runs the very header the GPU runs,
// compiled by g++ against libcu++ (cuda::atomic_ref at system scope), with a block as one thread
// (or one coroutine) and ranks as threads, coroutines or processes over shared pages.
//
// Modes (one line of key=value results on stdout; exit 0 when every run passed):
//   run    free-running: ranks as threads (ranks=threads) or processes (ranks=procs), lanes as
//          threads, a real clock. Options: late=R:MS (rank R starts MS ms late), absent=R (rank R
//          never starts), kill=R:MS (rank R is SIGKILLed MS ms after the start; procs only),
//          abort_ms=MS (the abort word is set MS ms after the start), out=FILE (every rank's
//          output, rank after rank), expect=FILE (must equal the outputs bit for bit).
//   sched  ranks x lanes as coroutines under a deterministic scheduler that may switch before
//          every flag access, slot access and spin. search=random:N:SEED samples N schedules
//          (each decision uniform over the runnable coroutines); search=bounded:B explores every
//          schedule with at most B preemptions (switches away from a runnable coroutine),
//          exhaustively. Checked for each schedule: every lane finishes with no status record
//          (no deadlock, no mismatch: a lost or early-reused slot fails its header check), and
//          the outputs equal expect=FILE bit for bit. stop_on_fail=1 ends at the first failure.
// Common options: world, lanes, slots, slot_bytes, count, dtype, op (codes of ringcomm/abi.h),
// coll=ar|rs|ag|bc|rd (all_reduce, reduce_scatter, all_gather, broadcast, reduce), root=R (bc, rd),
// inplace=0|1 (bc: always in place), calls=C (C calls back to back, each must pass), broken=0..4
// (dev::Broken; float32 SUM only), timeout_ms, in=FILE (every rank's input, rank after rank),
// skew=R:FIELD:V (in the first call, rank R calls with FIELD = V, FIELD one of dtype, op, root,
// count: a mismatched call; dtype and op change only the codes its slot headers carry).
// Outputs, rank after rank: ar, bc: count elements; rs: the rank's chunk; ag: count x world; rd:
// count elements of the root, nothing of the others (whose `out` is null).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/ring_proto.h"

using rc::DType;
using rc::ReduceOp;
using namespace rc::dev;

namespace {

// ---------------- the deterministic scheduler (coroutines) --------------------------------------

struct Sched {
  enum State { kRunnable, kSpinning, kDone };
  struct Co {
    ucontext_t ctx;
    std::vector<char> stack;
    State state = kRunnable;
    bool pending_store = false;
  };
  std::vector<Co> co;
  ucontext_t main_ctx;
  int cur = -1;
  uint64_t vtime = 0;
  bool jumped = false;
  long steps = 0, max_steps = 2000000;
  bool livelock = false;
  // Decisions: random, or replaying `prefix` then taking choice 0 (bounded search).
  std::mt19937_64* rng = nullptr;
  std::vector<int> prefix;
  std::vector<std::pair<int, int>> trace;  // (choice, number of choices) at each decision
  int bound = -1, preemptions = 0;

  int decide(int n) {
    if (n <= 1) return 0;
    int c;
    const size_t i = trace.size();
    if (rng) c = static_cast<int>((*rng)() % static_cast<uint64_t>(n));
    else c = i < prefix.size() ? prefix[i] : 0;
    trace.push_back({c, n});
    return c;
  }
  // Picks the next coroutine; -1 when all are done.
  int pick(int self) {
    std::vector<int> cand;
    bool self_ok = self >= 0 && co[self].state == kRunnable;
    if (self_ok) cand.push_back(self);
    for (int i = 0; i < static_cast<int>(co.size()); ++i)
      if (i != self && co[i].state == kRunnable) cand.push_back(i);
    if (cand.empty()) {
      bool any = false;
      for (auto& c : co)
        if (c.state == kSpinning) c.state = kRunnable, any = true;
      if (!any) return -1;
      // Nobody can make progress: time moves past every deadline; the waiters see it at their
      // next check. From here on no branching: only the waits' endings remain.
      vtime += uint64_t{1} << 40;
      jumped = true;
      for (int i = 0; i < static_cast<int>(co.size()); ++i)
        if (co[i].state == kRunnable) return i;
    }
    if (jumped) return cand[0];  // after the jump: only the deadline checks remain, no branching
    if (self_ok && bound >= 0 && preemptions >= bound) return self;
    const int c = decide(static_cast<int>(cand.size()));
    if (self_ok && c != 0) ++preemptions;
    return cand[c];
  }
  void switch_to(int self, int next) {
    cur = next;
    if (next == self) return;
    if (next < 0) {
      swapcontext(&co[self].ctx, &main_ctx);
    } else {
      swapcontext(self < 0 ? &main_ctx : &co[self].ctx, &co[next].ctx);
    }
  }
  void point(Access k) {
    const int self = cur;
    if (++steps > max_steps) {  // far too long: end it as a hang (every wait times out)
      livelock = true;
      vtime += uint64_t{1} << 40;
    }
    vtime += 1;
    if (co[self].pending_store)
      for (auto& c : co)
        if (c.state == kSpinning) c.state = kRunnable;
    co[self].pending_store = (k == Access::kStore);
    if (k == Access::kSpin) co[self].state = kSpinning;
    switch_to(self, pick(self));
  }
  void finish() {
    const int self = cur;
    if (co[self].pending_store)
      for (auto& c : co)
        if (c.state == kSpinning) c.state = kRunnable;
    co[self].state = kDone;
    const int next = pick(self);
    cur = next;
    if (next < 0) setcontext(&main_ctx);
    else setcontext(&co[next].ctx);
  }
};

thread_local Sched* t_sched = nullptr;

struct HostPlatform {
  static uint64_t tid() { return 0; }
  static uint64_t nth() { return 1; }
  static void sync() {}
  static bool all(bool v) { return v; }
  static uint64_t now_ns() {
    if (t_sched) return t_sched->vtime;
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  static void backoff(uint32_t spins) {
    if (t_sched) return t_sched->point(Access::kSpin);
    if (spins < 16) return;
    if (spins < 256) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  static void point(Access k, const void*) {
    if (t_sched && k != Access::kSpin) t_sched->point(k);
  }
};

// ---------------- options ---------------------------------------------------------------------

std::map<std::string, std::string> g_opt;
std::string opt(const char* k, const char* d) {
  auto it = g_opt.find(k);
  return it == g_opt.end() ? d : it->second;
}
long opti(const char* k, long d) { return std::stol(opt(k, std::to_string(d).c_str())); }

// ---------------- one lane's entry, through THE dtype x op switch ------------------------------

using LaneFn = bool (*)(const RingArgs&, int);
struct LaneOf {
  template <class T, class Fin> LaneFn run() { return &ring_lane<HostPlatform, Broken::kNone, T, Fin>; }
  LaneFn none() { return nullptr; }
};
struct EsizeOf {
  template <class T, class Fin> int64_t run() { return sizeof(T); }
  int64_t none() { return 0; }
};
LaneFn broken_lane(int b) {  // the broken variants: float32 SUM only
  switch (static_cast<Broken>(b)) {
    case Broken::kFlagBeforeData: return &ring_lane<HostPlatform, Broken::kFlagBeforeData, float, rc::rops::SumF>;
    case Broken::kWordReset: return &ring_lane<HostPlatform, Broken::kWordReset, float, rc::rops::SumF>;
    case Broken::kEarlyFree: return &ring_lane<HostPlatform, Broken::kEarlyFree, float, rc::rops::SumF>;
    case Broken::kHoistedLoad: return &ring_lane<HostPlatform, Broken::kHoistedLoad, float, rc::rops::SumF>;
    default: return nullptr;
  }
}

// ---------------- the shared world ------------------------------------------------------------

struct World {
  int n, lanes, nslots, root = 0;
  uint32_t dtype = 0, op = 0;
  Coll coll;
  int skew_rank = -1;
  std::string skew_field;
  long skew_value = 0;
  int64_t count, es, in_elems, slot_bytes, stride;
  bool inplace;
  std::vector<int64_t> out_elems, out_off;
  char* base = nullptr;
  size_t bytes = 0;
  // Per rank, inside the shared mapping:
  std::vector<SignalPage*> page;
  std::vector<char*> slots, in, out;
  std::vector<LaneState*> state;
  std::vector<Status*> status;
  uint32_t* abort = nullptr;
  int64_t total_out = 0;

  void layout() {
    out_elems.resize(n);
    out_off.resize(n);
    for (int r = 0; r < n; ++r) {
      switch (coll) {
        case Coll::kAllGather: out_elems[r] = count * n; break;
        case Coll::kReduceScatter: out_elems[r] = rc::ring::chunk_count(count, n, r); break;
        case Coll::kReduce: out_elems[r] = r == root ? count : 0; break;
        default: out_elems[r] = count;
      }
      out_off[r] = total_out;
      total_out += out_elems[r];
    }
    in_elems = count;
    stride = (kSlotHeaderBytes + slot_bytes + 16 + 63) / 64 * 64;
    auto al = [](size_t x) { return (x + 4095) / 4096 * 4096; };
    const size_t per = al(sizeof(SignalPage)) + al(stride * lanes * nslots) + al(in_elems * es + 16) +
                       al(out_elems[0] * es + count * n * es + 16) + al(sizeof(LaneState) * kMaxLanes) + 4096;
    bytes = per * n + 4096;
    base = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) { perror("mmap"); exit(2); }
    char* p = base;
    abort = reinterpret_cast<uint32_t*>(p);
    p += 4096;
    for (int r = 0; r < n; ++r) {
      page.push_back(reinterpret_cast<SignalPage*>(p));
      p += al(sizeof(SignalPage));
      slots.push_back(p);
      p += al(stride * lanes * nslots);
      in.push_back(p);
      p += al(in_elems * es + 16);
      out.push_back(inplace ? in.back() : p);
      p += al(out_elems[0] * es + count * n * es + 16);
      state.push_back(reinterpret_cast<LaneState*>(p));
      p += al(sizeof(LaneState) * kMaxLanes);
      status.push_back(reinterpret_cast<Status*>(p));
      p += 4096;
    }
  }
  void reset(const std::vector<char>& input) {
    std::memset(base, 0, bytes);
    for (int r = 0; r < n; ++r) std::memcpy(in[r], input.data() + r * in_elems * es, in_elems * es);
  }
  RingArgs args(int r, uint64_t timeout_ns, int call) const {
    RingArgs a{};
    a.coll = coll;
    a.dtype = dtype;
    a.op = op;
    a.root = root;
    a.rank = r;
    a.world = n;
    a.nlanes = lanes;
    a.nslots = nslots;
    a.count = count;
    a.slot_bytes = slot_bytes;
    a.slot_stride = stride;
    a.scale = 1.0 / n;
    a.in = in[r];
    a.out = coll == Coll::kReduce && r != root ? nullptr : out[r];
    const int R = (r + 1) % n, L = (r + n - 1) % n;
    a.self = page[r];
    a.right = page[R];
    a.left = page[L];
    a.recv_slots = slots[r];
    a.send_slots = slots[R];
    a.state = state[r];
    a.status = status[r];
    a.abort = abort;
    a.timeout_ns = timeout_ns;
    if (r == skew_rank && call == 0) {
      if (skew_field == "dtype") a.dtype = static_cast<uint32_t>(skew_value);
      else if (skew_field == "op") a.op = static_cast<uint32_t>(skew_value);
      else if (skew_field == "root") a.root = static_cast<int>(skew_value);
      else if (skew_field == "count") a.count = skew_value;
    }
    return a;
  }
  std::vector<char> outputs() const {
    std::vector<char> o;
    for (int r = 0; r < n; ++r) o.insert(o.end(), out[r], out[r] + out_elems[r] * es);
    return o;
  }
  std::string failures() const {
    std::string s;
    for (int r = 0; r < n; ++r) {
      const Status& st = *status[r];
      if (st.reason == 0) continue;
      s += "rank=" + std::to_string(st.rank) + ",lane=" + std::to_string(st.lane) + ",reason=" +
           std::to_string(st.reason) + ",field=" + std::to_string(st.field) + ",step=" + std::to_string(st.step) +
           ",peer=" + std::to_string(st.peer) +
           ",expected=" + std::to_string(st.expected) + ",seen=" + std::to_string(st.seen) + ";";
    }
    return s;
  }
};

std::vector<char> read_file(const std::string& f) {
  std::ifstream is(f, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
}

// ---------------- sched mode -------------------------------------------------------------------

struct CoArg {
  Sched* s;
  World* w;
  LaneFn fn;
  int rank, lane, calls;
  uint64_t timeout_ns;
};
CoArg* g_coargs = nullptr;

void co_entry(int idx) {
  CoArg& c = g_coargs[idx];
  for (int k = 0; k < c.calls; ++k) {
    const RingArgs a = c.w->args(c.rank, c.timeout_ns, k);
    if (!c.fn(a, c.lane)) break;
  }
  c.s->finish();
}

// One schedule: returns "" when it passed, else why not.
std::string run_schedule(Sched& s, World& w, LaneFn fn, int calls, uint64_t timeout_ns, const std::vector<char>& input,
                         const std::vector<char>& expect) {
  w.reset(input);
  const int nco = w.n * w.lanes;
  s.co.assign(nco, Sched::Co{});
  std::vector<CoArg> args(nco);
  g_coargs = args.data();
  for (int i = 0; i < nco; ++i) {
    args[i] = CoArg{&s, &w, fn, i / w.lanes, i % w.lanes, calls, timeout_ns};
    s.co[i].stack.resize(256 * 1024);
    getcontext(&s.co[i].ctx);
    s.co[i].ctx.uc_stack.ss_sp = s.co[i].stack.data();
    s.co[i].ctx.uc_stack.ss_size = s.co[i].stack.size();
    s.co[i].ctx.uc_link = nullptr;
    makecontext(&s.co[i].ctx, reinterpret_cast<void (*)()>(co_entry), 1, i);
  }
  s.trace.clear();
  s.vtime = 0;
  s.jumped = false;
  s.steps = 0;
  s.livelock = false;
  s.preemptions = 0;
  t_sched = &s;
  const int first = s.pick(-1);
  s.cur = first;
  swapcontext(&s.main_ctx, &s.co[first].ctx);
  t_sched = nullptr;
  std::string why = w.failures();
  if (!why.empty()) return "status:" + why;
  if (s.livelock) return "livelock";
  if (!expect.empty() && w.outputs() != expect) return "result differs";
  return "";
}

int sched_mode(World& w, LaneFn fn, int calls, uint64_t timeout_ns, const std::vector<char>& input,
               const std::vector<char>& expect) {
  Sched s;
  const std::string search = opt("search", "random:1000:1");
  const bool stop = opti("stop_on_fail", 0) != 0;
  long runs = 0, fails = 0;
  std::string first_fail;
  auto record = [&](const std::string& why) {
    ++runs;
    if (!why.empty()) {
      if (fails++ == 0) first_fail = why;
    }
  };
  if (search.rfind("random:", 0) == 0) {
    const auto c2 = search.find(':', 7);
    const long nrun = std::stol(search.substr(7, c2 - 7));
    std::mt19937_64 rng(std::stoull(search.substr(c2 + 1)));
    s.rng = &rng;
    for (long i = 0; i < nrun && !(stop && fails); ++i) record(run_schedule(s, w, fn, calls, timeout_ns, input, expect));
  } else if (search.rfind("bounded:", 0) == 0) {
    s.bound = std::stoi(search.substr(8));
    s.prefix.clear();
    const long cap = opti("max_runs", 5000000);
    while (runs < cap && !(stop && fails)) {
      record(run_schedule(s, w, fn, calls, timeout_ns, input, expect));
      // Next schedule in depth-first order: the last decision with an untried choice.
      auto t = s.trace;
      while (!t.empty() && t.back().first + 1 >= t.back().second) t.pop_back();
      if (t.empty()) break;
      s.prefix.clear();
      for (auto& d : t) s.prefix.push_back(d.first);
      s.prefix.back() += 1;
    }
    if (runs >= cap) {
      std::printf("incomplete=1 ");
    }
  } else {
    std::fprintf(stderr, "unknown search %s\n", search.c_str());
    return 2;
  }
  std::printf("schedules=%ld failures=%ld first_failure=%s\n", runs, fails, first_fail.empty() ? "none" : first_fail.c_str());
  return fails ? 1 : 0;
}

// ---------------- run mode (free-running) ------------------------------------------------------

uint64_t now_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

void run_rank(World& w, LaneFn fn, int r, int calls, uint64_t timeout_ns, long late_ms) {
  if (late_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
  std::vector<std::thread> th;
  for (int l = 0; l < w.lanes; ++l)
    th.emplace_back([&, l] {
      for (int k = 0; k < calls; ++k)
        if (!fn(w.args(r, timeout_ns, k), l)) break;
    });
  for (auto& t : th) t.join();
}

int run_mode(World& w, LaneFn fn, int calls, uint64_t timeout_ns, const std::vector<char>& input,
             const std::vector<char>& expect) {
  w.reset(input);
  const bool procs = opt("ranks", "threads") == "procs";
  int late_rank = -1, kill_rank = -1;
  long late_ms = 0, kill_ms = 0;
  if (g_opt.count("late")) std::sscanf(opt("late", "").c_str(), "%d:%ld", &late_rank, &late_ms);
  if (g_opt.count("kill")) std::sscanf(opt("kill", "").c_str(), "%d:%ld", &kill_rank, &kill_ms);
  const int absent = static_cast<int>(opti("absent", -1));
  const long abort_ms = opti("abort_ms", -1);
  const uint64_t t0 = now_ms();
  uint64_t* ends = static_cast<uint64_t*>(  // per-rank end times, shared with forked ranks
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> pids;
  std::vector<std::thread> threads;
  for (int r = 0; r < w.n; ++r) {
    if (r == absent) continue;
    const long lm = r == late_rank ? late_ms : 0;
    if (procs) {
      const pid_t p = fork();
      if (p == 0) {
        run_rank(w, fn, r, calls, timeout_ns, lm);
        ends[r] = now_ms() - t0;
        _exit(0);
      }
      pids.push_back(p);
    } else {
      threads.emplace_back([&, r, lm] {
        run_rank(w, fn, r, calls, timeout_ns, lm);
        ends[r] = now_ms() - t0;
      });
    }
  }
  if (kill_rank >= 0 && procs) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
    kill(pids[kill_rank - (absent >= 0 && absent < kill_rank ? 1 : 0)], SIGKILL);
  }
  if (abort_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(abort_ms));
    SysU32(*w.abort).store(1, cuda::std::memory_order_release);
  }
  for (auto& t : threads) t.join();
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  std::printf("elapsed_ms=%llu", static_cast<unsigned long long>(now_ms() - t0));
  for (int r = 0; r < w.n; ++r) std::printf(" end%d_ms=%llu", r, static_cast<unsigned long long>(ends[r]));
  const std::string why = w.failures();
  std::printf(" status=%s", why.empty() ? "none" : why.c_str());
  bool same = true;
  if (!expect.empty()) same = w.outputs() == expect;
  std::printf(" result=%s\n", expect.empty() ? "unchecked" : same ? "equal" : "differs");
  const std::string out = opt("out", "");
  if (!out.empty()) {
    const auto o = w.outputs();
    std::ofstream(out, std::ios::binary).write(o.data(), static_cast<std::streamsize>(o.size()));
  }
  return why.empty() && same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s run|sched key=value...\n", argv[0]);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    g_opt[a.substr(0, eq)] = eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  World w;
  w.n = static_cast<int>(opti("world", 2));
  w.lanes = static_cast<int>(opti("lanes", 1));
  w.nslots = static_cast<int>(opti("slots", 2));
  w.slot_bytes = opti("slot_bytes", 16);
  w.count = opti("count", 16);
  const std::string coll = opt("coll", "ar");
  w.coll = coll == "rs"   ? Coll::kReduceScatter
           : coll == "ag" ? Coll::kAllGather
           : coll == "bc" ? Coll::kBroadcast
           : coll == "rd" ? Coll::kReduce
                          : Coll::kAllReduce;
  w.inplace = opti("inplace", 0) != 0 || w.coll == Coll::kBroadcast;
  w.root = static_cast<int>(opti("root", 0));
  const auto dt = static_cast<DType>(opti("dtype", 0));
  auto op = static_cast<ReduceOp>(opti("op", 0));
  // all_gather and broadcast: any pair of the dtype moves its bytes
  if (w.coll == Coll::kAllGather || w.coll == Coll::kBroadcast) op = ReduceOp::kMax;
  w.dtype = static_cast<uint32_t>(dt);
  w.op = static_cast<uint32_t>(op);
  if (g_opt.count("skew")) {
    char field[16] = {0};
    if (std::sscanf(opt("skew", "").c_str(), "%d:%15[a-z]:%ld", &w.skew_rank, field, &w.skew_value) != 3) {
      std::fprintf(stderr, "skew=RANK:FIELD:VALUE\n");
      return 2;
    }
    w.skew_field = field;
    if (w.skew_field == "count" && (w.skew_value < 0 || w.skew_value > w.count)) {
      std::fprintf(stderr, "a skewed count must be in [0, count]\n");
      return 2;
    }
  }
  const int broken = static_cast<int>(opti("broken", 0));
  LaneOf lv;
  EsizeOf ev;
  const LaneFn fn = broken ? broken_lane(broken) : rc::rops::dispatch_reduce(dt, op, lv);
  w.es = broken ? 4 : rc::rops::dispatch_reduce(dt, op, ev);
  if (!fn || w.es == 0 || w.n < 2 || w.nslots < 2 || w.lanes < 1 || w.lanes > kMaxLanes || w.root < 0 ||
      w.root >= w.n) {
    std::fprintf(stderr, "unsupported arguments\n");
    return 2;
  }
  w.layout();
  const int calls = static_cast<int>(opti("calls", 1));
  const uint64_t timeout_ns = static_cast<uint64_t>(opti("timeout_ms", 10000)) * 1000000ull;
  std::vector<char> input = g_opt.count("in") ? read_file(opt("in", "")) : std::vector<char>();
  if (input.empty()) {  // deterministic small integers (exact in every dtype): rank r, element i
    input.resize(w.n * w.in_elems * w.es);
    for (size_t i = 0; i < input.size(); ++i) input[i] = 0;
    if (broken) {
      float* f = reinterpret_cast<float*>(input.data());
      for (int64_t i = 0; i < w.n * w.in_elems; ++i) f[i] = static_cast<float>(1 + (i * 7) % 13);
    }
  }
  if (static_cast<int64_t>(input.size()) != w.n * w.in_elems * w.es) {
    std::fprintf(stderr, "input holds %zu bytes, expected %lld\n", input.size(),
                 static_cast<long long>(w.n * w.in_elems * w.es));
    return 2;
  }
  const std::vector<char> expect = g_opt.count("expect") ? read_file(opt("expect", "")) : std::vector<char>();
  const std::string mode = argv[1];
  if (mode == "sched") return sched_mode(w, fn, calls, timeout_ns, input, expect);
  if (mode == "run") return run_mode(w, fn, calls, timeout_ns, input, expect);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
