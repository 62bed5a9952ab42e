// Faults on purpose, through the real binary: a worker killed with SIGKILL at a random step of an
// epoch and while a checkpoint is being written, a worker that stops answering (SIGSTOP), a lost
// worker and a lost host under `launch` across two "hosts" on loopback. With --max-failures the
// group restarts from the latest good checkpoint and the final weights equal those of a run that
// was never interrupted; without it, or when a host never comes back, the job ends with one clear
// error line within a bounded time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "proc_util.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using Proc = testing::BackgroundProc;
using test::NewestCheckpoint;
using test::ReadFile;
using Clock = std::chrono::steady_clock;

// The pids of the worker processes a driver or launcher started (its children, by pid).
std::vector<pid_t> Workers(pid_t parent) {
  return test::ChildPids(parent);
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/st_faults_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 3 epochs of 8 steps over 2 workers: small enough for a test, long enough to hit mid-epoch.
  std::vector<std::string> Finetune(const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> argv = {ST_BINARY,
                                     "finetune",
                                     "--data-dir",
                                     ST_SOURCE_DIR "/data",
                                     "--dataset-split",
                                     "train[:64]",
                                     "--max-seq-len",
                                     "32",
                                     "--num-epochs",
                                     "3",
                                     "--topology",
                                     "2",
                                     "--progress",
                                     "lines",
                                     "--no-dashboard",
                                     "--storage-path",
                                     dir_,
                                     "--run-name",
                                     run};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  std::string Reference() {
    Proc ref(Finetune("reference", {}));
    EXPECT_EQ(ref.Wait(std::chrono::seconds(300)), 0) << ref.out();
    return ReadFile(NewestCheckpoint(dir_ + "/reference") + "/model.safetensors");
  }
  std::string dir_;
};

TEST_F(Faults, KilledWorkersMidEpochAndMidCheckpointResumeExactly) {
  const std::string expected = Reference();
  ASSERT_FALSE(expected.empty());
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const int step = std::uniform_int_distribution<int>(1, 7)(rng);
  const int victim = std::uniform_int_distribution<int>(0, 1)(rng);
  SCOPED_TRACE("seed " + std::to_string(seed) + ": SIGKILL of worker " + std::to_string(victim) +
               " after step " + std::to_string(step) + " of epoch 2");

  Proc job(Finetune("faulty", {"--max-failures", "2"}));
  // 1. A random worker at a random step of epoch 2.
  ASSERT_TRUE(
      job.WaitFor("epoch 2/3 step " + std::to_string(step) + "/8", std::chrono::seconds(300)))
      << job.out();
  std::vector<pid_t> workers = Workers(job.pid());
  ASSERT_EQ(workers.size(), 2u) << job.out();
  ASSERT_EQ(kill(workers[victim], SIGKILL), 0);
  // 2. After the restart, rank 0 while it writes the checkpoint of epoch 2: the epoch line is
  // printed just before the shards are gathered and written.
  ASSERT_TRUE(job.WaitFor(R"(Restarting the workers \(restart 1 of --max-failures 2\))",
                          std::chrono::seconds(60)))
      << job.out();
  ASSERT_TRUE(job.WaitFor(R"(Epoch 2/3 \| loss=)", std::chrono::seconds(300))) << job.out();
  workers = Workers(job.pid());
  ASSERT_EQ(workers.size(), 2u) << job.out();
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  ASSERT_EQ(job.Wait(std::chrono::seconds(600)), 0) << job.out();
  const std::string out = job.out();
  // What failed, where it resumed.
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(Worker group failed: worker rank \d \(pid \d+, host 127\.0\.0\.1\) was )"
                      R"(killed by signal 9 \(Killed\))")))
      << out;
  EXPECT_NE(out.find("(restart 2 of --max-failures 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("Resuming from "), std::string::npos) << out;
  EXPECT_NE(out.find("Training completed!"), std::string::npos) << out;
  // No damaged checkpoint was committed, none was left half-written.
  for (const auto& e : fs::directory_iterator(dir_ + "/faulty"))
    EXPECT_NE(e.path().filename().string().rfind(".pending_", 0), 0u) << e.path();
  const std::string got = ReadFile(NewestCheckpoint(dir_ + "/faulty") + "/model.safetensors");
  EXPECT_TRUE(got == expected)
      << "the final weights of the run that lost workers differ from the uninterrupted run's";
}

// --gradient-accumulation-steps 2 with a step checkpoint every 2 optimizer steps: a worker killed
// right after an odd step (inside the next step's micro-batches, before its update) makes the
// restarted run resume from the even step's checkpoint and redo the whole cycle; the final
// weights are the uninterrupted run's, bit for bit.
TEST_F(Faults, KilledInsideAnAccumulationCycleResumesExactly) {
  const std::vector<std::string> acc = {
      "--gradient-accumulation-steps", "2", "--batch-size-per-device", "2", "--save-steps", "2"};
  Proc ref(Finetune("reference", acc));
  ASSERT_EQ(ref.Wait(std::chrono::seconds(300)), 0) << ref.out();
  const std::string expected =
      ReadFile(NewestCheckpoint(dir_ + "/reference") + "/model.safetensors");
  ASSERT_FALSE(expected.empty());
  // An odd step of epoch 2 that the progress lines show, followed by another step.
  const std::string ref_out = ref.out();
  const std::regex step_re(R"(epoch 2/3 step (\d+)/(\d+))");
  std::string line;
  for (auto it = std::sregex_iterator(ref_out.begin(), ref_out.end(), step_re);
       it != std::sregex_iterator(); ++it) {
    const int step = std::stoi((*it)[1]), steps = std::stoi((*it)[2]);
    if (step % 2 == 1 && step + 1 < steps) {
      line = (*it)[0];
      break;
    }
  }
  ASSERT_FALSE(line.empty()) << ref_out;
  SCOPED_TRACE("SIGKILL of worker 1 after '" + line + "'");
  std::vector<std::string> faulty = acc;
  faulty.insert(faulty.end(), {"--max-failures", "1"});
  Proc job(Finetune("faulty", faulty));
  ASSERT_TRUE(job.WaitFor(line, std::chrono::seconds(300))) << job.out();
  std::vector<pid_t> workers = Workers(job.pid());
  ASSERT_EQ(workers.size(), 2u) << job.out();
  ASSERT_EQ(kill(workers[1], SIGKILL), 0);
  ASSERT_EQ(job.Wait(std::chrono::seconds(600)), 0) << job.out();
  const std::string out = job.out();
  EXPECT_NE(out.find("(restart 1 of --max-failures 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("Resuming from "), std::string::npos) << out;
  const std::string got = ReadFile(NewestCheckpoint(dir_ + "/faulty") + "/model.safetensors");
  EXPECT_TRUE(got == expected)
      << "the final weights of the run killed inside an accumulation cycle differ from the "
         "uninterrupted run's";
}

TEST_F(Faults, StoppedWorkerIsDetectedByTimeout) {
  // Without restarts: the job ends with one error line naming the collective that timed out.
  {
    Proc job(Finetune("stopped", {"--timeout-ms", "3000"}));
    ASSERT_TRUE(job.WaitFor("epoch 1/3 step 3/8", std::chrono::seconds(300))) << job.out();
    std::vector<pid_t> workers = Workers(job.pid());
    ASSERT_EQ(workers.size(), 2u);
    ASSERT_EQ(kill(workers[1], SIGSTOP), 0);
    const int code = job.Wait(std::chrono::seconds(120));
    const std::string out = job.out();
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(code, -1) << "the job hung: " << out;
    EXPECT_NE(out.find("failed after"), std::string::npos) << out;
    EXPECT_NE(out.find("--max-failures N restarts"), std::string::npos) << out;
    std::smatch m;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n') > 0, true);
    EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(slicetrain finetune: error: .*)"))) << out;
    // Nothing is left behind, stopped or not.
    EXPECT_TRUE(Workers(job.pid()).empty());
  }
  // With a restart: the stopped worker is killed, the group restarts and finishes.
  {
    Proc job(Finetune("stopped_restart", {"--timeout-ms", "3000", "--max-failures", "1"}));
    ASSERT_TRUE(job.WaitFor("epoch 1/3 step 3/8", std::chrono::seconds(300))) << job.out();
    std::vector<pid_t> workers = Workers(job.pid());
    ASSERT_EQ(workers.size(), 2u);
    ASSERT_EQ(kill(workers[1], SIGSTOP), 0);
    ASSERT_EQ(job.Wait(std::chrono::seconds(600)), 0) << job.out();
    const std::string out = job.out();
    EXPECT_NE(out.find("from the beginning: no checkpoint yet"), std::string::npos) << out;
    EXPECT_NE(out.find("No usable checkpoint of"), std::string::npos) << out;
    EXPECT_NE(out.find("Epoch 3/3"), std::string::npos) << out;
  }
}

// Two `launch` processes on loopback play two hosts of one job (SLICETRAIN_SECRET shared).
TEST_F(Faults, LaunchRestartsAcrossHostsAndGivesUpOnAHostThatNeverReturns) {
  const std::string port = std::to_string(20000 + (getpid() % 20000));
  auto host = [&](int node, const std::string& run, const std::string& failures) {
    std::vector<std::string> argv = {ST_BINARY,
                                     "launch",
                                     "--nnodes",
                                     "2",
                                     "--node-rank",
                                     std::to_string(node),
                                     "--nproc-per-node",
                                     "1",
                                     "--master-addr",
                                     "127.0.0.1",
                                     "--master-port",
                                     port,
                                     "--max-failures",
                                     failures,
                                     "--grace-ms",
                                     "1000",
                                     "--rendezvous-timeout-ms",
                                     "20000",
                                     "--"};
    std::vector<std::string> ft = Finetune(run, {});
    std::replace(ft.begin(), ft.end(), std::string("2"), std::string("2x1"));  // --topology
    argv.insert(argv.end(), ft.begin() + 1, ft.end());
    return std::make_unique<Proc>(
        argv, std::vector<std::string>{"SLICETRAIN_SECRET=0123456789abcdef0123456789abcdef",
                                       "SLICETRAIN_TIMEOUT_MS=8000"});
  };
  // The reference ran under launch too: 1 worker per host gets both cores' threads, and thread
  // counts may change the order of float sums.
  std::string expected;
  {
    auto h0 = host(0, "launch_reference", "0");
    auto h1 = host(1, "launch_reference", "0");
    ASSERT_EQ(h1->Wait(std::chrono::seconds(600)), 0) << h1->out();
    ASSERT_EQ(h0->Wait(std::chrono::seconds(600)), 0) << h0->out();
    expected = ReadFile(NewestCheckpoint(dir_ + "/launch_reference") + "/model.safetensors");
    ASSERT_FALSE(expected.empty());
  }
  {
    // A worker of host 1 dies in epoch 2: both hosts restart theirs, they meet again, finish.
    auto h0 = host(0, "launched", "2");
    auto h1 = host(1, "launched", "2");
    ASSERT_TRUE(h0->WaitFor("epoch 2/3 step 2/8", std::chrono::seconds(300))) << h0->out();
    std::vector<pid_t> w1 = Workers(h1->pid());
    ASSERT_EQ(w1.size(), 1u) << h1->out();
    ASSERT_EQ(kill(w1[0], SIGKILL), 0);
    EXPECT_EQ(h1->Wait(std::chrono::seconds(600)), 0) << h1->out();
    EXPECT_EQ(h0->Wait(std::chrono::seconds(600)), 0) << h0->out();
    EXPECT_NE(h1->out().find("restarting this host's workers (1 of --max-failures 2)"),
              std::string::npos)
        << h1->out();
    EXPECT_NE(h0->out().find("restarting this host's workers"), std::string::npos) << h0->out();
    EXPECT_NE(h0->out().find("Resuming from "), std::string::npos) << h0->out();
    const std::string got = ReadFile(NewestCheckpoint(dir_ + "/launched") + "/model.safetensors");
    EXPECT_TRUE(got == expected) << "the relaunched run's final weights differ";
  }
  {
    // Host 1 is lost for good (its launcher and workers killed): host 0 restarts, waits at the
    // rendezvous for a bounded time, and ends with a clear error.
    auto h0 = host(0, "lost_host", "1");
    auto h1 = host(1, "lost_host", "1");
    ASSERT_TRUE(h0->WaitFor("epoch 1/3 step 2/8", std::chrono::seconds(300))) << h0->out();
    kill(-h1->pid(), SIGKILL);
    const auto t0 = Clock::now();
    const int code = h0->Wait(std::chrono::seconds(300));
    const std::string out = h0->out();
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(code, -1) << "host 0 waited forever: " << out;
    EXPECT_NE(out.find("slicetrain launch: error: node 0 (127.0.0.1): "), std::string::npos) << out;
    EXPECT_NE(out.find("at the rendezvous (--rendezvous-timeout-ms 20000)"), std::string::npos)
        << out;
    // The collective timeout (8 s), then one restart that waits 20 s at the rendezvous.
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(90));
  }
}

}  // namespace
}  // namespace st
