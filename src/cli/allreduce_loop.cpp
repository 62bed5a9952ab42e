// `slicetrain allreduce-loop` (hidden): every worker all_reduces a buffer `--iters` times. Used by
// the launch and fault tests (a worker killed or failing mid collective must take the group down)
// and handy for checking a cluster's network by hand.
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "launch/cluster_env.h"
#include "launch/worker.h"

namespace st::cli {

namespace {

struct LoopArgs {
  int iters = 10;
  int64_t count = 1 << 16;
  int fail_rank = -1;   // this rank exits with code 3 ...
  int fail_at = 0;      // ... before iteration fail_at
  int sleep_ms = 0;     // pause between iterations
  bool report = false;  // rank 0 prints the mean time and bandwidth of one all_reduce
};

Status RunLoop(const LoopArgs& a) {
  ST_ASSIGN_OR_RETURN(launch::ClusterEnv env,
                      launch::DetectClusterEnv(launch::ReadProcessEnvironment()));
  ST_ASSIGN_OR_RETURN(auto worker, launch::Worker::Init(env));
  std::printf("ready rank=%d world=%d\n", worker->rank(), worker->world_size());
  std::fflush(stdout);
  std::vector<float> buf(static_cast<size_t>(a.count));
  const double expected = worker->world_size() * (worker->world_size() + 1) / 2.0;
  // --report: time inside all_reduce from the second one on (the first warms up), every rank
  // starting it together (a barrier after filling the buffer), so filling and checking are out.
  double seconds = 0;
  for (int i = 0; i < a.iters; ++i) {
    if (worker->rank() == a.fail_rank && i == a.fail_at) {
      std::fprintf(stderr, "rank %d failing on purpose at iteration %d\n", worker->rank(), i);
      std::fflush(stderr);
      std::_Exit(3);
    }
    std::fill(buf.begin(), buf.end(), static_cast<float>(worker->rank() + 1));
    if (a.report) ST_RETURN_IF_ERROR(worker->world().Barrier(worker->collective()));
    const auto t0 = std::chrono::steady_clock::now();
    ST_RETURN_IF_ERROR(worker->world().AllReduce(buf.data(), a.count, DType::kF32,
                                                 comm::ReduceOp::kSum, worker->collective()));
    if (i > 0)
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t k = 0; k < a.count; ++k)
      if (buf[k] != expected)
        return Internal(
            StrCat("all_reduce gave ", buf[k], " at element ", k, ", expected ", expected));
    if (worker->rank() == 0 && (i + 1) % 10 == 0) {
      std::printf("iteration %d done\n", i + 1);
      std::fflush(stdout);
    }
    if (a.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
  }
  if (a.report && worker->rank() == 0 && a.iters > 1) {
    // nccl-tests' figures: algbw = bytes / time, busbw = algbw * 2 (P - 1) / P.
    const double s = seconds / (a.iters - 1);
    const double bytes = static_cast<double>(a.count) * sizeof(float);
    const int P = worker->world_size();
    std::printf(
        "allreduce-loop: %lld f32 (%.1f MiB) x %d on %d ranks via %s: %.3f ms per all_reduce, "
        "algbw %.3f GB/s, busbw %.3f GB/s\n",
        static_cast<long long>(a.count), bytes / (1 << 20), a.iters - 1, P,
        worker->world().transport().c_str(), s * 1e3, bytes / s / 1e9,
        bytes / s / 1e9 * 2.0 * (P - 1) / P);
    std::fflush(stdout);
  }
  return worker->Shutdown();
}

}  // namespace

void RegisterAllReduceLoopCommand(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("allreduce-loop", "Repeated all_reduce (tests, network checks)");
  cmd->group("");  // hidden from --help
  auto a = std::make_shared<LoopArgs>();
  cmd->add_option("--iters", a->iters)->capture_default_str();
  cmd->add_option("--count", a->count)->capture_default_str();
  cmd->add_option("--fail-rank", a->fail_rank);
  cmd->add_option("--fail-at", a->fail_at);
  cmd->add_option("--sleep-ms", a->sleep_ms);
  cmd->add_flag("--report", a->report, "Rank 0 prints the time and bandwidth of one all_reduce");
  cmd->callback([&ctx, a] {
    Status st = RunLoop(*a);
    if (!st.ok()) ctx.exit_code = ReportError("allreduce-loop", st);
  });
}

}  // namespace st::cli
