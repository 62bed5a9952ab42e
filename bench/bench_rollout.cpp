// GRPO's sampling (train/rollout.h over the batched decoder): new tokens/s of completions decoded
// together (--batch sequences in flight, one matrix product per weight per step) against the same
// completions one at a time (a decoder of one sequence), on the same model, prompts, sampling and
// thread count, in one process. Every completion runs to --new tokens (no stop token), sampled at
// temperature 1 with a fixed seed. Prints tokens/s, GFLOP/s (DecodeFlopsPerToken at the mean
// context) and the speed-up.
//   bench_rollout --model DIR|gemma4-small [--prompts 8] [--prompt-len 128] [--new 128]
//                 [--batch 8] [--precision fp32|bf16] [--repeats 3]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "io/model_loader.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "model/decode.h"
#include "train/rollout.h"

namespace {

using namespace st;

struct Config {
  std::string model = "gemma4-small";
  int64_t prompts = 8, prompt_len = 128, new_tokens = 128, batch = 8, repeats = 3;
  std::string precision = "fp32";
  bool batched_only = false;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  cpu::ReexecWithBlasCore(argv);  // as slicetrain does: the fp32 prompt products' kernels
  Config c;
  CLI::App app{"GRPO sampling: batched against one at a time"};
  app.add_option("--model", c.model, "A model directory or preset")->capture_default_str();
  app.add_option("--prompts", c.prompts, "Prompts (one completion each)")->capture_default_str();
  app.add_option("--prompt-len", c.prompt_len, "Tokens per prompt")->capture_default_str();
  app.add_option("--new", c.new_tokens, "New tokens per completion")->capture_default_str();
  app.add_option("--batch", c.batch, "Sequences decoded together")->capture_default_str();
  app.add_option("--precision", c.precision, "fp32 or bf16 (weights held and prompt products)")
      ->capture_default_str();
  app.add_option("--repeats", c.repeats, "Runs of each (the best is printed)")
      ->capture_default_str();
  app.add_flag("--batched-only", c.batched_only, "Skip the one-at-a-time run (for profiling)");
  CLI11_PARSE(app, argc, argv);
  StatusOr<LoadedModel> m = LoadModel(c.model, 42);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    return 1;
  }
  const Precision p = c.precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  const DecodeWeights weights(m->registry, *m->weights,
                              p == Precision::kBf16 ? DType::kBF16 : DType::kF32);
  const int64_t V = m->config.vocab_size;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(c.prompts));
  uint64_t x = 12345;
  for (auto& pr : prompts) {
    pr.push_back(2);
    while (static_cast<int64_t>(pr.size()) < c.prompt_len) {
      x = (x * 1103515245 + 12345) % 2147483648ull;
      pr.push_back(static_cast<int32_t>(3 + x % static_cast<uint64_t>(V - 3)));
    }
  }
  RolloutOptions o;
  o.num_generations = 1;
  o.max_completion_length = c.new_tokens;
  o.sampling.temperature = 1.0;
  o.sampling.seed = 7;
  const double flops = DecodeFlopsPerToken(m->config, m->registry, c.prompt_len + c.new_tokens / 2);
  std::printf(
      "# %s, %lld prompts of %lld tokens, %lld new tokens each, %s, %d threads, CPU %s, "
      "OpenBLAS %s\n",
      c.model.c_str(), (long long)c.prompts, (long long)c.prompt_len, (long long)c.new_tokens,
      c.precision.c_str(), cpu::NumThreads(), cpu::DetectCpu().model.c_str(),
      cpu::BlasCoreName().c_str());
  double tps[2] = {0, 0};
  for (int k = c.batched_only ? 1 : 0; k < 2; ++k) {
    const int64_t in_flight = k == 0 ? 1 : c.batch;
    Gemma4Decoder dec(m->config, m->registry, weights, c.prompt_len + c.new_tokens, 128, p,
                      in_flight);
    double best = 1e300;
    for (int64_t r = 0; r < c.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<std::vector<Completion>> done = SampleCompletions(dec, prompts, o);
      const double s = Seconds(t0);
      if (!done.ok()) {
        std::fprintf(stderr, "%s\n", done.status().ToString().c_str());
        return 1;
      }
      best = std::min(best, s);
    }
    tps[k] = static_cast<double>(c.prompts * c.new_tokens) / best;
    std::printf("slicetrain sequences_in_flight=%lld seconds=%.3f new_tokens/s=%.1f GFLOP/s=%.1f\n",
                (long long)in_flight, best, tps[k], tps[k] * flops / 1e9);
  }
  std::printf("speed-up of %lld in flight over one at a time: %.2fx (prompts included in both)\n",
              (long long)c.batch, tps[1] / tps[0]);
  return 0;
}
