// The whole-model training step (forward + backward, no optimizer) for the CPU presets (or model
// directories) on 1 and 2 threads, for each activation checkpointing mode asked for: step time,
// tokens/s, model FLOP/s (6 x matmul params x tokens + attention over the visible query-key pairs,
// see TrainingFlops; a recompute is not counted as model FLOPs) and that figure as a share of the
// GEMM peak of its precision (fp32: sgemm; bf16: oneDNN's bf16 GEMM) measured in the same run at
// the same thread count, and the engine's bytes. Both peaks are printed first, with the CPU.
//   bench_step [--presets gemma4-tiny,gemma4-small] [--threads 1,2] [--batch 4] [--seq 512]
//              [--steps 3] [--checkpointing none,mlp,layer] [--precision fp32,bf16]
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bench_util.h"
#include "core/rng.h"
#include "io/model_loader.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "model/gemma4.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  st::cpu::ReexecWithBlasCore(argv);  // as slicetrain does: the kernels the CPU runs
  CLI::App app{"slicetrain whole-model step benchmark"};
  std::vector<std::string> presets = {"gemma4-tiny", "gemma4-small"};
  std::vector<int> threads = {1, 2};
  int64_t batch = 4, seq = 512;
  int steps = 3;
  std::vector<std::string> checkpointing = {"none"};
  std::vector<std::string> precisions = {"fp32", "bf16"};
  app.add_option("--presets", presets)->delimiter(',')->capture_default_str();
  app.add_option("--threads", threads)->delimiter(',')->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--steps", steps, "timed steps after one warm-up step")->capture_default_str();
  app.add_option("--checkpointing", checkpointing, "activation checkpointing modes")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--precision", precisions, "fp32, bf16 (each run in turn)")
      ->delimiter(',')
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const st::cpu::CpuFeatures& cpu = st::cpu::DetectCpu();
  std::printf("CPU: %s [%s], fp32 GEMM on OpenBLAS %s kernels, bf16 GEMM on %s\n",
              cpu.model.c_str(), st::cpu::IsaName(cpu), st::cpu::BlasCoreName().c_str(),
              st::cpu::Bf16GemmIsa());
  std::vector<double> peak32, peak16;
  for (int t : threads) {
    st::cpu::SetNumThreads(t);
    peak32.push_back(st::bench::MeasureSgemmGflops());
    peak16.push_back(st::bench::MeasureBf16GemmGflops());
    std::printf(
        "GEMM peaks at %d thread(s), 2048^3: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (%.2fx)\n", t,
        peak32.back(), peak16.back(), peak16.back() / peak32.back());
  }

  std::printf("%-13s %5s %6s %7s %8s %9s %9s %10s %8s %9s %9s %8s\n", "preset", "prec", "ckpt",
              "threads", "batch", "step_s", "fwd_s", "tokens/s", "GFLOP/s", "peak", "%peak",
              "act_MiB");
  for (const auto& preset : presets) {
    auto loaded = st::LoadModel(preset, 42);
    if (!loaded.ok()) {
      std::fprintf(stderr, "bench_step: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    st::LoadedModel& m = loaded.value();
    const st::AlignedBuffer params = st::MaterializeParams(m);
    std::vector<float> grads(params.size(), 0.0f);
    std::vector<int32_t> ids(batch * seq);
    st::Rng rng(7);
    for (auto& id : ids) id = 1 + static_cast<int32_t>(rng.Below(m.config.vocab_size - 1));
    const st::Batch b{ids.data(), nullptr, ids.data(), batch, seq};
    const double flops = st::TrainingFlops(m.config, m.registry, batch, seq);
    for (const std::string& prec : precisions)
      for (const std::string& mode : checkpointing) {
        auto ckpt = st::ParseActivationCheckpointing(mode);
        auto precision = st::cpu::ResolvePrecision(prec);
        if (!ckpt.ok() || !precision.ok()) {
          std::fprintf(stderr, "bench_step: %s\n",
                       (!ckpt.ok() ? ckpt.status() : precision.status()).ToString().c_str());
          return 1;
        }
        st::EngineOptions options;
        options.checkpointing = *ckpt;
        options.precision = *precision;
        st::Gemma4Engine engine(m.config, batch, seq, options);
        for (size_t ti = 0; ti < threads.size(); ++ti) {
          const int t = threads[ti];
          st::cpu::SetNumThreads(t);
          const double peak = *precision == st::Precision::kBf16 ? peak16[ti] : peak32[ti];
          std::vector<double> step_s, fwd_s;
          for (int s = 0; s <= steps; ++s) {
            const auto t0 = std::chrono::steady_clock::now();
            st::ForwardResult r = engine.Forward(params.data(), b);
            const double f = Seconds(t0);
            engine.Backward(params.data(), grads.data(), b, 1.0f / static_cast<float>(r.num_valid));
            if (s > 0) {  // step 0 warms caches, pages and thread pools
              step_s.push_back(Seconds(t0));
              fwd_s.push_back(f);
            }
          }
          std::sort(step_s.begin(), step_s.end());
          std::sort(fwd_s.begin(), fwd_s.end());
          const double med = step_s[step_s.size() / 2], fmed = fwd_s[fwd_s.size() / 2];
          const double gflops = flops / med / 1e9;
          std::printf(
              "%-13s %5s %6s %7d %4lldx%-4lld %9.3f %9.3f %10.1f %8.1f %9.1f %8.1f%% %8.0f\n",
              preset.c_str(), st::PrecisionName(*precision), mode.c_str(), t, (long long)batch,
              (long long)seq, med, fmed, batch * seq / med, gflops, peak, 100.0 * gflops / peak,
              engine.ActivationBytes() / 1048576.0);
          std::fflush(stdout);
        }
      }
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS %.0f MiB\n", ru.ru_maxrss / 1024.0);
  return 0;
}
