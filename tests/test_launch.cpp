// The slicetrain binary end to end: `collectives` prints the seed's lines, `launch` prefixes and
// supervises workers, and a worker that dies (killed, failing, or the launcher interrupted) takes
// the group down within seconds with no process left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "launch/supervisor.h"
#include "proc_util.h"
#include "test_util.h"

namespace st {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::LinesWith;
using testing::Proc;

const std::string kBin = ST_BINARY;

std::string ExpectedSeedLines(int hosts, int per_host) {
  std::string s;
  const int world = hosts * per_host;
  const int sum = world * (world + 1) / 2;
  char line[256];
  for (int r = 0; r < world; ++r) {
    std::snprintf(line, sizeof(line),
                  "Rank %2d (worker_id=%d, local_rank=%d, ip=127.0.0.1): "
                  "all_reduce_sum=[%d.0, %d.0, %d.0, %d.0]\n",
                  r, r / per_host, r % per_host, sum, sum, sum, sum);
    s += line;
  }
  return s;
}

// Output minus the summary line, and the summary line.
std::pair<std::string, std::string> SplitSummary(const std::string& out) {
  size_t at = out.find("All ");
  if (at == std::string::npos) return {out, ""};
  return {out.substr(0, at), out.substr(at)};
}

TEST(CollectivesCommand, DefaultPrintsSeedLinesFor4HostsOf4) {
  Proc p({kBin, "collectives"}, {}, /*merge_stderr=*/false);
  ASSERT_EQ(p.Wait(seconds(60)), 0) << p.output();
  auto [lines, summary] = SplitSummary(p.output());
  EXPECT_EQ(lines, ExpectedSeedLines(4, 4));
  EXPECT_TRUE(std::regex_match(summary, std::regex("All 16 slicetrain ranks verified DTensor TP "
                                                   "parity \\(max_abs_diff=0\\.0000[0-9]{2}\\) and "
                                                   "all_reduce sum = 136\\.0\n")))
      << summary;
}

TEST(CollectivesCommand, TpuV7xIs2HostsOf8) {
  Proc p({kBin, "collectives", "--topology", "2x2x2", "--accelerator-type", "TPU-V7X"}, {}, false);
  ASSERT_EQ(p.Wait(seconds(60)), 0) << p.output();
  auto [lines, summary] = SplitSummary(p.output());
  EXPECT_EQ(lines, ExpectedSeedLines(2, 8));
  EXPECT_NE(summary.find("All 16 slicetrain ranks verified"), std::string::npos);
}

TEST(CollectivesCommand, ImpossibleShapeAndContradictionAreOneLineErrors) {
  Proc bad({kBin, "collectives", "--topology", "3x3"});
  EXPECT_EQ(bad.Wait(seconds(10)), 2);
  EXPECT_NE(bad.output().find("valid: 2x2, 2x4, 4x4"), std::string::npos) << bad.output();
  Proc contra({kBin, "collectives"}, {"RANK=0", "WORLD_SIZE=4"});
  EXPECT_EQ(contra.Wait(seconds(10)), 2);
  EXPECT_NE(contra.output().find("world size 4"), std::string::npos) << contra.output();
  EXPECT_NE(contra.output().find("contradicts topology"), std::string::npos);
}

TEST(CollectivesCommand, MismatchExitsNonZeroNamingTheRank) {
  Proc p({kBin, "collectives", "--topology", "2x2", "--corrupt-rank", "2"});
  const int rc = p.Wait(seconds(60));
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << p.output();
  EXPECT_NE(p.output().find("rank 2 all_reduce_sum is [11.0, 10.0, 10.0, 10.0], expected 10.0 x 4"),
            std::string::npos)
      << p.output();
  EXPECT_EQ(p.output().find("verified"), std::string::npos) << p.output();
}

TEST(Launch, PrefixesEveryLineAndRunsCollectives) {
  Proc p({kBin, "launch", "--nproc-per-node", "4", "--", "collectives", "--topology", "2x2"});
  ASSERT_EQ(p.Wait(seconds(60)), 0) << p.output();
  const std::regex prefix(R"(^\(rank ([0-9]+) pid=([0-9]+) ip=127\.0\.0\.1\) .*)");
  std::smatch m;
  int lines = 0;
  for (const auto& line : LinesWith(p.output(), "")) {
    if (line.empty()) continue;
    ++lines;
    ASSERT_TRUE(std::regex_match(line, m, prefix)) << "unprefixed line: " << line;
  }
  EXPECT_EQ(lines, 5);
  EXPECT_EQ(LinesWith(p.output(), "all_reduce_sum=[10.0, 10.0, 10.0, 10.0]").size(), 4u);
  EXPECT_EQ(LinesWith(p.output(), "All 4 slicetrain ranks verified").size(), 1u);
}

TEST(Launch, FailingWorkerIsNamedAndGroupStops) {
  const auto t0 = std::chrono::steady_clock::now();
  Proc p({kBin, "launch", "--nproc-per-node", "3", "--", "allreduce-loop", "--iters", "1000000",
          "--count", "64", "--fail-rank", "1", "--fail-at", "20"});
  const int rc = p.Wait(seconds(30));
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "launch hung:\n" << p.output();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(20));
  EXPECT_NE(p.output().find("worker rank 1"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("exited with code 3"), std::string::npos) << p.output();
  EXPECT_EQ(rc, 3) << "launch exits with the failed worker's code";
}

// Reads the worker pids from the "(rank R pid=P ...)" prefixes of the "ready" lines.
std::map<int, pid_t> WorkerPids(const std::string& out) {
  std::map<int, pid_t> pids;
  const std::regex re(R"(\(rank ([0-9]+) pid=([0-9]+) ip=[^)]*\) ready)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    pids[std::stoi((*it)[1])] = std::stoi((*it)[2]);
  return pids;
}

TEST(Launch, WorkerKilledMidCollectiveTakesGroupDown) {
  Proc p({kBin, "launch", "--nproc-per-node", "4", "--", "allreduce-loop", "--iters", "100000000",
          "--count", "262144"},
         {"SLICETRAIN_TIMEOUT_MS=10000"});
  ASSERT_TRUE(p.ReadUntil(
      [](const std::string& o) { return o.find("iteration 10 done") != std::string::npos; },
      seconds(30)))
      << p.output();
  auto pids = WorkerPids(p.output());
  ASSERT_EQ(pids.size(), 4u) << p.output();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pids[2], SIGKILL), 0);
  const int rc = p.Wait(seconds(20));
  EXPECT_NE(rc, -1) << "launch hung:\n" << p.output();
  EXPECT_NE(rc, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(12));
  EXPECT_NE(p.output().find("worker rank 2"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("killed by signal 9"), std::string::npos) << p.output();
  for (auto [rank, pid] : pids) EXPECT_TRUE(testing::PidGone(pid)) << "rank " << rank << " left";
}

TEST(Launch, SigtermIsForwardedAndNothingIsLeft) {
  Proc p({kBin, "launch", "--nproc-per-node", "2", "--", "allreduce-loop", "--iters", "100000000",
          "--count", "16", "--sleep-ms", "5"});
  ASSERT_TRUE(
      p.ReadUntil([](const std::string& o) { return WorkerPids(o).size() == 2; }, seconds(30)))
      << p.output();
  auto pids = WorkerPids(p.output());
  kill(p.pid(), SIGTERM);
  const int rc = p.Wait(seconds(15));
  EXPECT_EQ(rc, 128 + SIGTERM) << p.output();
  EXPECT_NE(p.output().find("interrupted by signal"), std::string::npos) << p.output();
  for (auto [rank, pid] : pids) EXPECT_TRUE(testing::PidGone(pid)) << "rank " << rank << " left";
}

TEST(Launch, MultiHostWithoutSecretIsRejected) {
  Proc p({kBin, "launch", "--nnodes", "2", "--node-rank", "0", "--", "collectives"});
  EXPECT_EQ(p.Wait(seconds(10)), 2);
  EXPECT_NE(p.output().find("SLICETRAIN_SECRET"), std::string::npos) << p.output();
}

// The job secret (SLICETRAIN_SECRET) admits processes to the store and the collectives; it must
// not leak into what a run prints or writes (logs, metrics, run.json, cluster.json, checkpoints).
TEST(Launch, JobSecretAppearsInNoOutputOrFile) {
  char tmpl[] = "/tmp/st_secret_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, secret = "Zq9-job-secret-4f1c";
  Proc p({kBin,
          "launch",
          "--nproc-per-node",
          "2",
          "--",
          "finetune",
          "--data-dir",
          ST_SOURCE_DIR "/data",
          "--dataset-split",
          "train[:32]",
          "--num-epochs",
          "1",
          "--max-seq-len",
          "32",
          "--topology",
          "2",
          "--no-dashboard",
          "--progress",
          "off",
          "--storage-path",
          dir},
         {"SLICETRAIN_SECRET=" + secret});
  ASSERT_EQ(p.Wait(seconds(120)), 0) << p.output();
  EXPECT_EQ(p.output().find(secret), std::string::npos) << p.output();
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(secret), std::string::npos) << e.path();
    if (!e.is_regular_file()) continue;
    ++files;
    EXPECT_EQ(test::ReadFile(e.path()).find(secret), std::string::npos) << e.path();
  }
  EXPECT_GT(files, 8) << "the run wrote its files";
  std::filesystem::remove_all(dir);
}

