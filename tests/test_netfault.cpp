// Network faults between hosts, through the real binary: hosts are Linux network namespaces on a
// bridge (netns_util.h), each running `slicetrain launch ... -- finetune`, and the test takes a
// host's link down mid-epoch. A partition longer than --timeout-ms fails the collectives on every
// host within the timeout, every launcher restarts its workers, the group meets again once the
// link is back and ends with the weights of an uninterrupted run, exit 0 everywhere; a shorter one
// rides through; a link that never comes back ends every host non-zero with nothing left running;
// a slow link (tc tbf) is no timeout. Needs root and iproute2; skipped with a message otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "netns_util.h"
#include "proc_util.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using testing::BackgroundProc;
using testing::Cat;
using testing::Namespaces;
using Clock = std::chrono::steady_clock;

struct JobSpec {
  int per_host = 1;
  int max_failures = 3;
  int rendezvous_ms = 60000;
  int timeout_ms = 6000;  // 0: none on the command line (SLICETRAIN_TIMEOUT_MS's default)
  std::string split = "train[:256]";
  int epochs = 3;
};

class NetFault : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/st_netfault_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Creates `hosts` namespaces, or says why the test is skipped.
  std::string MakeHosts(int hosts) {
    ns_ = std::make_unique<Namespaces>(testing::IpTool(), hosts, "10.232.0");
    return ns_->CreateOrSayWhyNot();
  }

  // One launcher per host: 3 epochs (17 steps at 2 workers x 4 rows of 64 tokens), a step
  // checkpoint every 8 steps, all writing to one shared directory.
  std::vector<std::unique_ptr<BackgroundProc>> Start(const std::string& run, const JobSpec& j) {
    std::vector<std::unique_ptr<BackgroundProc>> hosts;
    const int n = ns_->hosts();
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {testing::IpTool(),
                                       "netns",
                                       "exec",
                                       ns_->Host(i),
                                       ST_BINARY,
                                       "launch",
                                       "--nnodes",
                                       std::to_string(n),
                                       "--node-rank",
                                       std::to_string(i),
                                       "--nproc-per-node",
                                       std::to_string(j.per_host),
                                       "--master-addr",
                                       ns_->Addr(0),
                                       "--master-port",
                                       "29712",
                                       "--max-failures",
                                       std::to_string(j.max_failures),
                                       "--rendezvous-timeout-ms",
                                       std::to_string(j.rendezvous_ms),
                                       "--grace-ms",
                                       "1000",
                                       "--",
                                       "finetune",
                                       "--data-dir",
                                       ST_SOURCE_DIR "/data",
                                       "--dataset-split",
                                       j.split,
                                       "--max-seq-len",
                                       "64",
                                       "--num-epochs",
                                       std::to_string(j.epochs),
                                       "--topology",
                                       Cat(std::to_string(n), "x", std::to_string(j.per_host)),
                                       "--progress",
                                       "lines",
                                       "--no-dashboard",
                                       "--save-steps",
                                       "8",
                                       "--storage-path",
                                       dir_,
                                       "--run-name",
                                       run};
      if (j.timeout_ms > 0) {
        argv.push_back("--timeout-ms");
        argv.push_back(std::to_string(j.timeout_ms));
      }
      hosts.push_back(std::make_unique<BackgroundProc>(
          argv, std::vector<std::string>{"SLICETRAIN_SECRET=0123456789abcdef0123456789abcdef"}));
    }
    return hosts;
  }

  // Runs the job to the end on every host; the final weights (empty when a host failed).
  std::string Run(const std::string& run, const JobSpec& j) {
    auto hosts = Start(run, j);
    bool ok = true;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const int rc = hosts[i]->Wait(seconds(300));
      EXPECT_EQ(rc, 0) << "host " << i << ":\n" << hosts[i]->out();
      ok = ok && rc == 0;
    }
    return ok ? Weights(run) : "";
  }

  std::string Weights(const std::string& run) {
    return test::ReadFile(test::NewestCheckpoint(dir_ + "/" + run) + "/model.safetensors");
  }

  // Waits until host 0 prints step 3 of epoch 2, cuts host `h` off for `down`, then waits for
  // every host; returns the exit codes.
  std::vector<int> CutAndWait(std::vector<std::unique_ptr<BackgroundProc>>& hosts, int h,
                              std::chrono::milliseconds down) {
    EXPECT_TRUE(hosts[0]->WaitFor("epoch 2/3 step 3/", seconds(300))) << hosts[0]->out();
    EXPECT_TRUE(ns_->LinkDown(h));
    std::this_thread::sleep_for(down);
    EXPECT_TRUE(ns_->LinkUp(h));
    std::vector<int> codes;
    for (auto& p : hosts) codes.push_back(p->Wait(seconds(300)));
    return codes;
  }

  // A reference run, then the same job with `cut_host` cut off for 12 s in epoch 2: every host
  // restarts its workers and ends at exit 0 with the reference's weights.
  void ExpectRestartWithUninterruptedWeights(const JobSpec& job, int cut_host) {
    const std::string expected = Run("reference", job);
    ASSERT_FALSE(expected.empty());
    auto hosts = Start("cut", job);
    const auto codes = CutAndWait(hosts, cut_host, std::chrono::milliseconds(12000));
    for (size_t i = 0; i < hosts.size(); ++i) {
      EXPECT_EQ(codes[i], 0) << "host " << i << ":\n" << hosts[i]->out();
      EXPECT_NE(hosts[i]->out().find("restarting this host's workers"), std::string::npos)
          << hosts[i]->out();
    }
    EXPECT_TRUE(Weights("cut") == expected) << "the final weights differ";
  }

  std::unique_ptr<Namespaces> ns_;
  std::string dir_;
};

