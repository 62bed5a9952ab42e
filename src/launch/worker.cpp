#include "launch/worker.h"

#include <unistd.h>

#include <fstream>
#include <thread>

#include "comm/group.h"
#include "comm/store/socket.h"
#include "kernels/cpu/ops_cpu.h"
#include "launch/resources.h"

namespace st::launch {

StatusOr<std::unique_ptr<Worker>> Worker::Init(const ClusterEnv& env) {
  if (!env.is_worker()) return InvalidArgument("not started as a worker (RANK is not set)");
  std::unique_ptr<Worker> w(new Worker());
  w->env_ = env;
  detail::CheckContext() = StrCat("rank ", env.rank, ", ");
  // Threads: what the spawner (or the user) asked for, else the CPUs this process may use
  // (affinity mask, cgroup quota) divided among the host's workers.
  cpu::SetNumThreads(ThreadsPerWorker(ReadCpuBudget(), env.local_world_size, env.threads));
  if (!env.host_ip.empty()) {
    w->host_ip_ = env.host_ip;
  } else {
    ST_ASSIGN_OR_RETURN(w->host_ip_, comm::LocalAddressFor(env.master_addr));
  }
  const auto timeout = std::chrono::milliseconds(std::max(env.collective_timeout_ms, 1000));
  // How long this worker looks for the store and its peers before it gives up: the other hosts may
  // start later (pods pulling images), restart later (after a partition heals) or be gone.
  const auto rendezvous = std::max(timeout, std::chrono::milliseconds(env.rendezvous_timeout_ms));
  const std::string where = StrCat("rank ", env.rank, " (host ", w->host_ip_, ")");
  if (env.rank == 0) {
    // The store listens on the interface the job uses, never on every interface: loopback for a
    // job whose master address is loopback (every local run), else this host's address
    // (SLICETRAIN_HOST_IP, or the local address of the route to MASTER_ADDR), where the Gloo
    // pairs listen too.
    const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0 ||
                          env.master_addr == "::1";
    auto server = comm::TcpStoreServer::Start(loopback ? env.master_addr : w->host_ip_,
                                              env.master_port, env.secret);
    if (!server.ok())
      return server.status().WithContext(where + ": cannot serve the rendezvous store (is " +
                                         std::to_string(env.master_port) + " free?)");
    w->server_ = std::move(*server);
  }
  // A restarted worker may reach the store of the generation that just failed, while its rank 0
  // has not noticed yet: that store already holds "group/formed", which a new group sets only once
  // every rank has joined. Such a store is left alone until the new one is up, within the
  // rendezvous timeout. The connection drops a silent store host after the collective timeout.
  const auto deadline = std::chrono::steady_clock::now() + rendezvous;
  auto client = comm::TcpStoreClient::Connect(env.master_addr, env.master_port, env.secret,
                                              {rendezvous}, timeout);
  while (env.rank != 0 && client.ok()) {
    auto stale = (*client)->Check({"group/formed"}, {timeout});
    if (stale.ok() && !*stale) break;  // a fresh store (an error: the old one going away)
    if (std::chrono::steady_clock::now() > deadline) {
      client = Status(StatusCode::kUnavailable,
                      "the rendezvous store still belongs to the previous (failed) group");
      break;
    }
    client = Status(StatusCode::kUnavailable, "stale store");  // closes the connection
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto left = std::max(std::chrono::milliseconds(1000),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    client = comm::TcpStoreClient::Connect(env.master_addr, env.master_port, env.secret, {left},
                                           timeout);
  }
  // A rendezvous that fails (the store or a peer not there in time, or gone: a restarted group
  // whose other hosts have not restarted yet) is what a restart may cure: kUnavailable.
  auto unavailable = [&](const Status& s) {
    return Status(StatusCode::kUnavailable,
                  s.WithContext(StrCat(where, " at the rendezvous (--rendezvous-timeout-ms ",
                                       rendezvous.count(), ")"))
                      .message());
  };
  if (!client.ok()) return unavailable(client.status());
  w->store_ = std::shared_ptr<comm::Store>(std::move(*client));
  comm::GroupOptions o = w->GroupOptions();
  const auto left = std::max(timeout, std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now()));
  o.connect_timeout = left;
  auto world = comm::CreateProcessGroup(w->store_, env.rank, env.world_size, o);
  if (!world.ok()) return unavailable(world.status());
  w->world_ = std::move(*world);
  if (env.rank == 0) {
    Status formed = w->store_->Set("group/formed", "1", {timeout});
    if (!formed.ok()) return unavailable(formed);
  }
  return w;
}

// The last rendezvous, in idempotent keys (safe to resend after a reconnect): every rank says
// "shutdown/<r>"; rank 0, once it has them all, sets "shutdown/done", which the others wait for,
// so no rank exits while another may still be inside a collective (a shared-memory peer reads a
// rank's exit as a failure); then each says "shutdown/left/<r>" and rank 0 serves until it has
// those too, so no rank loses the store mid-call. The work is done by then (every rank finished its
// collectives), so a goodbye that cannot be said or heard is a warning, never a failed job.
Status Worker::Shutdown(bool work_done) {
  if (!store_) return Status::Ok();
  if (!work_done) {
    world_.reset();
    store_.reset();
    server_.reset();
    return Status::Ok();
  }
  const auto timeout = std::chrono::milliseconds(std::max(env_.collective_timeout_ms, 1000));
  const comm::StoreOptions brief{std::chrono::milliseconds(1000)};
  world_.reset();
  auto keys_of = [&](const std::string& prefix) {
    std::vector<std::string> keys;
    for (int r = 1; r < env_.world_size; ++r) keys.push_back(StrCat(prefix, r));
    return keys;
  };
  if (env_.rank != 0) {
    const std::string mine = StrCat("shutdown/", env_.rank);
    Status said = store_->Set(mine, "1", {timeout});
    if (!said.ok()) said = store_->Set(mine, "1", brief);  // once more, on a new connection
    if (said.ok()) said = store_->Wait({"shutdown/done"}, {timeout});
    if (said.ok()) {
      (void)store_->Set(StrCat("shutdown/left/", env_.rank), "1", brief);  // rank 0 may go now
    } else {
      std::fprintf(stderr,
                   "slicetrain: warning: rank %d finished but could not complete the final "
                   "rendezvous (%s); its work is complete\n",
                   env_.rank, said.message().c_str());
    }
  } else if (env_.world_size > 1) {
    const std::vector<std::string> arrived = keys_of("shutdown/");
    if (store_->Wait(arrived, {timeout}).ok()) {
      (void)store_->Set("shutdown/done", "1", {timeout});
      // Bounded apart: a "left" lost on the way only delays the exit (replies in flight still go
      // out, the server closes the receiving side only).
      (void)store_->Wait(keys_of("shutdown/left/"),
                         {std::min(timeout, std::chrono::milliseconds(5000))});
    } else {
      std::string missing;
      for (const auto& k : arrived) {
        auto has = store_->Check({k}, brief);
        if (has.ok() && !*has) missing += (missing.empty() ? "" : ", ") + k.substr(9);
      }
      std::fprintf(stderr,
                   "slicetrain: warning: rank 0 finished; rank(s) %s did not reach the end within "
                   "%lld ms (their own launchers report why)\n",
                   missing.empty() ? "?" : missing.c_str(),
                   static_cast<long long>(timeout.count()));
    }
  }
  std::fflush(stderr);
  store_.reset();
  server_.reset();
  return Status::Ok();
}

Worker::~Worker() {
  world_.reset();
  store_.reset();
  server_.reset();
}

std::vector<WorkerSpec> PlanLocalWorkers(const LocalPlan& p) {
  std::vector<WorkerSpec> out;
  for (int i = 0; i < p.count; ++i) {
    const int rank = p.first_rank + i;
    WorkerSpec w;
    w.rank = rank;
    w.ip = p.host_ip;
    w.argv = p.command;
    w.env = {{"RANK", std::to_string(rank)},
             {"WORLD_SIZE", std::to_string(p.world_size)},
             {"LOCAL_RANK", std::to_string(rank % p.local_world_size)},
             {"LOCAL_WORLD_SIZE", std::to_string(p.local_world_size)},
             {"NODE_RANK", std::to_string(rank / p.local_world_size)},
             {"NNODES", std::to_string(p.world_size / p.local_world_size)},
             {"MASTER_ADDR", p.master_addr},
             {"MASTER_PORT", std::to_string(p.master_port)},
             {"SLICETRAIN_SECRET", p.secret},
             {"SLICETRAIN_HOST_IP", p.host_ip},
             {"SLICETRAIN_TIMEOUT_MS", std::to_string(p.collective_timeout_ms)},
             {"SLICETRAIN_RENDEZVOUS_TIMEOUT_MS", std::to_string(p.rendezvous_timeout_ms)},
             // The same count for OpenMP's initial teams as SetNumThreads gives the compute.
             {"SLICETRAIN_THREADS", std::to_string(p.threads)},
             {"OMP_NUM_THREADS", std::to_string(p.threads)}};
    out.push_back(std::move(w));
  }
  return out;
}

Status RunLocalSlice(const Topology& topo, const std::vector<std::string>& command,
                     const LocalSliceOptions& opts, int* exit_code) {
  LocalPlan plan;
  plan.command = {SelfExecutable()};
  plan.command.insert(plan.command.end(), command.begin(), command.end());
  plan.world_size = topo.world_size();
  plan.count = topo.world_size();
  plan.local_world_size = topo.devices_per_host();
  plan.nnodes = topo.hosts;
  plan.master_addr = "127.0.0.1";
  ST_ASSIGN_OR_RETURN(plan.master_port, comm::PickFreePort("127.0.0.1"));
  plan.secret = NewSecret();
  plan.host_ip = "127.0.0.1";
  plan.collective_timeout_ms = opts.collective_timeout_ms;
  // Every worker of the slice runs on this machine, whatever hosts the topology simulates.
  plan.threads = ThreadsPerWorker(ReadCpuBudget(), plan.count, opts.threads);
  SupervisorOptions so;
  so.prefix_stdout = opts.prefix_stdout;
  SupervisorResult r =
      RunWorkersWithRestarts(PlanLocalWorkers(plan), so, opts.max_failures, opts.on_restart);
  *exit_code = r.exit_code;
  if (r.exit_code != 0) return Internal(FailureSummary(r, opts.max_failures));
  return Status::Ok();
}

comm::GroupOptions Worker::GroupOptions() const {
  comm::GroupOptions o;
  o.hostname = host_ip_;
  o.connect_timeout = std::chrono::milliseconds(std::max(env_.collective_timeout_ms, 1000));
  o.auth_key = env_.secret;
  o.transport = *comm::ParseTransport(env_.transport);  // validated by DetectClusterEnv
  return o;
}

std::string FailureSummary(const SupervisorResult& r, int max_failures) {
  std::string out = r.message;
  if (!r.peer_report.empty()) out += StrCat("; ", r.peer_report);
  if (r.restartable && max_failures > 0)
    out += StrCat(" (gave up after --max-failures ", max_failures, " restarts)");
  else if (r.restartable)
    out += " (--max-failures N restarts the workers from the latest checkpoint)";
  return out;
}

std::string NewSecret(int bytes) {
  std::ifstream f("/dev/urandom", std::ios::binary);
  std::vector<unsigned char> b(static_cast<size_t>(std::max(1, bytes)));
  f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("slicetrain");
}

}  // namespace st::launch
