// What this host lets the job use. CPUs: the scheduler affinity mask (taskset, Slurm
// --cpus-per-task, the Kubernetes static CPU manager) capped by the cgroup CPU quota (v2 cpu.max
// or v1 cpu.cfs_quota_us: a pod's CPU limit), shared by the host's workers as compute threads.
// Memory: MemAvailable capped by the cgroup memory limit. Not a placement tool: it never pins.
#pragma once

#include <cstddef>
#include <string>

namespace st::launch {

struct CpuBudget {
  int online = 1;    // CPUs the kernel has online (what hardware_concurrency() counts)
  int affinity = 1;  // CPUs in this process's affinity mask
  double quota = 0;  // the tightest cgroup quota of this process's cgroup and its ancestors,
                     // in CPUs (quota / period); 0 = no quota
  // What the process may use: min(affinity, quota rounded down), at least 1.
  int usable() const;
  // "2 CPUs (affinity 2 of 2 online, no cgroup quota)", for logs and the dashboard.
  std::string Describe() const;
};

// Reads the affinity mask, /proc/self/cgroup and the quota files under /sys/fs/cgroup.
CpuBudget ReadCpuBudget();

// The quota in CPUs of one cgroup, from the text of a v2 `cpu.max` file ("max 100000": none;
// "150000 100000": 1.5) or of v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` ("-1": none).
// Malformed text counts as no quota. 0 = none.
double ParseCpuMax(const std::string& text);
double ParseCfsQuota(const std::string& quota_us, const std::string& period_us);

// The tightest quota that applies to a process whose /proc/self/cgroup reads `proc_cgroup`, with
// the cgroup file systems mounted under `cgroup_root` (/sys/fs/cgroup): the process's own cgroup
// and each ancestor up to the (namespace) root, in the v2 hierarchy (cgroup_root itself, or its
// `unified/` in the hybrid layout) and in the v1 `cpu` controller. 0 = none.
double ReadCgroupCpuQuota(const std::string& proc_cgroup, const std::string& cgroup_root);

// Compute threads of one worker: `requested` when > 0 (--threads, SLICETRAIN_THREADS or
// OMP_NUM_THREADS), else the usable CPUs divided among `local_workers`, at least 1.
int ThreadsPerWorker(const CpuBudget& budget, int local_workers, int requested);

// Bytes this process could still get: /proc/meminfo's MemAvailable, capped by what is left under
// the tightest cgroup memory limit (v2 memory.max - memory.current, v1 limit_in_bytes -
// usage_in_bytes) of its cgroup and ancestors. 0 when unknown.
size_t AvailableMemoryBytes();
// "21.3 GiB available" (or "available memory unknown"), for error lines.
std::string DescribeAvailableMemory();

}  // namespace st::launch
