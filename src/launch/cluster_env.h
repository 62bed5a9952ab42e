// The cluster environment, read once at start-up into one typed struct. Sources, highest
// precedence first: explicit flags; torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES); Open MPI (OMPI_COMM_WORLD_*);
// Slurm (SLURM_PROCID, SLURM_NODEID, SLURM_NTASKS, SLURM_JOB_NODELIST); KubeRay's TPU webhook
// (TPU_WORKER_HOSTNAMES, TPU_WORKER_ID, TPU_NAME, TORCH_TPU_TOPOLOGY); Kubernetes Indexed Job /
// JobSet (JOB_COMPLETION_INDEX + SLICETRAIN_HOSTS). ReadProcessEnvironment() is the only code that
// reads the process environment; everything deeper takes a ClusterEnv.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "launch/topology.h"

namespace st::launch {

using EnvMap = std::map<std::string, std::string>;

// Copies environ (the one getenv of the program).
EnvMap ReadProcessEnvironment();

// Flags of `slicetrain launch` (and of commands that spawn workers); unset values are -1 / "".
struct LaunchFlags {
  int nnodes = -1;
  int node_rank = -1;
  int nproc_per_node = -1;
  std::string master_addr;
  int master_port = -1;
};

struct ClusterEnv {
  // This host within the job.
  int node_rank = 0;
  int nnodes = 1;
  std::vector<std::string> hosts;  // when the source lists them (TPU webhook, Slurm, host list)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool master_port_explicit = false;  // MASTER_PORT or --master-port given (else 29500)
  // This process as one rank, when a launcher already started it as a worker (-1 otherwise).
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  int nproc_per_node = -1;  // from --nproc-per-node / SLURM tasks per node; -1 = not given
  // Job-level extras.
  std::string secret;                 // SLICETRAIN_SECRET: admits clients to the rendezvous store
  std::string host_ip;                // SLICETRAIN_HOST_IP: this host's address (else derived)
  std::string tpu_name;               // TPU_NAME
  std::string tpu_topology;           // TORCH_TPU_TOPOLOGY
  int collective_timeout_ms = 60000;  // SLICETRAIN_TIMEOUT_MS
  // SLICETRAIN_RENDEZVOUS_TIMEOUT_MS (launch --rendezvous-timeout-ms): how long a worker waits for
  // the store and its peers at a (re)start; torchrun's join timeout is 600 s as well.
  int rendezvous_timeout_ms = 600000;
  // SLICETRAIN_TRANSPORT: how ranks talk (comm/group.h): auto (shared memory on a host, TCP
  // across hosts), tcp, shm.
  std::string transport = "auto";
  int restart_attempt = 0;  // SLICETRAIN_RESTART_ATTEMPT: 0 first start, n after n group failures
  // Compute threads per worker asked for: SLICETRAIN_THREADS (set by our spawners), else
  // OMP_NUM_THREADS (the user's, or an outside launcher's); 0 = derived from the usable CPUs.
  int threads = 0;
  std::string source = "defaults";  // which source decided the layout, for messages
  bool is_worker() const { return rank >= 0; }
};

// Builds the struct from an environment map and flags; a contradiction is an error saying which
// variables disagree.
StatusOr<ClusterEnv> DetectClusterEnv(const EnvMap& env, const LaunchFlags& flags = {});

// A worker count that contradicts the slice topology is an error that says so.
Status CheckAgainstTopology(const ClusterEnv& env, const Topology& topo);

// Expands a Slurm node list: "node[01-03,7],gpu5" -> node01, node02, node03, node7, gpu5.
StatusOr<std::vector<std::string>> ExpandSlurmNodeList(const std::string& list);

}  // namespace st::launch
