#include "common/knobs.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/errors.h"

namespace rc {

namespace {

using T = KnobType;

// The table. Defaults are strings in the knob's own syntax so that the README, config() and the
// accessors all show and parse the same text.
const std::vector<KnobInfo>& table() {
  static const std::vector<KnobInfo> t = {
      // shared-memory transport (csrc/transport/shm_*.cpp)
      {"RINGCOMM_SLOT_BYTES", T::kBytes, "256K", "", "size of one shared-memory slot (pieces stream through slots)", false},
      {"RINGCOMM_NSLOTS", T::kInt, "8", "", "slots per channel, a power of two in 2..1024 (the ring's deadlock-freedom argument needs two)", false},
      {"RINGCOMM_FAR_SLOT_BYTES", T::kBytes, "32K", "", "slot size of each rank's two outboxes (collectives, point-to-point; 3 or more ranks): every message but the ring predecessor's collective hand-offs is written into its sender's outbox and read there by its receiver (direct exchanges, point-to-point); at most RINGCOMM_SLOT_BYTES", false},
      {"RINGCOMM_OUTBOX_SLOTS", T::kInt, "16", "", "slots of each outbox (3 or more ranks), a power of two in 2..1024; per rank the shared memory is the same at any world size: header + RINGCOMM_NSLOTS x (RINGCOMM_SLOT_BYTES + 4K) + 2 x RINGCOMM_OUTBOX_SLOTS x (RINGCOMM_FAR_SLOT_BYTES + 4K)", false},
      {"RINGCOMM_P2P_EAGER_BYTES", T::kBytes, "1M", "", "point-to-point between processes: a send of more bytes waits for its receive (rendezvous: it announces itself and its data goes once the receive is posted); up to this size a send completes once written (from 3 ranks on, a message that arrives before its receive is held in the receiver's private memory)", false},
      {"RINGCOMM_TIMEOUT", T::kFloat, "300", "", "seconds any single wait may take (timeout= per communicator overrides)", false},
      {"RINGCOMM_WAIT", T::kChoice, "auto", "auto|spin|yield|adaptive", "wait policy: spin (pause-spin, then futex sleep), yield (spin with a sched_yield every RINGCOMM_YIELD_EVERY_NS, then futex), adaptive (spin, switching to yield for the next 64 waits after a spin ran out or was preempted) or auto (yield; the spin is 2 us instead of 50 when this node's ranks outnumber the CPUs they may run on)", false},
      {"RINGCOMM_SPIN_US", T::kInt, "50", "", "microseconds a waiter spins before sleeping on a futex (unset: 2 when ranks outnumber CPUs)", false},
      {"RINGCOMM_YIELD_US", T::kInt, "200", "", "while yielding: microseconds more of spinning with yields before the futex sleep", false},
      {"RINGCOMM_YIELD_EVERY_NS", T::kInt, "2000", "", "while yielding: sched_yield this often during the spin (min 100)", false},
      {"RINGCOMM_YIELD_LOST_US", T::kInt, "300", "", "while yielding: a sched_yield that kept the CPU away this long (a whole scheduler slice: another process's task ran, not a rank) with the awaited word still unset ends the wait's spin (it sleeps on the futex) and starts the back-off", false},
      {"RINGCOMM_YIELD_BACKOFF_MS", T::kInt, "50", "", "after such a lost yield, waits spin and sleep without sched_yield for this long (0: never back off)", false},
      {"RINGCOMM_LIVENESS_MS", T::kInt, "100", "", "how often a sleeping waiter checks that its peers are alive", false},
      {"RINGCOMM_HEARTBEAT_TIMEOUT_MS", T::kInt, "5000", "", "a peer in another PID namespace (containers sharing /dev/shm) is dead when its heartbeat has not moved for this long (the larger of both ranks' values); its background thread bumps it every 1/8 of this", false},
      {"RINGCOMM_TEST_ATTACH_PAUSE_MS", T::kInt, "0", "", "test hook: at init this rank sleeps this long after mapping its first peer's shared memory, before mapping the others' (a rank descheduled between two mappings)", false},
      {"RINGCOMM_TEST_PIDNS", T::kStr, "", "", "test hook: replaces this process's PID-namespace identity (ranks with different values use the heartbeat, not the pid probe)", false},
      // communicator: the selection of algorithm, protocol and store policy (csrc/comm/selection.h)
      {"RINGCOMM_ALGO", T::kChoice, "auto", "auto|ring|direct|two_shot|halving_doubling", "all-reduce algorithm: ring, direct (one hand-off, every rank combines all inputs), two_shot (a direct reduce-scatter, then a direct all-gather: two hand-offs, each rank combines 1/N), halving_doubling (recursive halving of the raw inputs, then recursive doubling: 2 log2 N hand-offs) or auto (below RINGCOMM_MODEL_MIN_WORLD ranks by size: RINGCOMM_LL_MAX_BYTES, RINGCOMM_DIRECT_MAX_BYTES, RINGCOMM_TWO_SHOT_MAX_BYTES; from there the cost model over RINGCOMM_PROFILE); must be equal on every rank", false},
      {"RINGCOMM_MODEL_MIN_WORLD", T::kInt, "5", "", "RINGCOMM_ALGO=auto picks the all-reduce algorithm with the cost model (docs/algorithms.md) from this many ranks up; below, by the measured size thresholds (2 lets the model decide everywhere)", false},
      {"RINGCOMM_PROFILE", T::kStr, "", "", "the machine profile of the cost model: a JSON file written by `python -m ringcomm.tune` (unset: the compiled-in defaults); every rank of a communicator must load the same one (its hash is compared at init: MismatchError)", false},
      {"RINGCOMM_DIRECT_MAX_BYTES", T::kBytes, "64K", "", "auto takes the direct all-reduce (and the direct broadcast) while bytes x (world - 1) is at most this", false},
      {"RINGCOMM_TWO_SHOT_MAX_BYTES", T::kBytes, "128K", "", "above the direct range, auto takes two_shot while bytes is at most this (with RINGCOMM_TWO_SHOT_MIN_WORLD ranks or more; the ring above)", false},
      {"RINGCOMM_TWO_SHOT_MIN_WORLD", T::kInt, "4", "", "auto takes two_shot only with at least this many ranks", false},
      {"RINGCOMM_LL_MAX_BYTES", T::kBytes, "4K", "", "all-reduces (under RINGCOMM_ALGO=auto) and broadcasts of at most this many bytes use the LL protocol: each rank writes header and data into 64-byte lines of its own shared-memory outbox (56 data bytes and a flag each) and its peers read them in place; the outbox's size, so equal on every rank (0: off)", false},
      {"RINGCOMM_HEADER_IN_SLOT", T::kChoice, "on", "on|off", "the header_in_slot protocol: direct all-reduces and broadcasts hand their first piece to every peer before posting the header, so header and data take one hand-off (a mismatch drains it and raises MismatchError on every rank); off: the simple protocol (header exchange first)", false},
      {"RINGCOMM_STREAM", T::kChoice, "auto", "auto|on|off", "stores into peers' slots: off (cached), on (streaming, non-temporal), auto (streaming from RINGCOMM_STREAM_MIN_BYTES up); the choice travels in the header, so ranks that differ raise MismatchError", false},
      {"RINGCOMM_STREAM_MIN_BYTES", T::kBytes, "1G", "", "RINGCOMM_STREAM=auto streams collectives of at least this many bytes (the message size; all_to_all never)", false},
      {"RINGCOMM_TRACE", T::kInt, "0", "", "keep the last N collectives' phase timestamps per communicator (comm.trace()); 0: off", false},
      {"RINGCOMM_DEBUG", T::kChoice, "WARN", "WARN|INFO|TRACE", "logging to stderr: INFO one line per communicator (transport, selection rule), TRACE also one per collective (its algorithm, protocol and store)", false},
      // reduce kernels (csrc/kernels/reduce_cpu.cpp)
      {"RINGCOMM_CPU_ISA", T::kChoice, "auto", "auto|avx512|avx2|generic", "CPU reduce kernels: auto (bfloat16 AVX-512 where present; other dtypes AVX2 where present; else generic), or one of avx512, avx2, generic for every dtype", false},
      // CPU placement and threads of a host rank (src/ringcomm/cpus.py, csrc/kernels/cpu_pool.h)
      {"RINGCOMM_BIND", T::kChoice, "none", "none|core|numa", "pin each local rank at init (before its shared memory is allocated): core (a contiguous share of the CPUs the process may use, one or more per local rank; with fewer CPUs than local ranks nothing is pinned), numa (the allowed CPUs of NUMA node local_rank mod nodes) or none; never applied when the process is already placed (an affinity mask or container cpuset narrower than the online CPUs, or another ringcomm job binding on this node: the INFO line says which)", false},
      {"RINGCOMM_START_METHOD", T::kChoice, "spawn", "spawn|forkserver", "how ringcomm.launch starts its ranks: spawn (a fresh interpreter each) or forkserver (forks of multiprocessing's fork server, which imports the modules of multiprocessing.set_forkserver_preload once, e.g. torch: ranks start faster; each still runs with the launching process's environment as it is at the call)", false},
      {"RINGCOMM_BIND_REGISTRY", T::kStr, "/tmp/.ringcomm-bind", "", "directory of the node registry through which ringcomm jobs that bind see each other (one file per process; the first job to register binds, later ones are left unbound)", false},
      {"RINGCOMM_THREADS", T::kStr, "auto", "", "threads per rank for copies and reductions of at least RINGCOMM_THREADS_MIN_BYTES: a count >= 1, or auto (OMP_NUM_THREADS where set, at most the rank's CPUs; else the CPUs the rank may use divided by the local ranks sharing them)", false},
      {"RINGCOMM_THREADS_MIN_BYTES", T::kBytes, "128K", "", "a copy or reduction of at least this many bytes (one slot's piece, or a whole buffer) is split over the rank's threads, by element ranges (results are bit-identical to one thread)", false},
      // CUDA transport and communicator
      {"RINGCOMM_CUDA_SLOT_BYTES", T::kBytes, "2M", "", "CUDA slot size (a multiple of 4096)", false},
      {"RINGCOMM_CUDA_NSLOTS", T::kInt, "4", "", "CUDA slots per channel, 2..64", false},
      {"RINGCOMM_CUDA_P2P", T::kChoice, "auto", "auto|ipc|host|hostsync", "CUDA channel kind", false},
      {"RINGCOMM_CUDA_MAX_BLOCKS", T::kInt, "0", "", "CUDA reduce grid cap (0: 4 blocks per SM)", false},
      {"RINGCOMM_CUDA_CLOSE_WAIT", T::kFloat, "30", "", "seconds a closing CUDA communicator waits for its peers' goodbyes", false},
      // Python: hierarchical collectives (ringcomm/hier.py)
      {"RINGCOMM_NODE_ID", T::kStr, "", "", "node identity (unset: hostname + boot id; set it to fake several nodes on one machine)", false},
      {"RINGCOMM_INTER", T::kChoice, "auto", "auto|gloo|mpi|nccl", "inter-node engine: auto (gloo for host memory), gloo, mpi (nccl not yet)", false},
      {"RINGCOMM_HIER_SCRATCH_CACHE", T::kBytes, "256M", "", "bytes of hierarchical temporaries kept between calls", false},
      // Python: ZeRO (ringcomm/zero.py)
      {"RINGCOMM_ZERO_BUCKET_MB", T::kFloat, "25", "", "ZeRO-1/2 bucket size in MiB", false},
      {"RINGCOMM_ZERO_MAX_INFLIGHT", T::kInt, "2", "", "ZeRO-2 reduce-scatters in flight during backward", false},
      {"RINGCOMM_ZERO_COLLECTIVES", T::kChoice, "auto", "auto|native|fallback", "ZeRO collectives: native, fallback (all_reduce + slice) or auto", false},
      // Python: torch.distributed backend (ringcomm/torch/)
      {"RINGCOMM_TORCH_BACKEND", T::kChoice, "auto", "auto|c10d|group", "torch backend: c10d (a per-device c10d Backend, JIT-built trampoline), group (one ProcessGroup for every device) or auto (c10d, else group with a warning)", false},
      // build (setup.py / CMakeLists.txt read these; listed so that the registry names every knob)
      {"RINGCOMM_CUDA", T::kChoice, "auto", "auto|on|off|1|0|true|false|yes|no", "build the CUDA sources when a toolkit is found (auto), always (on/1) or never (off/0)", true},
      {"RINGCOMM_BUILD_JOBS", T::kInt, "", "", "parallel build jobs (unset: the CPU count)", true},
      {"RINGCOMM_BUILD_TYPE", T::kStr, "Release", "", "CMake build type", true},
  };
  return t;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string accepted(const KnobInfo& k) {
  switch (k.type) {
    case T::kInt: return "an integer";
    case T::kFloat: return "a number";
    case T::kBytes: return "a byte count with an optional K/M/G suffix";
    case T::kStr: return "any text";
    case T::kChoice: {
      std::string out = "one of ";
      for (const char* p = k.choices; *p; ++p) out += (*p == '|') ? std::string(", ") : std::string(1, *p);
      return out;
    }
  }
  return "";
}

[[noreturn]] void bad_value(const KnobInfo& k, const std::string& v) {
  std::ostringstream o;
  o << "ringcomm: environment knob " << k.name << "='" << v << "' is not valid: expected " << accepted(k);
  throw InvalidArgument(o.str());
}

// The value's text: the environment's if set and non-empty, else the table's default.
std::string raw(const KnobInfo& k, bool* from_env) {
  const char* v = std::getenv(k.name);
  const bool set = v != nullptr && *v != '\0';
  if (from_env) *from_env = set;
  return set ? std::string(v) : std::string(k.default_value);
}

int64_t parse_int(const KnobInfo& k, const std::string& v, bool allow_suffix) {
  const char* s = v.c_str();
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s, &end, 0);
  if (end == s || errno == ERANGE) bad_value(k, v);
  if (allow_suffix && *end) {
    int shift = 0;
    switch (*end) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: bad_value(k, v);
    }
    ++end;
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
    x = static_cast<long long>(static_cast<unsigned long long>(x) << shift);
  }
  if (*end != '\0') bad_value(k, v);
  return static_cast<int64_t>(x);
}

std::string parse_choice(const KnobInfo& k, const std::string& v) {
  const std::string want = lower(v);
  std::string c = k.choices;
  size_t start = 0;
  for (;;) {
    size_t bar = c.find('|', start);
    std::string opt = c.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (lower(opt) == want) return opt;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  bad_value(k, v);
}

[[noreturn]] void wrong_type(const KnobInfo& k, const char* want) {
  std::ostringstream o;
  o << "ringcomm: knob " << k.name << " is a " << knob_type_name(k.type) << " knob, read as " << want;
  throw Error(o.str());
}

[[noreturn]] void no_default(const KnobInfo& k) {
  std::ostringstream o;
  o << "ringcomm: knob " << k.name << " has no default; check knob_is_set() before reading it as a number";
  throw Error(o.str());
}

}  // namespace

const std::vector<KnobInfo>& knob_table() { return table(); }

const KnobInfo& knob_info(const std::string& name) {
  for (const auto& k : table())
    if (name == k.name) return k;
  throw Error("ringcomm: '" + name + "' is not a registered knob (csrc/common/knobs.cpp)");
}

const char* knob_type_name(KnobType t) {
  switch (t) {
    case T::kInt: return "int";
    case T::kFloat: return "float";
    case T::kBytes: return "bytes";
    case T::kStr: return "str";
    case T::kChoice: return "choice";
  }
  return "?";
}

bool knob_is_set(const std::string& name) {
  bool set = false;
  raw(knob_info(name), &set);
  return set;
}

int64_t knob_int(const std::string& name) {
  const KnobInfo& k = knob_info(name);
  if (k.type != T::kInt && k.type != T::kBytes) wrong_type(k, "an integer");
  const std::string v = raw(k, nullptr);
  if (v.empty()) no_default(k);
  return parse_int(k, v, k.type == T::kBytes);
}

int64_t knob_bytes(const std::string& name) {
  const KnobInfo& k = knob_info(name);
  if (k.type != T::kBytes) wrong_type(k, "bytes");
  return knob_int(name);
}

double knob_double(const std::string& name) {
  const KnobInfo& k = knob_info(name);
  if (k.type == T::kInt || k.type == T::kBytes) return static_cast<double>(knob_int(name));
  if (k.type != T::kFloat) wrong_type(k, "a number");
  const std::string v = raw(k, nullptr);
  if (v.empty()) no_default(k);
  const char* s = v.c_str();
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE) bad_value(k, v);
  return x;
}

std::string knob_str(const std::string& name) {
  const KnobInfo& k = knob_info(name);
  const std::string v = raw(k, nullptr);
  if (k.type == T::kChoice) return parse_choice(k, v);
  return v;
}

}  // namespace rc
