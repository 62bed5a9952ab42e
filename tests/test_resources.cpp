// What the host lets a worker use (src/launch/resources.h): the cgroup CPU quota read from fake
// cgroup trees (v2, v1 and the hybrid layout, with a tighter parent), the affinity mask of this
// process, the threads per worker, and the available memory.
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>

#include "launch/resources.h"
#include "test_util.h"

namespace st::launch {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(CpuQuota, ParsesCpuMaxAndCfsFiles) {
  EXPECT_DOUBLE_EQ(ParseCpuMax("max 100000\n"), 0);
  EXPECT_DOUBLE_EQ(ParseCpuMax("150000 100000\n"), 1.5);
  EXPECT_DOUBLE_EQ(ParseCpuMax("800000 100000"), 8);
  EXPECT_DOUBLE_EQ(ParseCpuMax("200000"), 2);  // period defaults to 100 ms
  for (const char* bad : {"", "abc 100000", "-5 100000", "100000 0", "1e5x 100000"})
    EXPECT_DOUBLE_EQ(ParseCpuMax(bad), 0) << bad;
  EXPECT_DOUBLE_EQ(ParseCfsQuota("-1\n", "100000\n"), 0);
  EXPECT_DOUBLE_EQ(ParseCfsQuota("50000\n", "100000\n"), 0.5);
  EXPECT_DOUBLE_EQ(ParseCfsQuota("", "100000"), 0);
}

TEST(CpuQuota, V2TakesTheTightestOfTheCgroupAndItsAncestors) {
  const std::string root = test::TempDir("cg2");
  Write(fs::path(root) / "kubepods" / "cpu.max", "400000 100000\n");
  Write(fs::path(root) / "kubepods" / "pod1" / "cpu.max", "max 100000\n");
  Write(fs::path(root) / "kubepods" / "pod1" / "ctr" / "cpu.max", "800000 100000\n");
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota("0::/kubepods/pod1/ctr\n", root), 4);
  Write(fs::path(root) / "kubepods" / "pod1" / "ctr" / "cpu.max", "250000 100000\n");
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota("0::/kubepods/pod1/ctr\n", root), 2.5);
  // A cgroup namespace: the process sees itself at "/", its limit in the root's cpu.max.
  const std::string ns = test::TempDir("cg2ns");
  Write(fs::path(ns) / "cpu.max", "300000 100000\n");
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota("0::/\n", ns), 3);
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota("0::/\n", root), 0);  // no file: no quota
  fs::remove_all(root);
  fs::remove_all(ns);
}

TEST(CpuQuota, V1AndHybridLayouts) {
  const std::string root = test::TempDir("cg1");
  Write(fs::path(root) / "cpu,cpuacct" / "slurm" / "job7" / "cpu.cfs_quota_us", "200000\n");
  Write(fs::path(root) / "cpu,cpuacct" / "slurm" / "job7" / "cpu.cfs_period_us", "100000\n");
  Write(fs::path(root) / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us", "-1\n");
  Write(fs::path(root) / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us", "100000\n");
  const std::string v1 = "12:memory:/slurm/job7\n3:cpu,cpuacct:/slurm/job7\n0::/\n";
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota(v1, root), 2);
  // Hybrid: a v2 limit under unified/ counts too, the tighter wins.
  Write(fs::path(root) / "unified" / "cpu.max", "100000 100000\n");
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota(v1, root), 1);
  EXPECT_DOUBLE_EQ(ReadCgroupCpuQuota("garbage\n\n::\n", root), 0);
  fs::remove_all(root);
}

TEST(CpuBudget, UsableIsTheAffinityCappedByTheQuota) {
  CpuBudget b;
  b.online = 96;
  b.affinity = 96;
  EXPECT_EQ(b.usable(), 96);
  b.quota = 8;  // a pod limited to 8 CPUs on a 96-core node
  EXPECT_EQ(b.usable(), 8);
  EXPECT_EQ(ThreadsPerWorker(b, 4, 0), 2);
  EXPECT_EQ(ThreadsPerWorker(b, 16, 0), 1);  // never 0
  EXPECT_EQ(ThreadsPerWorker(b, 4, 5), 5);   // asked for: as asked
  b.quota = 0.5;
  EXPECT_EQ(b.usable(), 1);
  b.quota = 0;
  b.affinity = 3;
  EXPECT_EQ(b.usable(), 3);
  EXPECT_NE(b.Describe().find("affinity 3 of 96"), std::string::npos) << b.Describe();
}

TEST(CpuBudget, ReadsThisProcessAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // what `taskset -c N` does
  const CpuBudget b = ReadCpuBudget();
  sched_setaffinity(0, sizeof(saved), &saved);
  EXPECT_EQ(b.affinity, 1);
  EXPECT_EQ(b.usable(), 1);
  EXPECT_GE(b.online, 1);
  EXPECT_EQ(ReadCpuBudget().affinity, CPU_COUNT(&saved));
}

TEST(Memory, AvailableIsPlausible) {
  const size_t bytes = AvailableMemoryBytes();
  EXPECT_GT(bytes, size_t{64} << 20);
  EXPECT_NE(DescribeAvailableMemory().find("GiB available"), std::string::npos);
}

}  // namespace
}  // namespace st::launch
