// Collective bandwidth and latency of slicetrain's transports beside PyTorch's gloo, in one run.
// Reported as nccl-tests does: for each message size, the time of one op (slowest rank, mean over
// iterations; 512 MiB of traffic per row), algbw = bytes / time and busbw = algbw * factor
// (all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n), where bytes is the per-rank buffer
// for all_reduce, the gathered output for all_gather and the scattered input for reduce_scatter.
// Workers are separate processes on this host; "shm" is the shared-memory transport, "tcp" Gloo
// over loopback TCP, and the peer (bench/peers/collectives_peer.py, torch.distributed with backend
// gloo) runs the same sizes and worker counts right after. The memcpy column is one thread copying
// `bytes` between two warm buffers: the ceiling a shared-memory collective is measured against.
//   bench_collectives                      2 and 4 workers; 1 KiB, 64 KiB, 4 MiB, 64 MiB
//   bench_collectives --full               every power of two from 1 KiB to 256 MiB
//   bench_collectives --peer none          without the PyTorch peer
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "comm/group.h"
#include "comm/store/tcp_store.h"
#include "kernels/cpu/ops_cpu.h"

namespace {

using namespace st;
using namespace st::comm;

struct Config {
  std::vector<int> workers = {2, 4};
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter"};
  std::vector<std::string> transports = {"shm", "tcp"};
  std::vector<int64_t> sizes = {1 << 10, 64 << 10, 4 << 20, 64 << 20};
  int64_t budget = 512 << 20;  // traffic per row: sets the iteration count
  std::string peer;            // python with torch; "" = tools/.venv's, "none" = skip
  size_t slot_bytes = 0;       // shared-memory slot per rank (0 = the default)
  std::string results;         // rows, "op transport workers bytes us" (written by rank 0)
};

// A message size rounded to a whole number of f32 per rank.
int64_t RoundSize(int64_t bytes, int P) {
  const int64_t unit = 4LL * P;
  return std::max(unit, bytes / unit * unit);
}

int Iterations(const Config& cfg, int64_t size) {
  return static_cast<int>(std::clamp<int64_t>(cfg.budget / size, 3, 200));
}

Status RunOp(ProcessGroup& pg, const std::string& op, int64_t size, std::vector<float>& a,
             std::vector<float>& b) {
  const int P = pg.size();
  const int64_t n = size / 4;
  if (op == "all_reduce") return pg.AllReduce(a.data(), n, DType::kF32, ReduceOp::kSum);
  if (op == "all_gather") return pg.AllGather(a.data(), b.data(), n / P, DType::kF32);
  return pg.ReduceScatter(a.data(), b.data(), n / P, DType::kF32, ReduceOp::kSum);
}

double BusFactor(const std::string& op, int P) {
  return op == "all_reduce" ? 2.0 * (P - 1) / P : static_cast<double>(P - 1) / P;
}

int Worker(const Config& cfg, const std::string& transport, int rank, int P, int port) {
  cpu::SetNumThreads(1);
  auto client = TcpStoreClient::Connect("127.0.0.1", port, "bench", {});
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, client.status().message().c_str());
    return 1;
  }
  std::shared_ptr<Store> store(std::move(*client));
  GroupOptions o;
  o.transport = *ParseTransport(transport);
  o.shm_slot_bytes = cfg.slot_bytes;
  auto pg = CreateProcessGroup(store, rank, P, o);
  if (!pg.ok()) {
    std::fprintf(stderr, "%s\n", pg.status().message().c_str());
    return 1;
  }
  std::ofstream results;
  if (rank == 0) results.open(cfg.results, std::ios::app);
  for (const std::string& op : cfg.ops) {
    for (int64_t bytes : cfg.sizes) {
      const int64_t size = RoundSize(bytes, P);
      const int64_t n = size / 4;
      std::vector<float> a(op == "all_gather" ? n / P : n, 1.0f), b(op == "all_gather" ? n : n / P);
      const int iters = Iterations(cfg, size);
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
        std::printf("  %-4s %2d %12lld %-15s %10.1f %12.3f %12.3f\n", transport.c_str(), P,
                    static_cast<long long>(size), op.c_str(), us, algbw, algbw * BusFactor(op, P));
        std::fflush(stdout);
        results << op << " " << transport << " " << P << " " << size << " " << us << "\n";
        results.flush();
      }
    }
  }
  return StoreBarrier(*store, "bench-done", P).ok() ? 0 : 1;
}

// GB/s of one thread copying `bytes` between two warm buffers (best of a few passes).
double MemcpyGBs(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 2);
  const int iters = static_cast<int>(std::clamp<int64_t>((256LL << 20) / bytes, 3, 20000));
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(pass % 2 ? a.data() : b.data(), pass % 2 ? b.data() : a.data(), a.size());
      asm volatile("" ::: "memory");
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) * iters / s / 1e9);
  }
  return best;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// Runs the PyTorch peer; rows keyed (op, workers, bytes) -> us (negative: unsupported).
