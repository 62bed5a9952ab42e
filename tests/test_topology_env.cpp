// Topology table and cluster-environment detection (pure functions; no processes).
#include <gtest/gtest.h>

#include "launch/cluster_env.h"
#include "launch/topology.h"

namespace st::launch {
namespace {

TEST(Topology, TpuV6e) {
  struct Case {
    const char* shape;
    int hosts, world;
  } cases[] = {{"2x2", 1, 4},   {"2x4", 2, 8},     {"4x4", 4, 16},    {"4x8", 8, 32},
               {"8x8", 16, 64}, {"8x16", 32, 128}, {"16x16", 64, 256}};
  for (const auto& c : cases) {
    auto t = ResolveTopology("TPU-V6E", c.shape);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->hosts, c.hosts) << c.shape;
    EXPECT_EQ(t->chips_per_host, 4);
    EXPECT_EQ(t->devices_per_host(), 4);
    EXPECT_EQ(t->world_size(), c.world) << c.shape;
  }
  EXPECT_EQ(ResolveTopology("v6e", "4x4")->accelerator_type, "TPU-V6E");
}

TEST(Topology, TpuV7xHasTwoDevicesPerChip) {
  struct Case {
    const char* shape;
    int hosts, world;
  } cases[] = {
      {"2x2x1", 1, 8}, {"2x2x2", 2, 16}, {"2x2x4", 4, 32}, {"2x4x4", 8, 64}, {"4x4x4", 16, 128}};
  for (const auto& c : cases) {
    auto t = ResolveTopology("TPU-V7X", c.shape);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->hosts, c.hosts) << c.shape;
    EXPECT_EQ(t->devices_per_chip, 2);
    EXPECT_EQ(t->devices_per_host(), 8);
    EXPECT_EQ(t->world_size(), c.world) << c.shape;
  }
  EXPECT_EQ(ResolveTopology("tpu7x", "2x2x2")->ToString(),
            "TPU-V7X 2x2x2: 2 hosts x 4 chips x 2 devices = 16 workers");
}

TEST(Topology, GpuAndCpu) {
  auto g = ResolveTopology("GPU-H100", "2x8");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->hosts, 2);
  EXPECT_EQ(g->world_size(), 16);
  EXPECT_EQ(ResolveTopology("GPU-A100", "4")->hosts, 1);
  auto c = ResolveTopology("CPU", "3x5");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hosts, 3);
  EXPECT_EQ(c->devices_per_host(), 5);
  EXPECT_EQ(ResolveTopology("CPU", "7")->world_size(), 7);
}

TEST(Topology, ImpossibleShapesListTheValidOnes) {
  auto bad = ResolveTopology("TPU-V6E", "3x3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("valid: 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
            std::string::npos);
  auto bad7 = ResolveTopology("TPU-V7X", "4x4");
  ASSERT_FALSE(bad7.ok());
  EXPECT_NE(bad7.status().message().find("2x2x1, 2x2x2"), std::string::npos);
  EXPECT_FALSE(ResolveTopology("TPU-V9", "2x2").ok());
  EXPECT_FALSE(ResolveTopology("GPU", "8").ok());
  EXPECT_FALSE(ResolveTopology("CPU", "0").ok());
  EXPECT_FALSE(ResolveTopology("CPU", "2x").ok());
  EXPECT_FALSE(ResolveTopology("CPU", "1x2x3").ok());
  EXPECT_FALSE(ResolveTopology("FPGA", "2").ok());
}

TEST(ClusterEnv, DefaultsAreOneLocalHost) {
  auto e = DetectClusterEnv({});
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->is_worker());
  EXPECT_EQ(e->nnodes, 1);
  EXPECT_EQ(e->master_addr, "127.0.0.1");
  EXPECT_EQ(e->master_port, 29500);
}