bool Has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// Two hosts: a 2 s cut (under the 6 s timeout) rides through without a restart; a 12 s cut fails
// a collective on both hosts within the timeout, both restart, meet again after the link is back,
// resume from the newest step checkpoint and end with the uninterrupted run's weights.
TEST_F(NetFault, TwoHostsRideThroughAShortCutAndRestartAfterALongOne) {
  if (const std::string why = MakeHosts(2); !why.empty()) GTEST_SKIP() << why;
  const JobSpec job;
  const std::string expected = Run("reference", job);
  ASSERT_FALSE(expected.empty());
  {
    auto hosts = Start("short_cut", job);
    const auto codes = CutAndWait(hosts, 1, std::chrono::milliseconds(2000));
    for (size_t i = 0; i < hosts.size(); ++i) {
      EXPECT_EQ(codes[i], 0) << "host " << i << ":\n" << hosts[i]->out();
      EXPECT_FALSE(Has(hosts[i]->out(), "restarting")) << hosts[i]->out();
    }
    EXPECT_TRUE(Weights("short_cut") == expected) << "the final weights differ";
  }
  {
    auto hosts = Start("long_cut", job);
    const auto codes = CutAndWait(hosts, 1, std::chrono::milliseconds(12000));
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string out = hosts[i]->out();
      EXPECT_EQ(codes[i], 0) << "host " << i << ":\n" << out;
      EXPECT_TRUE(Has(out, "restarting this host's workers (1 of --max-failures 3)")) << out;
      // Detected by the collective timeout (6 s), not the 60 s SLICETRAIN_TIMEOUT_MS default.
      EXPECT_TRUE(Has(out, "Timed out waiting 6000ms")) << out;
      EXPECT_FALSE(Has(out, "malformed")) << out;
    }
    EXPECT_TRUE(Has(hosts[0]->out(), "Resuming from ")) << hosts[0]->out();
    EXPECT_TRUE(Weights("long_cut") == expected) << "the relaunched run's final weights differ";
  }
}

