// `slicetrain collectives`: the seed's ray_core_collectives.py. Every rank runs the FeedForward
// block with tensor parallelism over a 1-D device mesh, checks it against a single-device
// reference, and all_reduces [rank+1]*4; rank 0 prints one line per rank and the summary.
// Run without `launch`, it spawns the whole slice as local CPU workers (virtual hosts).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "comm/device_mesh.h"
#include "comm/store/socket.h"
#include "launch/cluster_env.h"
#include "launch/topology.h"
#include "launch/worker.h"
#include "parallel/ffn_parity.h"

namespace st::cli {

namespace {

struct CollectivesArgs {
  std::string topology = "4x4";
  std::string accelerator_type = "TPU-V6E";
  int64_t batch_size = 64;
  int64_t hidden_dim = 128;
  int timeout_ms = 60000;
  bool timeout_given = false;  // on the command line: wins over SLICETRAIN_TIMEOUT_MS under launch
  int corrupt_rank = -1;       // hidden: this rank reports a wrong all_reduce result (tests)
  int threads = 0;  // compute threads per local worker; 0 = OMP_NUM_THREADS, else derived
};

// Python's repr of a float for the values this job prints (integral values keep ".0").
std::string PyFloat(double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 1e15) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.1f", v);
    return b;
  }
  char b[64];
  auto r = std::to_chars(b, b + sizeof(b), v);
  return std::string(b, r.ptr);
}

struct RankResult {
  int rank = 0, worker_id = 0, local_rank = 0;
  std::string ip;
  std::vector<double> sum;
  double max_abs_diff = 0;
};

std::string Encode(const RankResult& r) {
  std::ostringstream os;
  os.precision(17);
  os << r.rank << ' ' << r.worker_id << ' ' << r.local_rank << ' ' << r.ip << ' ' << r.max_abs_diff;
  for (double v : r.sum) os << ' ' << v;
  return os.str();
}

RankResult Decode(const std::string& s) {
  std::istringstream is(s);
  RankResult r;
  is >> r.rank >> r.worker_id >> r.local_rank >> r.ip >> r.max_abs_diff;
  double v;
  while (is >> v) r.sum.push_back(v);
  return r;
}

Status RunWorker(const CollectivesArgs& a, const launch::ClusterEnv& env,
                 const launch::Topology& topo) {
  ST_RETURN_IF_ERROR(launch::CheckAgainstTopology(env, topo));
  launch::ClusterEnv e = env;
  if (a.timeout_given) e.collective_timeout_ms = a.timeout_ms;
  ST_ASSIGN_OR_RETURN(auto worker, launch::Worker::Init(e));
  const int rank = worker->rank(), world = worker->world_size();
  const comm::CollectiveOptions copts = worker->collective();

  // 1-2. Tensor-parallel FeedForward over a 1-D mesh vs the single-device reference.
  const comm::GroupOptions mesh_opts = worker->GroupOptions();
  ST_ASSIGN_OR_RETURN(comm::DeviceMesh mesh, comm::DeviceMesh::Create(worker->store(), rank, world,
                                                                      {world}, {"tp"}, mesh_opts));
  parallel::FfnParityOptions po;
  po.batch = a.batch_size;
  po.hidden = a.hidden_dim;
  po.collective = copts;
  ST_ASSIGN_OR_RETURN(double diff, parallel::FeedForwardTpParity(mesh.group(0), po));
  const std::string who = StrCat("rank ", rank, " (host ", worker->host_ip(), ")");
  if (!(diff <= 1e-2))
    return Internal(StrCat(who,
                           ": tensor-parallel output differs from the single-device "
                           "reference (max_abs_diff=",
                           diff, " > 0.01)"));

  // 3. all_reduce of [rank + 1] * 4.
  std::vector<float> t(4, static_cast<float>(rank + 1));
  ST_RETURN_IF_ERROR(
      worker->world().AllReduce(t.data(), 4, DType::kF32, comm::ReduceOp::kSum, copts));

  RankResult mine;
  mine.rank = rank;
  mine.worker_id = rank / worker->local_world_size();
  mine.local_rank = worker->local_rank();
  mine.ip = worker->host_ip();
  mine.sum.assign(t.begin(), t.end());
  if (rank == a.corrupt_rank) mine.sum[0] += 1;
  mine.max_abs_diff = diff;
  const comm::StoreOptions so{copts.timeout};
  ST_RETURN_IF_ERROR(worker->store()->Set(StrCat("collectives/result/", rank), Encode(mine), so));

  Status verdict = Status::Ok();
  if (rank == 0) {
    std::vector<RankResult> all;
    for (int r = 0; r < world; ++r) {
      ST_ASSIGN_OR_RETURN(std::string s,
                          worker->store()->Get(StrCat("collectives/result/", r), so));
      all.push_back(Decode(s));
    }
    std::sort(all.begin(), all.end(),
              [](const RankResult& x, const RankResult& y) { return x.rank < y.rank; });
    const double expected = static_cast<double>(world) * (world + 1) / 2;
    for (const auto& r : all) {
      std::string list;
      for (double v : r.sum) list += (list.empty() ? "" : ", ") + PyFloat(v);
      std::printf("Rank %2d (worker_id=%d, local_rank=%d, ip=%s): all_reduce_sum=[%s]\n", r.rank,
                  r.worker_id, r.local_rank, r.ip.c_str(), list.c_str());
      bool ok = r.sum.size() == 4;
      for (double v : r.sum) ok = ok && v == expected;
      if (!ok && verdict.ok())
        verdict = Internal(StrCat("rank ", r.rank, " all_reduce_sum is [", list, "], expected ",
                                  PyFloat(expected), " x 4"));
    }
    if (verdict.ok())
      std::printf(
          "All %d slicetrain ranks verified DTensor TP parity (max_abs_diff=%.6f) and "
          "all_reduce sum = %.1f\n",
          world, all[0].max_abs_diff, expected);
    std::fflush(stdout);
  }
  ST_RETURN_IF_ERROR(worker->Shutdown());
  return verdict;
}