TEST(ClusterEnv, TransportIsAutoUnlessSet) {
  EXPECT_EQ(DetectClusterEnv({})->transport, "auto");
  EXPECT_EQ(DetectClusterEnv({{"SLICETRAIN_TRANSPORT", "tcp"}})->transport, "tcp");
  EXPECT_EQ(DetectClusterEnv({{"SLICETRAIN_TRANSPORT", "shm"}})->transport, "shm");
  auto bad = DetectClusterEnv({{"SLICETRAIN_TRANSPORT", "rdma"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "SLICETRAIN_TRANSPORT: transport 'rdma' is not one of auto, tcp, shm");
}

TEST(ClusterEnv, TorchrunStyle) {
  auto e = DetectClusterEnv({{"RANK", "5"},
                             {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "1"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "10.0.0.1"},
                             {"MASTER_PORT", "1234"},
                             {"NODE_RANK", "1"},
                             {"NNODES", "2"}});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_TRUE(e->is_worker());
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->node_rank, 1);
  EXPECT_EQ(e->master_addr, "10.0.0.1");
  EXPECT_EQ(e->master_port, 1234);
}

TEST(ClusterEnv, KubeRayTpuWebhook) {
  auto e = DetectClusterEnv({{"TPU_WORKER_HOSTNAMES", "h0,h1,h2,h3"},
                             {"TPU_WORKER_ID", "2"},
                             {"TPU_NAME", "slice-a"},
                             {"TORCH_TPU_TOPOLOGY", "4x4"}});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->nnodes, 4);
  EXPECT_EQ(e->node_rank, 2);
  EXPECT_EQ(e->master_addr, "h0");
  EXPECT_EQ(e->tpu_name, "slice-a");
  EXPECT_EQ(e->tpu_topology, "4x4");
  EXPECT_FALSE(e->is_worker());
  auto bad = DetectClusterEnv({{"TPU_WORKER_HOSTNAMES", "h0,h1"}, {"TPU_WORKER_ID", "2"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("node rank 2 is outside 2 hosts"), std::string::npos);
}

TEST(ClusterEnv, KubernetesIndexedJob) {
  auto e = DetectClusterEnv(
      {{"JOB_COMPLETION_INDEX", "3"}, {"SLICETRAIN_HOSTS", "10.1.0.1,10.1.0.2,10.1.0.3,10.1.0.4"}});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->node_rank, 3);
  EXPECT_EQ(e->nnodes, 4);
  EXPECT_EQ(e->master_addr, "10.1.0.1");
}

TEST(ClusterEnv, SlurmHostLevelAndPerTask) {
  auto host = DetectClusterEnv({{"SLURM_JOB_NODELIST", "node[01-02]"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_NTASKS", "2"},
                                {"SLURM_PROCID", "1"}});
  ASSERT_TRUE(host.ok()) << host.status().message();
  EXPECT_EQ(host->nnodes, 2);
  EXPECT_EQ(host->node_rank, 1);
  EXPECT_EQ(host->master_addr, "node01");
  EXPECT_FALSE(host->is_worker());
  auto task = DetectClusterEnv({{"SLURM_JOB_NODELIST", "node[01-02]"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_NTASKS", "8"},
                                {"SLURM_PROCID", "6"},
                                {"SLURM_LOCALID", "2"}});
  ASSERT_TRUE(task.ok()) << task.status().message();
  EXPECT_EQ(task->rank, 6);
  EXPECT_EQ(task->world_size, 8);
  EXPECT_EQ(task->local_rank, 2);
  EXPECT_EQ(task->local_world_size, 4);
  auto list = ExpandSlurmNodeList("a[1-3,10],b7,c[08-09]");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"a1", "a2", "a3", "a10", "b7", "c08", "c09"}));
  EXPECT_FALSE(ExpandSlurmNodeList("a[1-3").ok());
}

TEST(ClusterEnv, OpenMpi) {
  auto e = DetectClusterEnv({{"OMPI_COMM_WORLD_RANK", "3"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                             {"MASTER_ADDR", "m"}});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->master_addr, "m");
}

TEST(ClusterEnv, PrecedenceFlagsThenTorchrunThenMpiThenSlurmThenTpuThenK8s) {
  EnvMap env = {{"JOB_COMPLETION_INDEX", "0"},
                {"SLICETRAIN_HOSTS", "k0,k1"},
                {"TPU_WORKER_HOSTNAMES", "t0,t1"},
                {"TPU_WORKER_ID", "1"},
                {"OMPI_COMM_WORLD_RANK", "2"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"RANK", "3"},
                {"WORLD_SIZE", "4"}};
  auto e = DetectClusterEnv(env);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->master_addr, "t0");  // TPU webhook over the Indexed Job's list
  EXPECT_EQ(e->node_rank, 1);
  EXPECT_EQ(e->rank, 3);  // torchrun over Open MPI
  LaunchFlags f;
  f.node_rank = 0;
  f.master_addr = "flag-host";
  f.master_port = 4000;
  auto g = DetectClusterEnv(env, f);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->node_rank, 0);
  EXPECT_EQ(g->master_addr, "flag-host");
  EXPECT_EQ(g->master_port, 4000);
}

TEST(ClusterEnv, ContradictionsAreErrors) {
  EXPECT_FALSE(DetectClusterEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).ok());
  EXPECT_FALSE(DetectClusterEnv({{"RANK", "x"}, {"WORLD_SIZE", "4"}}).ok());
  EXPECT_FALSE(DetectClusterEnv({{"MASTER_PORT", "70000"}}).ok());
  auto n = DetectClusterEnv({{"TPU_WORKER_HOSTNAMES", "a,b"}, {"NNODES", "3"}});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("contradicts"), std::string::npos);
  auto w = DetectClusterEnv({{"RANK", "0"}, {"WORLD_SIZE", "8"}});
  ASSERT_TRUE(w.ok());
  auto topo = ResolveTopology("TPU-V6E", "4x4");
  Status st = CheckAgainstTopology(*w, *topo);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("world size 8"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("16 workers"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace st::launch
