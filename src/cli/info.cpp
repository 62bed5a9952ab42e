// `slicetrain info`: what a model is (config, layer table, parameter counts) and what a fine-tuning
// job of it costs per worker, without reading its weights (a model directory's safetensors
// headers only).
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "io/model_loader.h"
#include "kernels/cpu/cpu_features.h"
#include "launch/resources.h"
#include "model/config.h"
#include "model/frozen_weights.h"
#include "model/params.h"
#include "train/memory_estimate.h"
#include "train/trainable.h"

namespace st::cli {

namespace {

struct InfoArgs {
  std::string model_id = "gemma4-tiny";
  int num_workers = 2;
  std::string freeze = "^embed_tokens_per_layer";
  std::string fsdp_units = "mlp";
  int64_t batch_size = 4, max_seq_len = 64;
  std::string activation_checkpointing = "none";
  int threads = 1;
  std::string precision = "auto";
};

double MiB(double bytes) {
  return bytes / 1048576.0;
}

Status Run(const InfoArgs& a) {
  if (a.num_workers < 1 || a.batch_size < 1 || a.max_seq_len < 2)
    return InvalidArgument(
        "--num-workers and --batch-size-per-device must be >= 1, --max-seq-len >= 2");
  if (a.fsdp_units != "mlp" && a.fsdp_units != "layer")
    return InvalidArgument("--fsdp-units must be 'mlp' or 'layer', got '" + a.fsdp_units + "'");
  ST_ASSIGN_OR_RETURN(std::string model_id, ResolveModelSource(a.model_id, HubFromEnvironment()));
  // A directory's weights are mapped and their headers checked, never read.
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(model_id, 42, /*verify_checksums=*/false));
  const Gemma4Config& c = m.config;
  const ParamRegistry& reg = m.registry;
  ST_ASSIGN_OR_RETURN(const Trainable trainable, TrainableTensors(reg, a.freeze));
  int64_t total = 0, ple = 0;
  for (int i = 0; i < reg.layout.size(); ++i) {
    total += reg.layout.entry(i).numel;
    if (i == reg.embed_tokens_per_layer) ple = reg.layout.entry(i).numel;
  }
  std::printf("model: %s (%s)\n", m.source.c_str(), c.model_type.c_str());
  std::printf(
      "vocab=%lld hidden=%lld layers=%lld heads=%lld kv_heads=%lld head_dim=%lld/%lld "
      "ple_dim=%lld sliding_window=%lld softcap=%.1f\n",
      (long long)c.vocab_size, (long long)c.hidden_size, (long long)c.num_hidden_layers,
      (long long)c.num_attention_heads, (long long)c.num_key_value_heads, (long long)c.head_dim,
      (long long)c.global_head_dim, (long long)c.hidden_size_per_layer_input,
      (long long)c.sliding_window, c.final_logit_softcapping);
  std::printf("layer  type     head_dim  kv_heads  mlp_width  kv_source\n");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    std::printf("%5lld  %-7s  %8lld  %8lld  %9lld  %9lld\n", (long long)i,
                c.layer_types[i] == LayerType::kFull ? "full" : "sliding", (long long)c.HeadDim(i),
                (long long)c.KvHeads(i), (long long)c.MlpWidth(i), (long long)c.KvSourceLayer(i));
  std::printf(
      "parameters: %.3f M total, %.3f M in the per-layer embedding table, %.3f M in "
      "matrix products; fp32 weights %.1f MiB\n",
      total / 1e6, ple / 1e6, reg.MatmulParams() / 1e6, total * 4.0 / (1 << 20));
  if (m.report.file_bytes > 0)
    std::printf(
        "on disk: %.1f MiB in weight files (%.1f MiB of them this model's tensors, %s; "
        "%lld other tensors never read)\n",
        MiB(static_cast<double>(m.report.file_bytes)),
        MiB(static_cast<double>(m.report.model_bytes)), DTypeName(m.weights->dtype()),
        (long long)m.report.tensors_ignored);
  std::printf("trainable: %.3f M, frozen: %.3f M (--freeze '%s')\n",
              (total - trainable.frozen) / 1e6, trainable.frozen / 1e6, a.freeze.c_str());
  WorkerShape shape;
  shape.world = a.num_workers;
  shape.batch = a.batch_size;
  shape.seq = a.max_seq_len;
  shape.layer_units = a.fsdp_units == "layer";
  ST_ASSIGN_OR_RETURN(shape.checkpointing,
                      ParseActivationCheckpointing(a.activation_checkpointing));
  shape.threads = std::max(1, a.threads);
  std::string why;
  ST_ASSIGN_OR_RETURN(shape.precision, cpu::ResolvePrecision(a.precision, &why));
  const cpu::CpuFeatures& cpu = cpu::DetectCpu();
  std::printf(
      "compute: precision=%s (%s); CPU %s [%s], fp32 matmuls: OpenBLAS %s kernels, bf16 "
      "matmuls: %s, kernels: %s\n",
      PrecisionName(shape.precision), why.c_str(),
      cpu.model.empty() ? "unknown" : cpu.model.c_str(), cpu::IsaName(cpu),
      cpu::BlasCoreName().c_str(), cpu::Bf16GemmIsa(), cpu::KernelIsaName(cpu::ActiveKernelIsa()));
  shape.generated_weights = m.weights->Generated();
  const WorkerMemoryEstimate e = EstimateWorkerMemory(c, reg, trainable.mask, shape);
  // Frozen bytes left in the mapped files (a preset generates them instead).
  const double mapped = MappedFrozenBytes(*m.weights, reg, trainable.mask);
  // The host line as if every worker ran on this host.
  std::printf(
      "%s",
      FormatMemoryPlan(e, shape, a.num_workers, mapped, launch::AvailableMemoryBytes()).c_str());
  return Status::Ok();
}

}  // namespace

void RegisterInfoCommand(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<InfoArgs>();
  auto* cmd = app.add_subcommand(
      "info", "Describe a model: config, layers, parameter counts, bytes per worker");
  cmd->add_option("--model-id", a->model_id,
                  "Preset (gemma4-tiny, gemma4-small, gemma4-e2b), model directory or hub id")
      ->capture_default_str();
  cmd->add_option("--num-workers", a->num_workers, "Workers the job shards over")
      ->capture_default_str();
  cmd->add_option("--freeze", a->freeze, "Regex of frozen tensor names, as finetune takes it")
      ->capture_default_str();
  cmd->add_option("--fsdp-units", a->fsdp_units, "mlp or layer, as finetune takes it")
      ->capture_default_str();
  cmd->add_option("--batch-size-per-device", a->batch_size, "Sequences per worker per step")
      ->capture_default_str();
  cmd->add_option("--max-seq-len", a->max_seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--activation-checkpointing", a->activation_checkpointing,
                  "none, mlp or layer, as finetune takes it")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads per worker (attention workspace)")
      ->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "auto, bf16 or fp32, as finetune takes it (bf16 adds its operand copies)")
      ->capture_default_str();
  cmd->callback([&ctx, a] {
    Status st = Run(*a);
    if (!st.ok()) ctx.exit_code = ReportError("info", st);
  });
}

}  // namespace st::cli
