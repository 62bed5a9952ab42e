#include "train/memory_estimate.h"

#include <algorithm>
#include <cmath>

#include "model/frozen_weights.h"
#include "model/gemma4.h"
#include "model/weights.h"

namespace st {

double WorkerMemoryEstimate::total() const {
  double sum = 0;
  for (const auto& [what, bytes] : terms) sum += bytes;
  return sum;
}

WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable,
                                          const WorkerShape& shape) {
  const int64_t L = config.num_hidden_layers;
  const bool layer_units = shape.layer_units;
  const double W = std::max(1, shape.world), f32 = sizeof(float);
  // FSDP's units (as FsdpModel builds them) and the frozen layer groups (as FrozenWeights).
  std::vector<double> unit(L + 1, 0), frozen_layer(L, 0);
  double frozen_root = 0, lookup = 0, largest_trained = 0;
  std::vector<bool> is_mlp(registry.layout.size(), false);
  for (const LayerParams& lp : registry.layers)
    for (int id : {lp.gate_proj, lp.up_proj, lp.down_proj})
      for (int e : {id, registry.lora_a[id], registry.lora_b[id]})
        if (e >= 0) is_mlp[e] = true;
  for (int i = 0; i < registry.layout.size(); ++i) {
    const ArenaEntry& e = registry.layout.entry(i);
    const double n = static_cast<double>(e.numel);
    const int64_t layer = LayerOfName(e.name);
    if (trainable[i]) {
      const bool own_unit = layer >= 0 && (layer_units || is_mlp[i]);
      unit[own_unit ? layer + 1 : 0] += static_cast<double>(AlignElements(e.numel));
      largest_trained = std::max(largest_trained, n);
    } else if (IsLookupOnly(registry, i)) {
      lookup += n;
    } else if (layer >= 0) {
      frozen_layer[layer] += static_cast<double>(AlignElements(e.numel));
    } else {
      frozen_root += static_cast<double>(AlignElements(e.numel));
    }
  }
  // Layer l's unit and its frozen tensors go to slot l % 2 (FsdpModel, FrozenWeights): a slot's
  // buffers are mapped for the largest of all, but only the pages of the largest it ever holds
  // are touched (a slot that no layer uses costs nothing).
  double shards = std::ceil(unit[0] / W), unit_slot[2] = {0, 0}, frozen_slot[2] = {0, 0};
  for (int64_t l = 0; l < L; ++l) {
    shards += std::ceil(unit[l + 1] / W);
    unit_slot[l % 2] = std::max(unit_slot[l % 2], unit[l + 1]);
    frozen_slot[l % 2] = std::max(frozen_slot[l % 2], frozen_layer[l]);
  }
  // A gathered unit: fp32 parameters and gradients, the bf16 receive buffer, the bf16 send and
  // fp32 reduce-scatter buffers of one shard.
  auto gathered = [&](double full) {
    return full * (2 * f32 + 2) + std::ceil(full / W) * (2 + f32);
  };
  WorkerMemoryEstimate e;
  e.checkpointing = shape.checkpointing;
  e.params = e.grads = f32 * shards;
  e.optimizer = 2 * f32 * shards;
  e.gathered_units = gathered(unit[0]) + gathered(unit_slot[0]) + gathered(unit_slot[1]);
  double frozen_layers = 0;
  for (double b : frozen_layer) frozen_layers += b;
  e.frozen_fp32 =
      f32 * (frozen_root + (KeepsAllFrozenLayers(shape.generated_weights, f32 * frozen_layers)
                                ? frozen_layers
                                : frozen_slot[0] + frozen_slot[1]));
  EngineOptions engine;
  engine.checkpointing = shape.checkpointing;
  engine.lora = LoraSpecOf(registry);
  engine.precision = shape.precision;
  const double engine_bytes =
      EstimateActivationBytes(config, shape.batch, shape.seq, engine, shape.threads);
  e.workspace = EstimateWorkspaceBytes(config, shape.batch, shape.seq, engine, shape.threads);
  e.activations = engine_bytes - e.workspace;
  if (!trainable[registry.embed_tokens]) e.workspace += FrozenHeadBytes(config);
  // The checkpoint writer: one trained tensor gathered (FsdpModel::GatherTensor's receive buffer
  // and this rank's piece) and assembled for the file.
  e.workspace += (2 + 1 / W) * f32 * largest_trained;
  e.frozen_lookup_elements = lookup;
  if (shape.accumulation > 1)
    for (double u : unit) e.accumulation += f32 * u;
  e.terms = {
      {"sharded fp32 parameters", e.params},
      {"sharded gradients", e.grads},
      {"sharded AdamW state (2 moments)", e.optimizer},
      {"gathered FSDP units (the root for the whole step, two layer slots)", e.gathered_units},
      {"frozen tensors converted to fp32 (outside the layers, two layers)", e.frozen_fp32},
      {StrCat("activations (--activation-checkpointing ",
              ActivationCheckpointingName(shape.checkpointing), ")"),
       e.activations},
      {shape.precision == Precision::kBf16
           ? "workspace (attention blocks, loss tiles, bf16 matmul operands, frozen head block, "
             "checkpoint writer)"
           : "workspace (attention blocks, loss tiles, frozen head block, checkpoint writer)",
       e.workspace},
      {"runtime (binary, libraries, thread and communication buffers)", e.runtime},
  };
  if (e.accumulation > 0)
    e.terms.push_back(
        {"gradient accumulation (every unit's unsharded fp32 gradient)", e.accumulation});
  e.rollout = shape.rollout_bytes;
  if (e.rollout > 0)
    e.terms.push_back(
        {"GRPO sampler (the policy's weights for decoding, the batch's KV cache)", e.rollout});
  e.reference = shape.reference_shards ? e.params : 0;
  if (e.reference > 0)
    e.terms.push_back({"GRPO reference (the starting fp32 shard, --beta > 0)", e.reference});
  e.vision = shape.vision_bytes;
  if (e.vision > 0)
    e.terms.push_back(
        {"vision tower (fp32 weights, its adapters, saved values or the soft-token "
         "cache; held once a batch has an image)",
         e.vision});
  std::stable_sort(e.terms.begin(), e.terms.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return e;
}

ActivationCheckpointing ChooseCheckpointing(const Gemma4Config& config,
                                            const ParamRegistry& registry,
                                            const std::vector<bool>& trainable, WorkerShape shape,
                                            int local_workers, size_t available_bytes) {
  if (available_bytes == 0) return ActivationCheckpointing::kNone;
  for (ActivationCheckpointing c : {ActivationCheckpointing::kNone, ActivationCheckpointing::kMlp,
                                    ActivationCheckpointing::kLayer}) {
    shape.checkpointing = c;
    const WorkerMemoryEstimate e = EstimateWorkerMemory(config, registry, trainable, shape);
    if (e.total() * std::max(1, local_workers) <= static_cast<double>(available_bytes)) return c;
  }
  return ActivationCheckpointing::kLayer;
}

Status CheckHostMemory(const WorkerMemoryEstimate& estimate, int local_workers,
                       size_t available_bytes, const std::string& model_id) {
  const double need = estimate.total() * std::max(1, local_workers);
  if (available_bytes == 0 || need <= static_cast<double>(available_bytes)) return Status::Ok();
  const double gib = 1 << 30;
  const auto& [what, bytes] = estimate.terms.front();
  char line[512];
  std::snprintf(line, sizeof(line),
                "%s does not fit: %d local worker(s) need at least %.1f GiB (%.1f GiB each), this "
                "host has %.1f GiB available; the largest part is %s (%.1f GiB per worker)",
                model_id.c_str(), local_workers, need / gib, estimate.total() / gib,
                static_cast<double>(available_bytes) / gib, what.c_str(), bytes / gib);
  const int fit = static_cast<int>(static_cast<double>(available_bytes) / estimate.total());
  std::string advice;
  if (what.find("activations") != std::string::npos)
    advice = estimate.checkpointing == ActivationCheckpointing::kLayer
                 ? "lower --batch-size-per-device or --max-seq-len"
                 : "keep fewer activations (--activation-checkpointing layer), or lower "
                   "--batch-size-per-device or --max-seq-len";
  else if (what.find("accumulation") != std::string::npos)
    advice =
        "reduce-scatter every micro-batch instead of keeping unsharded gradients "
        "(--sync-each-batch), or fewer --gradient-accumulation-steps";
  else if (what.find("GRPO sampler") != std::string::npos)
    advice =
        "decode fewer sequences together (lower --batch-size-per-device or "
        "--gradient-accumulation-steps), shorter completions (--max-completion-length), or "
        "bf16 weights for sampling (--precision bf16)";
  else if (what.find("GRPO reference") != std::string::npos)
    advice =
        "take the KL term's reference from the base with adapters (--lora-rank 16), or drop it "
        "(--beta 0, TRL's default), or shard over more hosts";
  else if (what.find("vision tower") != std::string::npos)
    advice =
        "fewer image tokens a step (lower --max-seq-len or --batch-size-per-device), or train the "
        "text model only (LoRA targets without the tower's linears)";
  else if (what.find("workspace") != std::string::npos)
    advice = "lower --batch-size-per-device or --max-seq-len, or fewer --threads";
  else if (what.find("sharded") != std::string::npos || what.find("gathered") != std::string::npos)
    advice =
        "train adapters on a frozen base (--lora-rank 16), or fewer tensors (--freeze, e.g. "
        "'^(embed_tokens|layers\\.([0-9]|1[0-9]|2[0-9])\\.)' to train only the last layers), or "
        "shard over more hosts (the sharded state falls as 1/workers)";
  else if (fit >= 1)
    advice = StrCat("at most ", fit,
                    " such worker(s) fit on this host: fewer workers here (--topology / "
                    "--num-workers), or more hosts");
  else
    advice = "even one worker does not fit: a smaller model, or a host with more memory";
  return ResourceExhausted(StrCat(line, ": ", advice));
}

}  // namespace st

