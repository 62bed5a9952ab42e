// `slicetrain launch [--nnodes N --node-rank R --nproc-per-node P --master-addr A --master-port M]
// -- <subcommand args>`: starts this host's workers of a multi-host job (the role of torchrun),
// prefixes their output with "(rank R pid=P ip=A)", forwards signals, and takes the group down
// when one worker fails. Host layout comes from flags or the cluster environment (docs/runtime.md).
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "comm/store/socket.h"
#include "launch/cluster_env.h"
#include "launch/resources.h"
#include "launch/supervisor.h"
#include "launch/worker.h"

namespace st::cli {

namespace {

struct LaunchArgs {
  launch::LaunchFlags flags;
  int grace_ms = 3000;
  int max_failures = 0;
  bool dry_run = false;
  int threads = 0;  // compute threads per worker; 0 = OMP_NUM_THREADS, else usable CPUs / nproc
  int rendezvous_timeout_ms = -1;  // -1: SLICETRAIN_RENDEZVOUS_TIMEOUT_MS, else 600000
  std::vector<std::string> command;
};

// `--dry-run`: what this host would start, as one JSON object on stdout (no process is started, no
// name is resolved). Deployment tests feed a pod's environment to it; users check a job spec with
// it.
void PrintDryRun(const launch::ClusterEnv& env, int nproc, int threads,
                 const std::vector<std::string>& command) {
  nlohmann::json j;
  j["source"] = env.source;
  j["nnodes"] = env.nnodes;
  j["node_rank"] = env.node_rank;
  j["nproc_per_node"] = nproc;
  j["world_size"] = env.nnodes * nproc;
  std::vector<int> ranks;
  for (int i = 0; i < nproc; ++i) ranks.push_back(env.node_rank * nproc + i);
  j["ranks"] = ranks;
  j["hosts"] = env.hosts;
  j["master_addr"] = env.master_addr;
  j["master_port"] = env.master_port;
  j["master_port_explicit"] = env.master_port_explicit;
  j["host_ip"] = env.host_ip;  // "" = derived at start-up from the route to master_addr
  j["secret_set"] = !env.secret.empty();
  j["tpu_name"] = env.tpu_name;
  j["tpu_topology"] = env.tpu_topology;
  j["collective_timeout_ms"] = env.collective_timeout_ms;
  j["rendezvous_timeout_ms"] = env.rendezvous_timeout_ms;
  j["transport"] = env.transport;
  j["threads_per_worker"] = threads;
  j["cpus"] = launch::ReadCpuBudget().Describe();
  j["command"] = command;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

Status RunLaunch(const LaunchArgs& a, int* exit_code) {
  ST_ASSIGN_OR_RETURN(launch::ClusterEnv env,
                      launch::DetectClusterEnv(launch::ReadProcessEnvironment(), a.flags));
  int nproc = env.nproc_per_node > 0 ? env.nproc_per_node
                                     : (env.local_world_size > 0 ? env.local_world_size : 1);
  if (nproc < 1 || nproc > 1024) return InvalidArgument("--nproc-per-node must be 1..1024");
  if (a.command.empty()) return InvalidArgument("nothing to run: add -- <subcommand args>");
  std::string secret = env.secret;
  if (secret.empty()) {
    if (env.nnodes > 1)
      return InvalidArgument(
          "a multi-host launch needs SLICETRAIN_SECRET set to the same value on every host");
    secret = launch::NewSecret();
  }
  if (a.threads < 0) return InvalidArgument("--threads must be >= 0 (0: derived from the CPUs)");
  if (a.rendezvous_timeout_ms >= 0) env.rendezvous_timeout_ms = a.rendezvous_timeout_ms;
  if (env.rendezvous_timeout_ms < 1000)
    return InvalidArgument(
        "--rendezvous-timeout-ms (SLICETRAIN_RENDEZVOUS_TIMEOUT_MS) must be at "
        "least 1000");
  const int threads = launch::ThreadsPerWorker(launch::ReadCpuBudget(), nproc,
                                               a.threads > 0 ? a.threads : env.threads);
  if (a.dry_run) {
    PrintDryRun(env, nproc, threads, a.command);
    return Status::Ok();
  }
  std::string host_ip = env.host_ip;
  if (host_ip.empty()) {
    // No route to the master yet (a pod's network still coming up, a link down): wait for one
    // within the rendezvous timeout, as the workers would wait for the store.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(env.rendezvous_timeout_ms);
    auto ip = comm::LocalAddressFor(env.master_addr);
    if (!ip.ok())
      std::fprintf(stderr, "slicetrain launch: %s; waiting up to %d ms for a route\n",
                   ip.status().message().c_str(), env.rendezvous_timeout_ms);
    while (!ip.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ip = comm::LocalAddressFor(env.master_addr);
    }
    if (!ip.ok())
      return Status(StatusCode::kUnavailable,
                    ip.status().message() + " (gave up after --rendezvous-timeout-ms)");
    host_ip = *ip;
  }
  launch::LocalPlan plan;
  plan.command = {launch::SelfExecutable()};
  plan.command.insert(plan.command.end(), a.command.begin(), a.command.end());
  plan.world_size = env.nnodes * nproc;
  plan.first_rank = env.node_rank * nproc;
  plan.count = nproc;
  plan.local_world_size = nproc;
  plan.nnodes = env.nnodes;
  plan.master_addr = env.master_addr;
  plan.master_port = env.master_port;
  if (env.nnodes == 1 && !env.master_port_explicit) {
    // One host and no port asked for: take a free one, so that jobs on one machine never collide.
    ST_ASSIGN_OR_RETURN(plan.master_port, comm::PickFreePort(env.master_addr));
  }
  plan.secret = secret;
  plan.host_ip = host_ip;
  plan.collective_timeout_ms = env.collective_timeout_ms;
  plan.rendezvous_timeout_ms = env.rendezvous_timeout_ms;
  plan.threads = threads;
  launch::SupervisorOptions so;
  so.grace = std::chrono::milliseconds(a.grace_ms);
  // A restarted group meets again at the rendezvous: rank 0's host serves the store anew on the
  // same port, and the other hosts' launchers restart their workers when theirs fail in turn.
  auto on_restart = [&](int attempt, const launch::SupervisorResult& failure) {
    std::fprintf(
        stderr,
        "slicetrain launch: node %d (%s): %s; restarting this host's workers (%d of "
        "--max-failures %d)\n",
        env.node_rank, host_ip.c_str(),
        (failure.message + (failure.peer_report.empty() ? "" : "; " + failure.peer_report)).c_str(),
        attempt, a.max_failures);
  };
  launch::SupervisorResult r = launch::RunWorkersWithRestarts(launch::PlanLocalWorkers(plan), so,
                                                              a.max_failures, on_restart);
  *exit_code = r.exit_code;
  if (r.exit_code != 0)
    return Internal(StrCat("node ", env.node_rank, " (", host_ip,
                           "): ", launch::FailureSummary(r, a.max_failures),
                           r.failed_rank >= 0 ? "; the other local workers were stopped" : ""));
  return Status::Ok();
}

}  // namespace

void RegisterLaunchCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "launch", "Start this host's workers of a (multi-host) job and supervise them");
  auto a = std::make_shared<LaunchArgs>();
  cmd->add_option("--nnodes", a->flags.nnodes,
                  "Number of hosts (default: from the environment, 1)");
  cmd->add_option("--node-rank", a->flags.node_rank, "This host's index (default: environment, 0)");
  cmd->add_option("--nproc-per-node", a->flags.nproc_per_node, "Workers on this host (default 1)");
  cmd->add_option("--master-addr", a->flags.master_addr, "Host of rank 0 (serves the store)");
  cmd->add_option("--master-port", a->flags.master_port, "Port of the rendezvous store (29500)");
  cmd->add_option("--grace-ms", a->grace_ms, "SIGTERM -> SIGKILL grace when stopping workers")
      ->capture_default_str();
  cmd->add_option("--max-failures", a->max_failures,
                  "Restart this host's workers after a lost worker or a collective timeout, at "
                  "most this many times (they get SLICETRAIN_RESTART_ATTEMPT)")
      ->capture_default_str();
  cmd->add_option("--rendezvous-timeout-ms", a->rendezvous_timeout_ms,
                  "How long a (re)started worker waits for the store and its peers before it "
                  "fails (default: $SLICETRAIN_RENDEZVOUS_TIMEOUT_MS, else 600000, torchrun's join "
                  "timeout); after a network partition the group meets again within it");
  cmd->add_option("--threads", a->threads,
                  "Compute threads per worker (default: $OMP_NUM_THREADS, else the CPUs this "
                  "host lets the job use, from the affinity mask and cgroup quota, / "
                  "--nproc-per-node)");
  cmd->add_flag("--dry-run", a->dry_run,
                "Print the resolved host layout and ranks as JSON and start nothing");
  cmd->add_option("command", a->command, "-- <subcommand args> run by every worker")->required();
  cmd->callback([&ctx, a] {
    int code = 0;
    Status st = RunLaunch(*a, &code);
    if (!st.ok()) {
      const int rc = ReportError("launch", st);
      ctx.exit_code = code != 0 ? code : rc;
    }
  });
}

}  // namespace st::cli
