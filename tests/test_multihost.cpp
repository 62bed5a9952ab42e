// Multi-host without a cluster: 4 Linux network namespaces joined by veth pairs to a bridge are
// 4 hosts; on each, `slicetrain launch --nproc-per-node 4` starts 4 workers of the 4x4 slice from
// the Kubernetes Indexed Job environment (JOB_COMPLETION_INDEX + SLICETRAIN_HOSTS). Needs root and
// `ip netns`; skipped with a message otherwise. The namespaces are removed even on failure.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include "netns_util.h"
#include "proc_util.h"
#include "test_util.h"

namespace st {
namespace {

using testing::Cat;
using testing::IpTool;
using testing::Namespaces;

using std::chrono::seconds;
using testing::LinesWith;
using testing::Proc;

const std::string kBin = ST_BINARY;

// One `slicetrain launch --nproc-per-node <per_host> -- <command>` in every host's namespace, with
// the Kubernetes Indexed Job environment (JOB_COMPLETION_INDEX + SLICETRAIN_HOSTS).
std::vector<std::unique_ptr<Proc>> LaunchOnEveryHost(const std::string& ip, const Namespaces& ns,
                                                     int hosts, int per_host,
                                                     const std::vector<std::string>& command,
                                                     const std::string& port,
                                                     const std::string& secret,
                                                     const std::string& timeout_ms) {
  std::string addrs;
  for (int i = 0; i < hosts; ++i) addrs = Cat(addrs, i ? "," : "", ns.Addr(i));
  std::vector<std::unique_ptr<Proc>> launchers;
  for (int i = 0; i < hosts; ++i) {
    std::vector<std::string> argv = {ip,
                                     "netns",
                                     "exec",
                                     ns.Host(i),
                                     kBin,
                                     "launch",
                                     "--nproc-per-node",
                                     std::to_string(per_host),
                                     "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    launchers.push_back(std::make_unique<Proc>(
        argv, std::vector<std::string>{Cat("JOB_COMPLETION_INDEX=", std::to_string(i)),
                                       Cat("SLICETRAIN_HOSTS=", addrs), Cat("MASTER_PORT=", port),
                                       Cat("SLICETRAIN_SECRET=", secret),
                                       Cat("SLICETRAIN_TIMEOUT_MS=", timeout_ms)}));
  }
  return launchers;
}

TEST(MultiHost, FourNamespacesOfFourWorkersRunCollectives) {
  const std::string ip = IpTool();
  Namespaces ns(ip, 4);
  if (const std::string why = ns.CreateOrSayWhyNot(); !why.empty()) GTEST_SKIP() << why;

  auto launchers = LaunchOnEveryHost(ip, ns, 4, 4, {"collectives", "--topology", "4x4"}, "29517",
                                     "netns-test-secret", "30000");
  std::vector<int> rcs;
  for (auto& l : launchers) rcs.push_back(l->Wait(seconds(90)));
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(rcs[i], 0) << "host " << i << ":\n" << launchers[i]->output();

  // Host 0's launcher carries rank 0's report: 16 lines with each worker's own host address.
  const std::string& out = launchers[0]->output();
  for (int r = 0; r < 16; ++r) {
    char want[160];
    std::snprintf(want, sizeof(want),
                  "Rank %2d (worker_id=%d, local_rank=%d, ip=%s): all_reduce_sum=[136.0, 136.0, "
                  "136.0, 136.0]",
                  r, r / 4, r % 4, ns.Addr(r / 4).c_str());
    EXPECT_EQ(LinesWith(out, want).size(), 1u) << want << "\n" << out;
  }
  EXPECT_EQ(LinesWith(out, "All 16 slicetrain ranks verified DTensor TP parity").size(), 1u) << out;
  EXPECT_EQ(LinesWith(out, "(rank 0 pid=").size(), 17u) << out;
  EXPECT_NE(out.find("ip=10.231.0.1) Rank  0"), std::string::npos);
}

// 1-3 hosts of 1-4 ranks: one rank per host is a flat TCP group, more make the hierarchical one
// (shared memory inside a namespace, one TCP ring per local rank across them). allreduce-loop
// checks every element of every all_reduce (a 4 MiB message, several pipeline chunks' worth of ring
// steps).
TEST(MultiHost, HostsOfOneToFourRanksAllReduce) {
  const std::string ip = IpTool();
  Namespaces ns(ip, 3);
  if (const std::string why = ns.CreateOrSayWhyNot(); !why.empty()) GTEST_SKIP() << why;
  int port = 29531;
  for (auto [hosts, per_host] :
       std::vector<std::pair<int, int>>{{1, 4}, {2, 1}, {2, 3}, {3, 2}, {3, 4}}) {
    SCOPED_TRACE(Cat(std::to_string(hosts), " hosts x ", std::to_string(per_host)));
    auto launchers =
        LaunchOnEveryHost(ip, ns, hosts, per_host,
                          {"allreduce-loop", "--iters", "12", "--count", "1000003", "--report"},
                          std::to_string(port++), "netns-test-secret", "30000");
    for (int i = 0; i < hosts; ++i)
      ASSERT_EQ(launchers[i]->Wait(seconds(90)), 0) << "host " << i << ":\n"
                                                    << launchers[i]->output();
    const std::string via = hosts == 1 ? "shm" : per_host == 1 ? "tcp" : "shm+tcp";
    EXPECT_EQ(LinesWith(launchers[0]->output(), Cat("ranks via ", via, ":")).size(), 1u)
        << launchers[0]->output();
  }
}

TEST(MultiHost, LostHostTakesTheOthersDown) {
  const std::string ip = IpTool();
  Namespaces ns(ip, 2);
  if (const std::string why = ns.CreateOrSayWhyNot(); !why.empty()) GTEST_SKIP() << why;
  auto launchers = LaunchOnEveryHost(ip, ns, 2, 2,
                                     {"allreduce-loop", "--iters", "100000000", "--count", "4096",
                                      "--fail-rank", "3", "--fail-at", "50"},
                                     "29518", "s", "5000");
  const auto t0 = std::chrono::steady_clock::now();
  const int rc1 = launchers[1]->Wait(seconds(40));
  const int rc0 = launchers[0]->Wait(seconds(40));
  EXPECT_NE(rc1, 0);
  EXPECT_NE(rc1, -1) << "host 1 hung";
  EXPECT_NE(rc0, 0) << launchers[0]->output();
  EXPECT_NE(rc0, -1) << "host 0 hung:\n" << launchers[0]->output();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(30));
  EXPECT_NE(launchers[1]->output().find("worker rank 3"), std::string::npos)
      << launchers[1]->output();
}