// Without a launcher: the whole slice as local CPU workers, `topo.hosts` virtual hosts.
Status RunEmbedded(const CollectivesArgs& a, const launch::Topology& topo, int* exit_code) {
  const std::vector<std::string> command = {"collectives",
                                            "--topology",
                                            a.topology,
                                            "--accelerator-type",
                                            a.accelerator_type,
                                            "--batch-size",
                                            std::to_string(a.batch_size),
                                            "--hidden-dim",
                                            std::to_string(a.hidden_dim),
                                            "--corrupt-rank",
                                            std::to_string(a.corrupt_rank)};
  launch::LocalSliceOptions o;
  o.collective_timeout_ms = a.timeout_ms;
  o.threads = a.threads;
  return launch::RunLocalSlice(topo, command, o, exit_code);
}

}  // namespace

void RegisterCollectivesCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "collectives", "Tensor-parallel parity check and all_reduce over a slice (the seed's job 1)");
  auto a = std::make_shared<CollectivesArgs>();
  cmd->add_option("--topology", a->topology, "Slice shape (TPU-V6E: 2x2..16x16, TPU-V7X: 2x2x1..)")
      ->capture_default_str();
  cmd->add_option("--accelerator-type", a->accelerator_type, "TPU-V6E, TPU-V7X, GPU-<name>, CPU")
      ->capture_default_str();
  cmd->add_option("--batch-size", a->batch_size, "Rows B of the input x [B, d]")
      ->capture_default_str();
  cmd->add_option("--hidden-dim", a->hidden_dim, "Hidden size d (MLP width 4d)")
      ->capture_default_str();
  cmd->add_option("--timeout-ms", a->timeout_ms,
                  "Timeout of every collective (under `launch` the default is "
                  "$SLICETRAIN_TIMEOUT_MS)")
      ->capture_default_str()
      ->each([a](const std::string&) { a->timeout_given = true; });
  cmd->add_option("--threads", a->threads,
                  "Compute threads per local worker (default: $OMP_NUM_THREADS, else the usable "
                  "CPUs / workers)");
  cmd->add_option("--corrupt-rank", a->corrupt_rank, "")->group("");  // hidden, for tests
  cmd->callback([&ctx, a] {
    int code = 0;
    Status st = [&]() -> Status {
      ST_ASSIGN_OR_RETURN(launch::Topology topo,
                          launch::ResolveTopology(a->accelerator_type, a->topology));
      if (a->batch_size < 1 || a->hidden_dim < 1)
        return InvalidArgument("--batch-size and --hidden-dim must be positive");
      // The MLP weights (2 x [4d, d]) and activations ([B, 4d] and friends) of every worker: a
      // size that cannot be allocated is a flag error, not an abort in each worker.
      const double d = static_cast<double>(a->hidden_dim), b = static_cast<double>(a->batch_size);
      const double gib = (8 * d * d + 16 * b * d) * sizeof(float) / double(1 << 30);
      if (gib > 16)
        return InvalidArgument(StrCat("--batch-size ", a->batch_size, " and --hidden-dim ",
                                      a->hidden_dim, " need about ", static_cast<int64_t>(gib),
                                      " GiB per worker; the limit is 16 GiB"));
      ST_ASSIGN_OR_RETURN(launch::ClusterEnv env,
                          launch::DetectClusterEnv(launch::ReadProcessEnvironment()));
      if (a->threads < 0) return InvalidArgument("--threads must be >= 0");
      if (a->threads == 0) a->threads = env.threads;
      if (!env.is_worker()) return RunEmbedded(*a, topo, &code);
      return RunWorker(*a, env, topo);
    }();
    if (!st.ok()) {
      const int rc = ReportError("collectives", st);
      ctx.exit_code = code != 0 ? code : rc;
    }
  });
}

}  // namespace st::cli
