// The facts about CPUs that the wait policy decides from at run time, and the decisions built on
// them (ShmConfig::unpinned_own, ShmWaits' load check: transport/shm_wait.h):
//   - the CPUs in this process's affinity mask, the online CPUs, and the cgroup CPU quota
//     (`cpu.max` of the process's cgroup v2 and of every cgroup above it, else cgroup v1's
//     cpu.cfs_quota_us / cpu.cfs_period_us: a container's quota, while its affinity mask still
//     shows every CPU of the host); the usable CPUs are the fewest of these;
//   - the node's load (/proc/loadavg: the kernel's instantaneous count of runnable threads, this
//     thread included, and the one-minute load average), read again while the communicator runs.
// Every fact comes from files under the roots of a CpuFactSources (by default /proc, /sys and
// /sys/fs/cgroup), so tests inject them; the decisions are pure functions of the facts.
#pragma once
#include <string>

namespace rc {

/// Where the facts are read: each root stands for the kernel's directory of the same role.
struct CpuFactSources {
  std::string proc = "/proc";              ///< self/cgroup, loadavg
  std::string sys = "/sys";                ///< devices/system/cpu/online
  std::string cgroup = "/sys/fs/cgroup";   ///< the cgroup mount (v2: cpu.max; v1: cpu/cpu.cfs_*)
};

/// CPU facts of this process (0: not known).
struct CpuFacts {
  int mask_cpus = 0;       ///< CPUs in the affinity mask
  int online = 0;          ///< online CPUs
  double quota_cpus = 0;   ///< the smallest cgroup quota / period on the cgroup's path (0: none)
};

/// Read the facts from `src`; `mask_cpus` is the affinity mask's count (the caller reads it:
/// sched_getaffinity has no file).
CpuFacts read_cpu_facts(const CpuFactSources& src, int mask_cpus);

/// A cgroup v2 `cpu.max` line ("max 100000", "150000 100000"): quota / period in CPUs, 0 for no
/// quota or a line that is not one.
double parse_cpu_max(const std::string& line);

/// A cpulist ("0-3,8,10-11", as /sys/devices/system/cpu/online): its CPU count, 0 if malformed.
int parse_cpu_list(const std::string& text);

/// The node's load: /proc/loadavg's runnable threads and one-minute average ("0.52 0.58 0.59
/// 3/789 12345": 3 and 0.52); -1 each where unknown.
struct NodeLoad {
  int running = -1;
  double avg1 = -1;
};
NodeLoad parse_loadavg(const std::string& text);

/// The node's load now (parse_loadavg of <proc>/loadavg).
NodeLoad read_load(const CpuFactSources& src);

/// The CPUs this process can use at once: the fewest of the known facts (a fractional quota
/// rounds down: 1.5 CPUs of quota keep two spinning threads running only two thirds of the time),
/// at least 1; 0 when nothing is known.
int usable_cpus(const CpuFacts& f);

/// Whether `ranks` local ranks that may run on the same CPUs (not pinned apart) in effect have a
/// CPU each: `usable` (usable_cpus) holds them with `spare` CPUs to spare.
bool unpinned_own_cpus(int ranks, int usable, int spare);

/// Whether the node is oversubscribed: more runnable threads now than `usable` CPUs plus `slack`,
/// or a one-minute load average above that plus `avg_slack` (an unknown figure never counts). The
/// instant count is one sample that busy processes between their time slices can miss; the
/// average does not miss them, lags a change of load by about a minute, and counts the ranks' own
/// busy time (hence its own slack).
bool load_oversubscribed(const NodeLoad& load, int usable, int slack, double avg_slack);

}  // namespace rc
