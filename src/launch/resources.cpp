#include "launch/resources.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace st::launch {

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ParseNumber(const std::string& s, double* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return false;
  while (*end == ' ' || *end == '\n' || *end == '\t') ++end;
  if (*end != '\0') return false;
  *out = v;
  return true;
}

// "/a/b/c" -> {"/a/b/c", "/a/b", "/a", "/"}: a cgroup and its ancestors, innermost first.
std::vector<std::string> SelfAndAncestors(std::string path) {
  if (path.empty() || path[0] != '/') path = "/" + path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::vector<std::string> out{path};
  while (path != "/") {
    const size_t slash = path.find_last_of('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
    out.push_back(path);
  }
  return out;
}

// The tightest positive quota among `dir + cgroup` and its ancestors; `read` gives the quota of
// one directory (0 = none).
template <typename ReadQuota>
double Tightest(const std::string& dir, const std::string& cgroup, ReadQuota read) {
  double best = 0;
  for (const std::string& g : SelfAndAncestors(cgroup)) {
    const double q = read(g == "/" ? dir : dir + g);
    if (q > 0 && (best == 0 || q < best)) best = q;
  }
  return best;
}

// The cgroup path of `controller` in /proc/self/cgroup's text (lines "id:controllers:path"):
// "" names the v2 line ("0::/path"), else a v1 line listing it ("1:cpu,cpuacct:/path").
bool CgroupPath(const std::string& proc_cgroup, const std::string& controller, std::string* out) {
  std::istringstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    bool match = controller.empty() && controllers.empty() && line.compare(0, a, "0") == 0;
    std::istringstream cs(controllers);
    for (std::string c; !controller.empty() && std::getline(cs, c, ',');) match |= c == controller;
    if (match) {
      *out = line.substr(b + 1);
      return true;
    }
  }
  return false;
}

}  // namespace

int CpuBudget::usable() const {
  int n = std::max(1, affinity);
  if (quota > 0) n = std::min(n, std::max(1, static_cast<int>(std::floor(quota + 1e-9))));
  return n;
}

std::string CpuBudget::Describe() const {
  char quota_text[64];
  if (quota > 0)
    std::snprintf(quota_text, sizeof(quota_text), "cgroup quota %.2f CPUs", quota);
  else
    std::snprintf(quota_text, sizeof(quota_text), "no cgroup quota");
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%d CPUs (affinity %d of %d online, %s)", usable(), affinity,
                online, quota_text);
  return buf;
}

double ParseCpuMax(const std::string& text) {
  std::istringstream in(text);
  std::string quota, period;
  if (!(in >> quota)) return 0;
  if (quota == "max") return 0;
  if (!(in >> period)) period = "100000";
  double q = 0, p = 0;
  if (!ParseNumber(quota, &q) || !ParseNumber(period, &p) || q <= 0 || p <= 0) return 0;
  return q / p;
}

double ParseCfsQuota(const std::string& quota_us, const std::string& period_us) {
  double q = 0, p = 0;
  if (!ParseNumber(quota_us, &q) || !ParseNumber(period_us, &p) || q <= 0 || p <= 0) return 0;
  return q / p;
}

double ReadCgroupCpuQuota(const std::string& proc_cgroup, const std::string& root) {
  std::string v2_path, v1_path;
  const bool has_v2 = CgroupPath(proc_cgroup, "", &v2_path);
  const bool has_v1 = CgroupPath(proc_cgroup, "cpu", &v1_path);
  double best = 0;
  auto tighter = [&best](double q) {
    if (q > 0 && (best == 0 || q < best)) best = q;
  };
  if (has_v2) {
    auto v2 = [](const std::string& d) { return ParseCpuMax(ReadSmallFile(d + "/cpu.max")); };
    tighter(Tightest(root, v2_path, v2));
    tighter(Tightest(root + "/unified", v2_path, v2));  // the hybrid (v1 + v2) layout
  }
  if (has_v1) {
    auto v1 = [](const std::string& d) {
      return ParseCfsQuota(ReadSmallFile(d + "/cpu.cfs_quota_us"),
                           ReadSmallFile(d + "/cpu.cfs_period_us"));
    };
    for (const char* mount : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"})
      tighter(Tightest(root + mount, v1_path, v1));
  }
  return best;
}

CpuBudget ReadCpuBudget() {
  CpuBudget b;
  b.online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t set;
  CPU_ZERO(&set);
  b.affinity =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : b.online;
  b.quota = ReadCgroupCpuQuota(ReadSmallFile("/proc/self/cgroup"), "/sys/fs/cgroup");
  return b;
}

namespace {

// Room left under one cgroup's limit, 0 = no limit there.
double RoomUnder(const std::string& limit_text, const std::string& usage_text) {
  double limit = 0, usage = 0;
  if (!ParseNumber(limit_text, &limit) || limit <= 0 || limit >= 9e18) return 0;  // "max", -1
  if (!ParseNumber(usage_text, &usage)) usage = 0;
  return std::max(1.0, limit - usage);
}

}  // namespace

size_t AvailableMemoryBytes() {
  double best = 0;
  {
    std::istringstream in(ReadSmallFile("/proc/meminfo"));
    for (std::string key; in >> key;) {
      double kb = 0;
      in >> kb;
      if (key == "MemAvailable:") best = kb * 1024;
      std::string rest;
      std::getline(in, rest);
    }
  }
  const std::string proc = ReadSmallFile("/proc/self/cgroup"), root = "/sys/fs/cgroup";
  auto tighter = [&best](double room) {
    if (room > 0 && (best == 0 || room < best)) best = room;
  };
  std::string path;
  if (CgroupPath(proc, "", &path))
    for (const std::string& g : SelfAndAncestors(path))
      for (const std::string& base : {root, root + "/unified"}) {
        const std::string d = g == "/" ? base : base + g;
        tighter(RoomUnder(ReadSmallFile(d + "/memory.max"), ReadSmallFile(d + "/memory.current")));
      }
  if (CgroupPath(proc, "memory", &path))
    for (const std::string& g : SelfAndAncestors(path)) {
      const std::string d = g == "/" ? root + "/memory" : root + "/memory" + g;
      tighter(RoomUnder(ReadSmallFile(d + "/memory.limit_in_bytes"),
                        ReadSmallFile(d + "/memory.usage_in_bytes")));
    }
  return static_cast<size_t>(best);
}

std::string DescribeAvailableMemory() {
  const size_t bytes = AvailableMemoryBytes();
  if (bytes == 0) return "available memory unknown";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f GiB available", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

int ThreadsPerWorker(const CpuBudget& budget, int local_workers, int requested) {
  if (requested > 0) return requested;
  return std::max(1, budget.usable() / std::max(1, local_workers));
}

}  // namespace st::launch
