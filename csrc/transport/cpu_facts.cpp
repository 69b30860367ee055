// The CPU facts' readers and the decisions on them (transport/cpu_facts.h).
#include "transport/cpu_facts.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rc {

namespace {

// The whole file (a few lines of procfs / sysfs / cgroupfs), "" when it cannot be read.
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::ostringstream o;
  o << f.rdbuf();
  return o.str();
}

// The process's cgroup path from <proc>/self/cgroup: v2's ("0::/user.slice/x.scope") or, `v1`,
// the cpu controller's ("4:cpu,cpuacct:/docker/abc"); "" if none.
std::string cgroup_path(const std::string& text, bool v1) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctl = "," + line.substr(a + 1, b - a - 1) + ",";
    if (v1 ? ctl.find(",cpu,") != std::string::npos : line.rfind("0::", 0) == 0) return line.substr(b + 1);
  }
  return "";
}

// The smallest quota (CPUs) on the path from cgroup `path` up to the root; `quota(dir)` reads one
// directory's (0: none).
template <class Quota>
double smallest_quota(std::string path, const std::string& root, Quota quota) {
  double best = 0;
  if (path.empty() || path.front() != '/') return 0;
  for (;;) {
    const double q = quota(root + (path == "/" ? "" : path));
    if (q > 0 && (best == 0 || q < best)) best = q;
    if (path == "/") return best;
    const size_t cut = path.find_last_of('/');
    path = cut == 0 ? "/" : path.substr(0, cut);
  }
}

}  // namespace

double parse_cpu_max(const std::string& line) {
  std::istringstream in(line);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || period <= 0 || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<double>(q) / static_cast<double>(period);
}

int parse_cpu_list(const std::string& text) {
  int n = 0;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    while (!part.empty() && (part.back() == '\n' || part.back() == ' ')) part.pop_back();
    if (part.empty()) continue;
    char* end = nullptr;
    const long a = std::strtol(part.c_str(), &end, 10);
    if (end == part.c_str() || a < 0) return 0;
    long b = a;
    if (*end == '-') {
      const char* s = end + 1;
      b = std::strtol(s, &end, 10);
      if (end == s || b < a) return 0;
    }
    if (*end != '\0') return 0;
    n += static_cast<int>(b - a + 1);
  }
  return n;
}

NodeLoad parse_loadavg(const std::string& text) {
  NodeLoad l;
  std::istringstream in(text);
  std::string a, b, c, rt;
  if (!(in >> a >> b >> c >> rt)) return l;
  char* end = nullptr;
  const double avg = std::strtod(a.c_str(), &end);
  if (end != a.c_str() && *end == '\0' && avg >= 0) l.avg1 = avg;
  const size_t slash = rt.find('/');
  if (slash == std::string::npos || slash == 0) return l;
  const long r = std::strtol(rt.c_str(), &end, 10);
  if (end == rt.c_str() + slash && r >= 0) l.running = static_cast<int>(r);
  return l;
}

NodeLoad read_load(const CpuFactSources& src) { return parse_loadavg(slurp(src.proc + "/loadavg")); }

CpuFacts read_cpu_facts(const CpuFactSources& src, int mask_cpus) {
  CpuFacts f;
  f.mask_cpus = std::max(0, mask_cpus);
  f.online = parse_cpu_list(slurp(src.sys + "/devices/system/cpu/online"));
  // The quota that binds is the smallest on the path from the process's cgroup up to the root:
  // cgroup v2's cpu.max, else (a v1 or hybrid hierarchy) the cpu controller's CFS quota.
  const std::string cg = slurp(src.proc + "/self/cgroup");
  f.quota_cpus = smallest_quota(cgroup_path(cg, false), src.cgroup,
                                [](const std::string& d) { return parse_cpu_max(slurp(d + "/cpu.max")); });
  if (f.quota_cpus == 0)
    f.quota_cpus = smallest_quota(cgroup_path(cg, true), src.cgroup + "/cpu", [](const std::string& d) {
      return parse_cpu_max(slurp(d + "/cpu.cfs_quota_us") + " " + slurp(d + "/cpu.cfs_period_us"));
    });
  return f;
}

int usable_cpus(const CpuFacts& f) {
  int n = 0;
  const auto take = [&n](int v) {
    if (v > 0) n = n == 0 ? v : std::min(n, v);
  };
  take(f.mask_cpus);
  take(f.online);
  if (f.quota_cpus > 0) take(std::max(1, static_cast<int>(std::floor(f.quota_cpus + 1e-9))));
  return n;
}

bool unpinned_own_cpus(int ranks, int usable, int spare) {
  return ranks >= 1 && usable >= 1 && ranks + std::max(0, spare) <= usable;
}

bool load_oversubscribed(const NodeLoad& load, int usable, int slack, double avg_slack) {
  if (usable < 1) return false;
  const int cap = usable + std::max(0, slack);
  return (load.running >= 0 && load.running > cap) || (load.avg1 >= 0 && load.avg1 > cap + std::max(0.0, avg_slack));
}

}  // namespace rc
