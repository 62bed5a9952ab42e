// Loading a model directory the way finetune does, per worker process: CheckpointWeights::Open
// (safetensors headers, mmap) and FsdpModel::Load (this rank's ranges of each trainable tensor,
// converted to fp32 into its shards) plus FrozenWeights (the frozen tensors outside the layers).
// Prints, per worker count, the slowest rank's seconds, the checkpoint's on-disk bytes over that
// time (GB/s, as safetensors.torch.load_file is measured by bench/peers/load_peer.py), and each
// rank's peak RSS and PSS (/proc/self/smaps_rollup) after the load. Page cache: as found (run the
// peer in the same run, on the same warm cache, to compare).
//   bench_load --model DIR [--workers 1,2] [--freeze REGEX] [--peer PYTHON]
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "comm/group.h"
#include "comm/store/socket.h"
#include "comm/store/tcp_store.h"
#include "io/model_loader.h"
#include "kernels/cpu/ops_cpu.h"
#include "model/frozen_weights.h"
#include "parallel/fsdp.h"
#include "train/trainable.h"

namespace {

using namespace st;
using namespace st::comm;

struct Config {
  std::string model;
  std::vector<int> workers = {1, 2};
  std::string freeze = "^embed_tokens_per_layer";
  std::string peer;  // python with torch + transformers: runs bench/peers/load_peer.py
};

// kB of a field of /proc/self/smaps_rollup or /proc/self/status ("Pss:", "VmHWM:").
double ProcKb(const char* file, const std::string& field) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(field.size()));
  return -1;
}

int Worker(const Config& cfg, int rank, int P, int port) {
  auto client = TcpStoreClient::Connect("127.0.0.1", port, "bench", {});
  if (!client.ok()) return 1;
  std::shared_ptr<Store> store(std::move(*client));
  auto pg = CreateProcessGroup(store, rank, P, {});
  if (!pg.ok()) return 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto m = LoadModel(cfg.model, 0);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().message().c_str());
    return 1;
  }
  auto trainable = TrainableTensors(m->registry, cfg.freeze);
  if (!trainable.ok()) return 1;
  const double t_open =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FsdpModel fsdp(m->config, m->registry, **pg, trainable->mask, *m->weights, FsdpOptions{});
  fsdp.Load();
  float s = static_cast<float>(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const float mine = s;
  if (!(*pg)->AllReduce(&s, 1, DType::kF32, ReduceOp::kMax).ok()) return 1;
  const double hwm = ProcKb("/proc/self/status", "VmHWM:"),
               pss = ProcKb("/proc/self/smaps_rollup", "Pss:");
  float pss_total = static_cast<float>(pss);
  if (!(*pg)->AllReduce(&pss_total, 1, DType::kF32, ReduceOp::kSum).ok()) return 1;
  std::printf(
      "  rank %d/%d: open %.2f s, load %.2f s; sharded state %.1f MiB, frozen fp32 %.1f MiB; "
      "peak RSS %.0f MiB, PSS %.0f MiB\n",
      rank, P, t_open, mine, fsdp.ShardedStateBytes() / 1048576.0, fsdp.FrozenBytes() / 1048576.0,
      hwm / 1024, pss / 1024);
  std::fflush(stdout);
  if (rank == 0) {
    const double gb = static_cast<double>(m->report.file_bytes) / 1e9;
    std::printf(
        "slicetrain workers=%d load_s=%.2f checkpoint_gb=%.2f gb_per_s=%.2f total_pss_mib=%.0f\n",
        P, s, gb, gb / s, pss_total / 1024);
    std::fflush(stdout);
  }
  return StoreBarrier(*store, "bench-done", P).ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  CLI::App app{"Sharded load of a model directory per worker (GB/s, peak RSS, PSS)"};
  app.add_option("--model", cfg.model, "Hugging Face model directory")->required();
  app.add_option("--workers", cfg.workers, "Worker counts")->delimiter(',');
  app.add_option("--freeze", cfg.freeze, "Frozen tensors (regex), as finetune's --freeze");
  app.add_option("--peer", cfg.peer,
                 "Python with torch + transformers: also run bench/peers/load_peer.py");
  CLI11_PARSE(app, argc, argv);
  std::printf("# %s, --freeze '%s', %d threads per worker\n", cfg.model.c_str(), cfg.freeze.c_str(),
              cpu::NumThreads());
  int failures = 0;
  for (int P : cfg.workers)
    failures += bench::RunForkedWorkers(
        P, [&cfg](int rank, int n, int port) { return Worker(cfg, rank, n, port); });
  if (!cfg.peer.empty()) {
    std::fflush(stdout);
    const std::string cmd =
        cfg.peer + " " ST_SOURCE_DIR "/bench/peers/load_peer.py --model '" + cfg.model + "'";
    failures += std::system(cmd.c_str()) != 0;
  }
  return failures == 0 ? 0 : 1;
}