// Peers that notice a killed rank often exit (75, "a peer was lost") before the supervisor reaps
// the rank itself; the report must still name the rank that died, not the first one that noticed.
TEST(Supervisor, NamesTheWorkerThatDiedNotTheOneThatNoticed) {
  std::vector<launch::WorkerSpec> w(3);
  w[0] = {0, "127.0.0.1", {"/bin/sh", "-c", "sleep 5"}, {}};
  w[1] = {1,
          "127.0.0.1",
          {"/bin/sh", "-c", "sleep 0.1; echo 'slicetrain x: error: rank 2 exited' >&2; exit 75"},
          {}};
  w[2] = {2, "127.0.0.1", {"/bin/sh", "-c", "sleep 0.4; kill -9 $$"}, {}};
  launch::SupervisorOptions opts;
  const auto r = launch::RunWorkers(w, opts);
  EXPECT_EQ(r.failed_rank, 2) << r.message;
  EXPECT_NE(r.message.find("killed by signal 9"), std::string::npos) << r.message;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.restartable);
  EXPECT_NE(r.peer_report.find("rank 2 exited"), std::string::npos) << r.peer_report;
}

// Without a worse failure in the drain window, the worker that reported the loss stays the cause;
// the workers the supervisor itself stops (SIGTERM) never replace it.
TEST(Supervisor, ALostPeerReportStaysTheCauseWhenNobodyElseDies) {
  std::vector<launch::WorkerSpec> w(2);
  w[0] = {0, "127.0.0.1", {"/bin/sh", "-c", "exit 75"}, {}};
  w[1] = {1, "127.0.0.1", {"/bin/sh", "-c", "sleep 30"}, {}};
  launch::SupervisorOptions opts;
  opts.drain = milliseconds(200);
  const auto r = launch::RunWorkers(w, opts);
  EXPECT_EQ(r.failed_rank, 0) << r.message;
  EXPECT_EQ(r.exit_code, launch::kExitUnavailable);
  EXPECT_NE(r.message.find("exited with code 75"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace st