std::map<std::tuple<std::string, int, int64_t>, double> RunPeer(const Config& cfg,
                                                                std::string* version) {
  std::map<std::tuple<std::string, int, int64_t>, double> out;
  std::string py =
      cfg.peer.empty() ? std::string(ST_SOURCE_DIR) + "/tools/.venv/bin/python" : cfg.peer;
  if (cfg.peer == "none") return out;
  if (!std::filesystem::exists(py)) {
    std::printf("# PyTorch peer skipped: %s not found (tools/setup_venv.sh creates it)\n",
                py.c_str());
    return out;
  }
  std::string workers, sizes;
  for (int w : cfg.workers) workers += (workers.empty() ? "" : ",") + std::to_string(w);
  for (int64_t s : cfg.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  const std::string cmd = py + " " + ST_SOURCE_DIR + "/bench/peers/collectives_peer.py --workers " +
                          workers + " --sizes " + sizes + " --ops " + Join(cfg.ops) + " --budget " +
                          std::to_string(cfg.budget);
  std::printf("# PyTorch peer: %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char line[4096];
  while (std::fgets(line, sizeof(line), f)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("op")) continue;
    const auto key = std::make_tuple(j["op"].get<std::string>(), j["workers"].get<int>(),
                                     j["bytes"].get<int64_t>());
    if (j.contains("error")) {
      out[key] = -1;
      std::printf("# peer: %s unsupported: %s\n", std::get<0>(key).c_str(),
                  j["error"].get<std::string>().c_str());
    } else {
      out[key] = j["us"].get<double>();
      *version = j.value("torch", "");
    }
  }
  const int rc = ::pclose(f);
  if (rc != 0) std::printf("# PyTorch peer exited with status %d\n", rc);
  return out;
}

std::string Human(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool full = false;
  CLI::App app{"Collective bandwidth (nccl-tests style) of slicetrain's transports and torch gloo"};
  app.add_flag("--full", full, "1 KiB .. 256 MiB, every power of two");
  app.add_option("--workers", cfg.workers, "Worker counts")->delimiter(',');
  app.add_option("--ops", cfg.ops, "all_reduce, all_gather, reduce_scatter")->delimiter(',');
  app.add_option("--transports", cfg.transports, "shm, tcp")->delimiter(',');
  app.add_option("--sizes", cfg.sizes, "Message sizes in bytes")->delimiter(',');
  app.add_option("--slot-bytes", cfg.slot_bytes, "Shared-memory slot per rank (0 = default)");
  app.add_option("--peer", cfg.peer, "Python with torch for the peer; none to skip");
  CLI11_PARSE(app, argc, argv);
  if (full) {
    cfg.sizes.clear();
    for (int64_t s = 1 << 10; s <= (256LL << 20); s *= 2) cfg.sizes.push_back(s);
    cfg.budget = 512LL << 20;
  }
  cfg.results = (std::filesystem::temp_directory_path() /
                 ("bench_collectives_" + std::to_string(::getpid()) + ".txt"))
                    .string();
  std::printf("# slicetrain transports, worker processes on this host (%u cores)\n",
              std::thread::hardware_concurrency());
  std::printf("# %-4s %2s %12s %-15s %10s %12s %12s\n", "via", "P", "size(B)", "op", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)");
  int failures = 0;
  for (int P : cfg.workers)
    for (const std::string& t : cfg.transports)
      failures += bench::RunForkedWorkers(
          P, [&cfg, &t](int rank, int n, int port) { return Worker(cfg, t, rank, n, port); });
  // (op, transport, workers, bytes) -> us
  std::map<std::tuple<std::string, std::string, int, int64_t>, double> ours;
  {
    std::ifstream in(cfg.results);
    std::string op, t;
    int P;
    int64_t bytes;
    double us;
    while (in >> op >> t >> P >> bytes >> us) ours[{op, t, P, bytes}] = us;
  }
  std::filesystem::remove(cfg.results);
  std::map<int64_t, double> memcpy_gbs;
  for (int64_t s : cfg.sizes) memcpy_gbs[s] = MemcpyGBs(s);
  std::string torch_version;
  auto peer = RunPeer(cfg, &torch_version);

  // Side by side: busbw in GB/s (time in us for messages under 64 KiB, where latency rules).
  std::printf("\n| op | workers | size | memcpy GB/s |");
  for (const auto& t : cfg.transports) std::printf(" slicetrain %s |", t.c_str());
  std::printf(" torch gloo%s%s | %s/gloo | %s/memcpy |\n", torch_version.empty() ? "" : " ",
              torch_version.c_str(), cfg.transports[0].c_str(), cfg.transports[0].c_str());
  std::printf("| --- | --- | --- | --- |");
  for (size_t i = 0; i < cfg.transports.size() + 3; ++i) std::printf(" --- |");
  std::printf("\n");
  for (const std::string& op : cfg.ops)
    for (int P : cfg.workers)
      for (int64_t bytes : cfg.sizes) {
        const int64_t size = RoundSize(bytes, P);
        const bool latency = size < (64 << 10);
        auto cell = [&](double us) {
          char c[64];
          if (us <= 0)
            std::snprintf(c, sizeof(c), "n/a");
          else if (latency)
            std::snprintf(c, sizeof(c), "%.1f us", us);
          else
            std::snprintf(c, sizeof(c), "%.2f",
                          static_cast<double>(size) / (us * 1e-6) / 1e9 * BusFactor(op, P));
          return std::string(c);
        };
        std::printf("| %s | %d | %s | %.1f |", op.c_str(), P, Human(size).c_str(),
                    memcpy_gbs[bytes]);
        double first = 0;
        for (const auto& t : cfg.transports) {
          auto it = ours.find({op, t, P, size});
          const double us = it == ours.end() ? 0 : it->second;
          if (first == 0) first = us;
          std::printf(" %s |", cell(us).c_str());
        }
        auto pit = peer.find({op, P, size});
        const double pus = pit == peer.end() ? 0 : pit->second;
        std::printf(" %s |", cell(pus).c_str());
        if (first > 0 && pus > 0)
          std::printf(" %.1fx |", pus / first);
        else
          std::printf(" - |");
        if (first > 0 && !latency)
          std::printf(" %.0f%% |\n", 100.0 * static_cast<double>(size) / (first * 1e-6) / 1e9 *
                                         BusFactor(op, P) / memcpy_gbs[bytes]);
        else
          std::printf(" - |\n");
      }
  return failures == 0 ? 0 : 1;
}
