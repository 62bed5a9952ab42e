// Collective bandwidth of the Gloo process group, reported as nccl-tests does: for each message
// size, the time of one op (slowest rank, mean over iterations), algbw = bytes / time and
// busbw = algbw * factor (all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n), where bytes
// is the per-rank buffer for all_reduce, the gathered output for all_gather and the scattered
// input for reduce_scatter. Workers are separate processes on 127.0.0.1 (TCP loopback).
//   bench_collectives                 quick: 1 KiB .. 16 MiB (x16 steps) at 2, 4, 8 workers
//   bench_collectives --full          every power of two from 1 KiB to 256 MiB
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "dist/gloo_process_group.h"
#include "dist/socket.h"
#include "dist/tcp_store.h"
#include "kernels/cpu/ops_cpu.h"

namespace {

using namespace st;
using namespace st::dist;

struct Config {
  std::vector<int> workers = {2, 4, 8};
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter"};
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 16 << 20;
  int step = 16;                      // size multiplier between rows
  int64_t bytes_per_size = 64 << 20;  // traffic budget per row: sets the iteration count
};

// One op on `bytes` (nccl-tests' size) with buffers prepared by the caller.
Status RunOp(ProcessGroup& pg, const std::string& op, int64_t bytes, std::vector<float>& a,
             std::vector<float>& b) {
  const int P = pg.size();
  const int64_t n = bytes / 4;
  if (op == "all_reduce") return pg.AllReduce(a.data(), n, DType::kF32, ReduceOp::kSum);
  if (op == "all_gather") return pg.AllGather(a.data(), b.data(), n / P, DType::kF32);
  return pg.ReduceScatter(a.data(), b.data(), n / P, DType::kF32, ReduceOp::kSum);
}

double BusFactor(const std::string& op, int P) {
  return op == "all_reduce" ? 2.0 * (P - 1) / P : static_cast<double>(P - 1) / P;
}

int Worker(const Config& cfg, int rank, int P, int port) {
  cpu::SetNumThreads(1);
  auto client = TcpStoreClient::Connect("127.0.0.1", port, "bench", {});
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, client.status().message().c_str());
    return 1;
  }
  std::shared_ptr<Store> store(std::move(*client));
  auto pg = CreateGlooProcessGroup(store, rank, P, {});
  if (!pg.ok()) {
    std::fprintf(stderr, "%s\n", pg.status().message().c_str());
    return 1;
  }
  if (rank == 0)
    std::printf(
        "# %d workers (processes, Gloo over TCP on 127.0.0.1, %u cores)\n"
        "# %12s %12s %-15s %10s %12s %12s\n",
        P, std::thread::hardware_concurrency(), "size(B)", "count(f32)", "op", "time(us)",
        "algbw(GB/s)", "busbw(GB/s)");
  for (const std::string& op : cfg.ops) {
    for (int64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.step) {
      // Round to a whole number of f32 per rank.
      const int64_t unit = 4LL * P;
      const int64_t size = std::max(unit, bytes / unit * unit);
      const int64_t n = size / 4;
      std::vector<float> a(op == "all_gather" ? n / P : n, 1.0f), b(op == "all_gather" ? n : n / P);
      const int iters = static_cast<int>(std::clamp<int64_t>(cfg.bytes_per_size / size, 3, 200));
      if (!RunOp(**pg, op, size, a, b).ok()) return 1;  // warm-up
      if (!(*pg)->Barrier().ok()) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i)
        if (Status st = RunOp(**pg, op, size, a, b); !st.ok()) {
          std::fprintf(stderr, "%s\n", st.message().c_str());
          return 1;
        }
      float us = static_cast<float>(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters);
      if (!(*pg)->AllReduce(&us, 1, DType::kF32, ReduceOp::kMax).ok()) return 1;
      if (rank == 0) {
        const double algbw = static_cast<double>(size) / (us * 1e-6) / 1e9;
        std::printf("  %12lld %12lld %-15s %10.1f %12.3f %12.3f\n", static_cast<long long>(size),
                    static_cast<long long>(n), op.c_str(), us, algbw, algbw * BusFactor(op, P));
        std::fflush(stdout);
      }
    }
  }
  return StoreBarrier(*store, "bench-done", P).ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool full = false;
  CLI::App app{"Collective bandwidth (nccl-tests style) of slicetrain's Gloo process group"};
  app.add_flag("--full", full, "1 KiB .. 256 MiB, every power of two");
  app.add_option("--workers", cfg.workers, "Worker counts")->delimiter(',');
  app.add_option("--ops", cfg.ops, "all_reduce, all_gather, reduce_scatter")->delimiter(',');
  app.add_option("--max-bytes", cfg.max_bytes, "Largest message");
  CLI11_PARSE(app, argc, argv);
  if (full) {
    cfg.max_bytes = 256LL << 20;
    cfg.step = 2;
    cfg.bytes_per_size = 512LL << 20;
  }
  int failures = 0;
  for (int P : cfg.workers)
    failures += bench::RunForkedWorkers(
        P, [&cfg](int rank, int n, int port) { return Worker(cfg, rank, n, port); });
  return failures == 0 ? 0 : 1;
}
