// A worker process's runtime: from the ClusterEnv to a connected store and world process group.
// Rank 0 serves the rendezvous store at MASTER_ADDR:MASTER_PORT; every rank is its client.
// Also plans the local workers a spawner starts (`slicetrain launch`, and commands run without it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/process_group.h"
#include "comm/store/store.h"
#include "comm/store/tcp_store.h"
#include "launch/cluster_env.h"
#include "launch/supervisor.h"
#include "launch/topology.h"

namespace st::launch {

class Worker {
 public:
  // Connects to (rank 0: serves) the store, forms the world group, limits this process's threads
  // to max(1, cores / local workers).
  static StatusOr<std::unique_ptr<Worker>> Init(const ClusterEnv& env);
  ~Worker();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  int local_world_size() const { return env_.local_world_size; }
  const std::string& host_ip() const { return host_ip_; }
  comm::CollectiveOptions collective() const {
    return {std::chrono::milliseconds(env_.collective_timeout_ms)};
  }
  std::shared_ptr<comm::Store> store() { return store_; }
  // Options for a Gloo group of this job: this host's address, the collective timeout as the
  // connect timeout, and the job secret that every pair proves.
  comm::GroupOptions GroupOptions() const;
  comm::ProcessGroup& world() { return *world_; }
  const ClusterEnv& env() const { return env_; }
  // Final rendezvous: rank 0 keeps serving the store until every rank has said goodbye.
  // `work_done` false (the job failed on this rank): close without waiting for anyone.
  Status Shutdown(bool work_done = true);

 private:
  Worker() = default;
  ClusterEnv env_;
  std::string host_ip_;
  std::unique_ptr<comm::TcpStoreServer> server_;
  std::shared_ptr<comm::Store> store_;
  std::unique_ptr<comm::ProcessGroup> world_;
};

// What a spawner needs to start ranks [first_rank, first_rank + count) on this machine.
struct LocalPlan {
  std::vector<std::string> command;  // the worker command line (argv[0]: executable)
  int world_size = 1;
  int first_rank = 0;
  int count = 1;
  int local_world_size = 1;  // ranks per (possibly virtual) host: LOCAL_RANK = rank % this
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string secret;
  std::string host_ip = "127.0.0.1";
  int collective_timeout_ms = 60000;
  int rendezvous_timeout_ms = 600000;
  int threads = 1;  // compute threads of each worker (SLICETRAIN_THREADS, OMP_NUM_THREADS)
};
std::vector<WorkerSpec> PlanLocalWorkers(const LocalPlan& plan);

// Runs `command` (a slicetrain subcommand line, without the executable) as the whole slice on this
// machine: topo.world_size() local workers in topo.hosts virtual hosts, on 127.0.0.1, a free port
// and a fresh secret, through the supervisor. What `collectives` and `finetune` do without
// `launch`. Rank 0's stdout passes through unprefixed; stderr is prefixed.
struct LocalSliceOptions {
  int collective_timeout_ms = 60000;
  bool prefix_stdout = false;
  int max_failures = 0;  // restarts of the whole slice after a restartable failure
  int threads = 0;       // compute threads per worker (--threads); 0 = usable CPUs / workers
  std::function<void(int attempt, const SupervisorResult& failure)> on_restart;
};
Status RunLocalSlice(const Topology& topo, const std::vector<std::string>& command,
                     const LocalSliceOptions& opts, int* exit_code);

// One line for a failed group: what failed, what a peer reported, whether restarts ran out.
std::string FailureSummary(const SupervisorResult& r, int max_failures);

// 2 x `bytes` random hex characters from /dev/urandom (the job secret, the dashboard token).
std::string NewSecret(int bytes = 16);
// This executable's path (/proc/self/exe).
std::string SelfExecutable();

}  // namespace st::launch
