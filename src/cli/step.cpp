// `slicetrain step`: forward + backward of one model on random token batches, single process,
// printing loss, step time, tokens/s and model FLOP/s. The quickest check that the engine works on
// this machine and how fast it is (bench/ has the full benchmarks).
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "core/rng.h"
#include "io/model_loader.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"
#include "launch/resources.h"
#include "model/gemma4.h"
#include "train/progress.h"

namespace st::cli {

namespace {

struct StepOptions {
  std::string model_id = "gemma4-tiny";
  int64_t batch = 4, seq = 256, steps = 3;
  int threads = 0;
  uint64_t seed = 42;
  std::string precision = "auto";
};

Status RunStep(const StepOptions& o) {
  if (o.batch < 1 || o.seq < 2 || o.steps < 1)
    return InvalidArgument("--batch-size must be >= 1, --seq-len >= 2 and --steps >= 1");
  ST_RETURN_IF_ERROR(SetProcessThreads(o.threads));
  std::string why;
  ST_ASSIGN_OR_RETURN(const Precision precision, cpu::ResolvePrecision(o.precision, &why));
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(o.model_id, o.seed));
  const Gemma4Config& c = m.config;
  EngineOptions options;
  options.precision = precision;
  Gemma4Engine engine(c, o.batch, o.seq, options);
  // One process trains every tensor: the whole model in fp32, with a gradient for each. Refused up
  // front when that cannot fit, instead of being killed halfway through.
  const double need = 8.0 * static_cast<double>(m.registry.layout.total()) +
                      EstimateActivationBytes(c, o.batch, o.seq);
  if (const size_t avail = launch::AvailableMemoryBytes();
      avail > 0 && need > static_cast<double>(avail))
    return ResourceExhausted(StrCat(
        "step trains every tensor of ", o.model_id, " in one process, which needs ",
        static_cast<int64_t>(need / (1 << 30)),
        " GiB of fp32 weights, gradients and activations; this host has ",
        launch::DescribeAvailableMemory(),
        "; use a smaller model, or finetune, which shards the state over workers and freezes "
        "tensors (--freeze)"));
  const AlignedBuffer params = MaterializeParams(m);
  std::vector<float> grads(params.size(), 0.0f);
  std::vector<int32_t> ids(o.batch * o.seq);
  Rng rng(o.seed + 1);
  const double flops = TrainingFlops(c, m.registry, o.batch, o.seq);
  std::printf("model=%s (%.2f M parameters) batch=%lldx%lld threads=%d activations=%.0f MiB\n",
              m.source.c_str(), m.registry.layout.total() / 1e6, (long long)o.batch,
              (long long)o.seq, cpu::NumThreads(), engine.ActivationBytes() / 1048576.0);
  std::printf("Compute: %s\n", ComputeSummary(precision, cpu::NumThreads()).c_str());
  for (int64_t s = 0; s < o.steps; ++s) {
    for (auto& id : ids) id = 1 + static_cast<int32_t>(rng.Below(c.vocab_size - 1));
    const Batch batch{ids.data(), nullptr, ids.data(), o.batch, o.seq};
    const auto t0 = std::chrono::steady_clock::now();
    ForwardResult r = engine.Forward(params.data(), batch);
    engine.Backward(params.data(), grads.data(), batch, 1.0f / static_cast<float>(r.num_valid));
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("step %lld/%lld | loss=%.4f | step_time=%.3fs | tokens/s=%.1f | %.1f GFLOP/s\n",
                (long long)(s + 1), (long long)o.steps, r.Loss(), sec, o.batch * o.seq / sec,
                flops / sec / 1e9);
  }
  return Status::Ok();
}

}  // namespace

void RegisterStepCommand(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<StepOptions>();
  auto* cmd = app.add_subcommand(
      "step", "Forward + backward on random batches: loss, tokens/s, model FLOP/s");
  cmd->add_option("--model-id", o->model_id, "Preset or local HF model directory")
      ->capture_default_str();
  cmd->add_option("--batch-size", o->batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--seq-len", o->seq, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--steps", o->steps, "Steps to run")->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Compute threads (0: $OMP_NUM_THREADS, else the CPUs this process may use)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for the preset's initialisation and the batches")
      ->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "auto, bf16 or fp32: the matmuls' operands (auto: bf16 where its products are "
                  "the faster)")
      ->capture_default_str();
  cmd->callback([&ctx, o] {
    Status s = RunStep(*o);
    if (!s.ok()) ctx.exit_code = ReportError("step", s);
  });
}

}  // namespace st::cli