namespace st {

double MappedFrozenBytes(const WeightSource& weights, const ParamRegistry& registry,
                         const std::vector<bool>& trainable) {
  double mapped = 0;
  for (int i = 0; i < registry.layout.size(); ++i)
    if (!trainable[i])
      if (auto stored = weights.StoredBytes(i)) mapped += static_cast<double>(stored->bytes);
  return mapped;
}

std::string FormatMemoryPlan(const WorkerMemoryEstimate& e, const WorkerShape& shape,
                             int local_workers, double mapped_bytes, size_t available_bytes) {
  const double mib = 1 << 20;
  std::string out =
      StrCat("memory plan per worker of ", shape.world, " (batch ", shape.batch, " x ", shape.seq,
             " tokens, --fsdp-units ", shape.layer_units ? "layer" : "mlp",
             ", --activation-checkpointing ", ActivationCheckpointingName(e.checkpointing), ", ",
             shape.threads, " thread(s)):\n");
  char line[256];
  auto row = [&](const char* what, double bytes) {
    std::snprintf(line, sizeof(line), "  %-34s %12.1f MiB\n", what, bytes / mib);
    out += line;
  };
  row("parameters (fp32 shard)", e.params);
  row("gradients (fp32 shard)", e.grads);
  row("optimizer state (2 moments)", e.optimizer);
  row("gathered units", e.gathered_units);
  if (e.accumulation > 0) row("gradient accumulation (unsharded)", e.accumulation);
  if (e.rollout > 0) row("GRPO sampler (weights, KV cache)", e.rollout);
  if (e.reference > 0) row("GRPO reference (fp32 shard)", e.reference);
  row("frozen tensors in fp32", e.frozen_fp32);
  if (e.vision > 0) row("vision tower (with images)", e.vision);
  row("activations", e.activations);
  row("workspace", e.workspace);
  row("runtime", e.runtime);
  row("total", e.total());
  const double host = e.total() * std::max(1, local_workers) + mapped_bytes;
  std::snprintf(line, sizeof(line),
                "per host: %d worker(s) x %.1f MiB + frozen maps %.1f MiB (memory-mapped, shared) "
                "= %.1f MiB",
                std::max(1, local_workers), e.total() / mib, mapped_bytes / mib, host / mib);
  out += line;
  if (available_bytes > 0) {
    std::snprintf(line, sizeof(line), " of %.1f MiB available: %s\n",
                  static_cast<double>(available_bytes) / mib,
                  e.total() * std::max(1, local_workers) <= static_cast<double>(available_bytes)
                      ? "fits"
                      : "does not fit");
    out += line;
  } else {
    out += " (available memory unknown)\n";
  }
  return out;
}

}  // namespace st