// Nothing listens beyond the interface the job uses: while a job runs, every TCP listener in each
// host's namespace (rank 0's store; Gloo's pairs listen only until they are connected) is on that
// host's address, none on 0.0.0.0, :: or another interface.
TEST(MultiHost, ListenersBindTheJobsInterfaceOnly) {
  const std::string ip = IpTool();
  Namespaces ns(ip, 2);
  if (const std::string why = ns.CreateOrSayWhyNot(); !why.empty()) GTEST_SKIP() << why;
  auto launchers = LaunchOnEveryHost(
      ip, ns, 2, 2, {"allreduce-loop", "--iters", "100000000", "--count", "16", "--sleep-ms", "5"},
      "29519", "listeners", "10000");
  ASSERT_TRUE(launchers[0]->ReadUntil(
      [](const std::string& o) { return o.find("iteration 20 done") != std::string::npos; },
      seconds(60)))
      << launchers[0]->output();
  for (int i = 0; i < 2; ++i) {
    in_addr a{};
    ASSERT_EQ(inet_pton(AF_INET, ns.Addr(i).c_str(), &a), 1);
    char want[16];
    std::snprintf(want, sizeof(want), "%08X", a.s_addr);  // as /proc/net/tcp writes it
    const test::Ran r =
        test::RunCommand(Cat(ip, " netns exec ", ns.Host(i), " cat /proc/net/tcp /proc/net/tcp6"));
    ASSERT_EQ(r.code, 0) << r.out;
    std::istringstream lines(r.out);
    int listeners = 0;
    bool store_seen = false;
    for (std::string line; std::getline(lines, line);) {
      std::istringstream ss(line);
      std::string sl, local, remote, state;
      ss >> sl >> local >> remote >> state;
      if (state != "0A") continue;  // LISTEN
      ++listeners;
      const std::string addr = local.substr(0, local.find(':'));
      EXPECT_EQ(addr, want) << "host " << i << " listens on " << local << "\n" << r.out;
      store_seen = store_seen || local == Cat(want, ":", "734F");  // port 29519
    }
    // Gloo's pairs stop listening once connected: then only rank 0's store is left.
    if (i == 0) {
      EXPECT_GT(listeners, 0) << r.out;
      EXPECT_TRUE(store_seen) << "rank 0's store is not on " << want << "\n" << r.out;
    }
  }
  for (auto& l : launchers) kill(l->pid(), SIGTERM);
  for (auto& l : launchers) EXPECT_NE(l->Wait(seconds(30)), -1) << l->output();
}

}  // namespace
}  // namespace st