// Three hosts, and the one cut off is host 0: the store's host. The others notice within the
// timeout, wait at the rendezvous for its new store, and all three end with the same weights as
// an uninterrupted run.
TEST_F(NetFault, ThreeHostsRecoverFromLosingTheStoresHost) {
  if (const std::string why = MakeHosts(3); !why.empty()) GTEST_SKIP() << why;
  ExpectRestartWithUninterruptedWeights(JobSpec{}, /*cut_host=*/0);
}

// Two workers per host: shared memory on a host, TCP between the hosts' leaders. The ranks that
// only wait on shared memory fail as well, and the group restarts as a whole.
TEST_F(NetFault, TwoHostsOfTwoWorkersRestartAcrossTheHierarchy) {
  if (const std::string why = MakeHosts(2); !why.empty()) GTEST_SKIP() << why;
  JobSpec job;
  job.per_host = 2;
  ExpectRestartWithUninterruptedWeights(job, /*cut_host=*/1);
}

// The link never comes back: every host fails its collective within the timeout, tries once more
// (--max-failures 1) and gives up at the rendezvous after --rendezvous-timeout-ms, with one error
// line and no process left in its namespace.
TEST_F(NetFault, ALinkThatNeverComesBackEndsEveryHostNonZero) {
  if (const std::string why = MakeHosts(2); !why.empty()) GTEST_SKIP() << why;
  JobSpec job;
  job.max_failures = 1;
  job.rendezvous_ms = 8000;
  job.timeout_ms = 4000;
  auto hosts = Start("lost", job);
  ASSERT_TRUE(hosts[0]->WaitFor("epoch 2/3 step 3/", seconds(300))) << hosts[0]->out();
  ASSERT_TRUE(ns_->LinkDown(1));
  const auto t0 = Clock::now();
  for (size_t i = 0; i < hosts.size(); ++i) {
    const int rc = hosts[i]->Wait(seconds(120));
    const std::string out = hosts[i]->out();
    EXPECT_NE(rc, -1) << "host " << i << " hung:\n" << out;
    EXPECT_EQ(rc, 75) << "host " << i << ":\n" << out;
    EXPECT_EQ(testing::LinesWith(out, "slicetrain launch: error: ").size(), 1u) << out;
    EXPECT_TRUE(Has(out, "at the rendezvous (--rendezvous-timeout-ms 8000)")) << out;
    // The first failure is the collective that was blocked: within the timeout plus 1 s.
    std::smatch m;
    const std::regex failed(R"(failed after ([0-9]+) ms)");
    ASSERT_TRUE(std::regex_search(out, m, failed)) << out;
    EXPECT_GE(std::stoi(m[1]), 4000) << out;
    EXPECT_LE(std::stoi(m[1]), 5000) << out;
  }
  // 4 s timeout + restart + 8 s rendezvous, with room for a loaded CI machine.
  EXPECT_LT(Clock::now() - t0, seconds(45));
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(ns_->Pids(i).empty()) << "a process is left on host " << i;
}

// Both links limited to 10 Mbit/s: the run is slower but finishes at the default timeout, with
// no collective or store call timing out.
TEST_F(NetFault, ASlowLinkIsNoTimeout) {
  if (const std::string why = MakeHosts(2); !why.empty()) GTEST_SKIP() << why;
  if (!ns_->Shape(0, "10mbit") || !ns_->Shape(1, "10mbit"))
    GTEST_SKIP() << "tc (iproute2) cannot shape the links here";
  JobSpec job;
  job.timeout_ms = 0;
  job.split = "train[:16]";
  job.epochs = 1;
  auto hosts = Start("slow", job);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const int rc = hosts[i]->Wait(seconds(300));
    const std::string out = hosts[i]->out();
    EXPECT_EQ(rc, 0) << "host " << i << ":\n" << out;
    EXPECT_FALSE(Has(out, "timed out")) << out;
    EXPECT_FALSE(Has(out, "Timed out")) << out;
  }
  EXPECT_TRUE(Has(hosts[0]->out(), "Training completed!")) << hosts[0]->out();
}

}  // namespace
}  // namespace st
