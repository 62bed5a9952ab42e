// `slicetrain launch --dry-run`: the binary prints the host layout it resolved from flags and the
// cluster environment as one JSON object and starts nothing. The deploy/ tests feed whole pod
// environments to it; these cases pin the JSON fields they rely on, one per environment source.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "proc_util.h"

namespace st {
namespace {

using std::chrono::seconds;
using testing::Proc;

const std::string kBin = ST_BINARY;

// Runs the dry run with `env` added; returns the parsed JSON (or fails the test).
nlohmann::json DryRun(const std::vector<std::string>& flags, const std::vector<std::string>& env) {
  std::vector<std::string> argv = {kBin, "launch", "--dry-run"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"--", "collectives"});
  Proc p(argv, env, /*merge_stderr=*/false);
  const int rc = p.Wait(seconds(30));
  EXPECT_EQ(rc, 0) << p.output();
  auto j = nlohmann::json::parse(p.output(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << p.output();
  return j;
}

TEST(LaunchDryRun, TpuWebhookHostFour) {
  auto j = DryRun(
      {"--nproc-per-node", "4"},
      {"TPU_WORKER_HOSTNAMES=v6e-16-0-0.svc,v6e-16-0-1.svc,v6e-16-0-2.svc,v6e-16-0-3.svc",
       "TPU_WORKER_ID=3", "TPU_NAME=v6e-16-0", "TORCH_TPU_TOPOLOGY=4,4,1", "SLICETRAIN_SECRET=s"});
  EXPECT_EQ(j["nnodes"], 4);
  EXPECT_EQ(j["node_rank"], 3);
  EXPECT_EQ(j["world_size"], 16);
  EXPECT_EQ(j["ranks"], nlohmann::json({12, 13, 14, 15}));
  EXPECT_EQ(j["master_addr"], "v6e-16-0-0.svc");
  EXPECT_EQ(j["tpu_name"], "v6e-16-0");
  EXPECT_EQ(j["tpu_topology"], "4,4,1");
  EXPECT_EQ(j["secret_set"], true);
  EXPECT_EQ(j["command"], nlohmann::json({"collectives"}));
  EXPECT_NE(j["source"].get<std::string>().find("TPU webhook"), std::string::npos);
}

TEST(LaunchDryRun, IndexedJobAndSlurmAndFlags) {
  auto k8s = DryRun({"--nproc-per-node", "8"},
                    {"JOB_COMPLETION_INDEX=1", "SLICETRAIN_HOSTS=st-0.st,st-1.st",
                     "MASTER_PORT=29600", "SLICETRAIN_SECRET=s"});
  EXPECT_EQ(k8s["node_rank"], 1);
  EXPECT_EQ(k8s["ranks"].front(), 8);
  EXPECT_EQ(k8s["master_addr"], "st-0.st");
  EXPECT_EQ(k8s["master_port"], 29600);
  EXPECT_EQ(k8s["master_port_explicit"], true);

  auto slurm = DryRun({"--nproc-per-node", "2"},
                      {"SLURM_JOB_NODELIST=gpu[07-09]", "SLURM_NODEID=2", "SLURM_NTASKS=3",
                       "SLURM_PROCID=2", "SLICETRAIN_SECRET=s"});
  EXPECT_EQ(slurm["hosts"], nlohmann::json({"gpu07", "gpu08", "gpu09"}));
  EXPECT_EQ(slurm["node_rank"], 2);
  EXPECT_EQ(slurm["ranks"], nlohmann::json({4, 5}));
  EXPECT_EQ(slurm["master_addr"], "gpu07");

  auto flags = DryRun(
      {"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.5", "--master-port", "4000"},
      {"SLICETRAIN_SECRET=s", "SLICETRAIN_HOST_IP=10.0.0.6"});
  EXPECT_EQ(flags["ranks"], nlohmann::json({1}));
  EXPECT_EQ(flags["host_ip"], "10.0.0.6");
  EXPECT_EQ(flags["master_port"], 4000);
}

TEST(LaunchDryRun, SameErrorsAsARealLaunch) {
  Proc p({kBin, "launch", "--dry-run", "--", "collectives"},
         {"TPU_WORKER_HOSTNAMES=a,b", "TPU_WORKER_ID=1"}, /*merge_stderr=*/true);
  EXPECT_NE(p.Wait(seconds(30)), 0);
  EXPECT_NE(p.output().find("SLICETRAIN_SECRET"), std::string::npos) << p.output();
  Proc q({kBin, "launch", "--dry-run", "--", "collectives"},
         {"TPU_WORKER_HOSTNAMES=a,b", "TPU_WORKER_ID=2", "SLICETRAIN_SECRET=s"});
  EXPECT_NE(q.Wait(seconds(30)), 0);
  EXPECT_NE(q.output().find("node rank 2 is outside 2 hosts"), std::string::npos) << q.output();
}

}  // namespace
}  // namespace st
