#include "launch/cluster_env.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include "comm/group.h"

extern char** environ;

namespace st::launch {

EnvMap ReadProcessEnvironment() {
  EnvMap m;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) m[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

namespace {

const std::string* Find(const EnvMap& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// Reads an integer variable; absent -> `fallback`; malformed -> error naming the variable.
Status ReadInt(const EnvMap& env, const char* key, int* out) {
  const std::string* v = Find(env, key);
  if (!v) return Status::Ok();
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || x < 0 || x > 1000000)
    return InvalidArgument(
        StrCat("environment variable ", key, "='", *v, "' is not a non-negative integer"));
  *out = static_cast<int>(x);
  return Status::Ok();
}

std::vector<std::string> SplitHosts(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',' || c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandSlurmNodeList(const std::string& list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    size_t j = i;
    while (j < list.size() && list[j] != ',' && list[j] != '[') ++j;
    std::string prefix = list.substr(i, j - i);
    if (j < list.size() && list[j] == '[') {
      size_t close = list.find(']', j);
      if (close == std::string::npos) return InvalidArgument("SLURM_JOB_NODELIST: missing ']'");
      std::string ranges = list.substr(j + 1, close - j - 1);
      for (const std::string& r : SplitHosts(ranges)) {
        size_t dash = r.find('-');
        if (dash == std::string::npos) {
          out.push_back(prefix + r);
          continue;
        }
        std::string a = r.substr(0, dash), b = r.substr(dash + 1);
        if (a.empty() || b.empty()) return InvalidArgument("SLURM_JOB_NODELIST: bad range " + r);
        const int lo = std::atoi(a.c_str()), hi = std::atoi(b.c_str());
        if (hi < lo || hi - lo > 100000)
          return InvalidArgument("SLURM_JOB_NODELIST: bad range " + r);
        for (int k = lo; k <= hi; ++k) {
          std::string num = std::to_string(k);
          if (num.size() < a.size()) num = std::string(a.size() - num.size(), '0') + num;
          out.push_back(prefix + num);
        }
      }
      i = close + 1;
      if (i < list.size() && list[i] == ',') ++i;
    } else {
      if (!prefix.empty()) out.push_back(prefix);
      i = j + 1;
    }
  }
  return out;
}

StatusOr<ClusterEnv> DetectClusterEnv(const EnvMap& env, const LaunchFlags& flags) {
  ClusterEnv c;
  if (const std::string* s = Find(env, "SLICETRAIN_SECRET")) c.secret = *s;
  if (const std::string* s = Find(env, "SLICETRAIN_HOST_IP")) c.host_ip = *s;
  if (const std::string* s = Find(env, "TPU_NAME")) c.tpu_name = *s;
  if (const std::string* s = Find(env, "TORCH_TPU_TOPOLOGY")) c.tpu_topology = *s;
  ST_RETURN_IF_ERROR(ReadInt(env, "SLICETRAIN_TIMEOUT_MS", &c.collective_timeout_ms));
  ST_RETURN_IF_ERROR(ReadInt(env, "SLICETRAIN_RENDEZVOUS_TIMEOUT_MS", &c.rendezvous_timeout_ms));
  ST_RETURN_IF_ERROR(ReadInt(env, "SLICETRAIN_RESTART_ATTEMPT", &c.restart_attempt));
  if (const std::string* s = Find(env, "SLICETRAIN_TRANSPORT")) {
    auto t = comm::ParseTransport(*s);
    if (!t.ok()) return InvalidArgument("SLICETRAIN_TRANSPORT: " + t.status().message());
    c.transport = comm::TransportName(*t);
  }
  ST_RETURN_IF_ERROR(ReadInt(env, "OMP_NUM_THREADS", &c.threads));
  ST_RETURN_IF_ERROR(ReadInt(env, "SLICETRAIN_THREADS", &c.threads));

  // Lowest precedence first; each later source overrides what it sets.
  // 1. Kubernetes Indexed Job / JobSet: the pod's index is the node rank.
  if (Find(env, "JOB_COMPLETION_INDEX")) {
    ST_RETURN_IF_ERROR(ReadInt(env, "JOB_COMPLETION_INDEX", &c.node_rank));
    if (const std::string* h = Find(env, "SLICETRAIN_HOSTS")) c.hosts = SplitHosts(*h);
    c.source = "kubernetes indexed job (JOB_COMPLETION_INDEX)";
  }
  // 2. KubeRay TPU webhook.
  if (const std::string* h = Find(env, "TPU_WORKER_HOSTNAMES")) {
    c.hosts = SplitHosts(*h);
    c.node_rank = 0;
    ST_RETURN_IF_ERROR(ReadInt(env, "TPU_WORKER_ID", &c.node_rank));
    c.source = "TPU webhook (TPU_WORKER_HOSTNAMES, TPU_WORKER_ID)";
  }
  // 3. Slurm: one task per node is host-level (launch spawns the workers); more tasks than nodes
  //    means srun started every worker itself.
  if (const std::string* nl = Find(env, "SLURM_JOB_NODELIST")) {
    ST_ASSIGN_OR_RETURN(c.hosts, ExpandSlurmNodeList(*nl));
    ST_RETURN_IF_ERROR(ReadInt(env, "SLURM_NODEID", &c.node_rank));
    int ntasks = -1;
    ST_RETURN_IF_ERROR(ReadInt(env, "SLURM_NTASKS", &ntasks));
    if (ntasks > static_cast<int>(c.hosts.size())) {
      ST_RETURN_IF_ERROR(ReadInt(env, "SLURM_PROCID", &c.rank));
      c.world_size = ntasks;
      ST_RETURN_IF_ERROR(ReadInt(env, "SLURM_LOCALID", &c.local_rank));
      if (ntasks % static_cast<int>(c.hosts.size()) == 0)
        c.local_world_size = ntasks / static_cast<int>(c.hosts.size());
    }
    c.source = "slurm (SLURM_JOB_NODELIST, SLURM_NODEID)";
  }
  if (!c.hosts.empty()) {
    c.nnodes = static_cast<int>(c.hosts.size());
    c.master_addr = c.hosts[0];
  }
  // 4. Open MPI: every process is a rank.
  if (Find(env, "OMPI_COMM_WORLD_RANK")) {
    ST_RETURN_IF_ERROR(ReadInt(env, "OMPI_COMM_WORLD_RANK", &c.rank));
    ST_RETURN_IF_ERROR(ReadInt(env, "OMPI_COMM_WORLD_SIZE", &c.world_size));
    ST_RETURN_IF_ERROR(ReadInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", &c.local_rank));
    ST_RETURN_IF_ERROR(ReadInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", &c.local_world_size));
    c.source = "open mpi (OMPI_COMM_WORLD_*)";
  }
  // 5. torchrun-style variables (what `slicetrain launch` sets for its workers).
  if (Find(env, "RANK") || Find(env, "WORLD_SIZE")) {
    ST_RETURN_IF_ERROR(ReadInt(env, "RANK", &c.rank));
    ST_RETURN_IF_ERROR(ReadInt(env, "WORLD_SIZE", &c.world_size));
    ST_RETURN_IF_ERROR(ReadInt(env, "LOCAL_RANK", &c.local_rank));
    ST_RETURN_IF_ERROR(ReadInt(env, "LOCAL_WORLD_SIZE", &c.local_world_size));
    c.source = "torchrun-style (RANK, WORLD_SIZE)";
  }
  ST_RETURN_IF_ERROR(ReadInt(env, "NODE_RANK", &c.node_rank));
  ST_RETURN_IF_ERROR(ReadInt(env, "NNODES", &c.nnodes));
  if (const std::string* a = Find(env, "MASTER_ADDR")) c.master_addr = *a;
  ST_RETURN_IF_ERROR(ReadInt(env, "MASTER_PORT", &c.master_port));
  c.master_port_explicit = Find(env, "MASTER_PORT") != nullptr;
  // 6. Explicit flags win.
  if (flags.nnodes >= 0) c.nnodes = flags.nnodes;
  if (flags.node_rank >= 0) c.node_rank = flags.node_rank;
  if (flags.nproc_per_node >= 0) c.nproc_per_node = flags.nproc_per_node;
  if (!flags.master_addr.empty()) c.master_addr = flags.master_addr;
  if (flags.master_port >= 0) {
    c.master_port = flags.master_port;
    c.master_port_explicit = true;
  }
  // --nproc-per-node alone does not decide the host layout, so it keeps the source that did.
  if (flags.nnodes >= 0 || flags.node_rank >= 0) c.source = "flags (--nnodes/--node-rank)";

  // Contradictions.
  if (c.nnodes < 1) return InvalidArgument("the number of hosts (nnodes) must be at least 1");
  if (c.node_rank >= c.nnodes)
    return InvalidArgument(StrCat("node rank ", c.node_rank, " is outside ", c.nnodes,
                                  " hosts (source: ", c.source, ")"));
  if (!c.hosts.empty() && flags.nnodes < 0 && c.nnodes != static_cast<int>(c.hosts.size()))
    return InvalidArgument(StrCat("NNODES=", c.nnodes, " contradicts the ", c.hosts.size(),
                                  " hosts listed by ", c.source));
  if (c.master_port <= 0 || c.master_port > 65535)
    return InvalidArgument(StrCat("MASTER_PORT ", c.master_port, " is not a TCP port"));
  if (c.is_worker()) {
    if (c.world_size < 1 || c.rank >= c.world_size)
      return InvalidArgument(StrCat("RANK ", c.rank, " is outside WORLD_SIZE ", c.world_size,
                                    " (source: ", c.source, ")"));
    if (c.local_world_size < 1) c.local_world_size = c.world_size / c.nnodes;
    if (c.local_rank < 0) c.local_rank = c.rank % std::max(1, c.local_world_size);
    if (c.local_rank >= c.local_world_size)
      return InvalidArgument(
          StrCat("LOCAL_RANK ", c.local_rank, " is outside LOCAL_WORLD_SIZE ", c.local_world_size));
  }
  return c;
}

Status CheckAgainstTopology(const ClusterEnv& env, const Topology& topo) {
  if (env.is_worker() && env.world_size != topo.world_size())
    return InvalidArgument(StrCat("world size ", env.world_size, " (from ", env.source,
                                  ") contradicts topology ", topo.ToString(),
                                  "; pass a matching --topology/--accelerator-type"));
  if (env.is_worker() && env.nnodes > 1 && env.local_world_size != topo.devices_per_host())
    return InvalidArgument(
        StrCat(env.local_world_size, " workers per host contradict topology ", topo.ToString()));
  return Status::Ok();
}

}  // namespace st::launch
