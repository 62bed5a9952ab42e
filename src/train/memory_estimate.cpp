#include "train/memory_estimate.h"

#include <algorithm>
#include <cmath>

#include "model/frozen_weights.h"
#include "model/gemma4.h"

namespace st {

double WorkerMemoryEstimate::total() const {
  double sum = 0;
  for (const auto& [what, bytes] : terms) sum += bytes;
  return sum;
}

WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable, int world,
                                          int64_t batch, int64_t seq, bool layer_units) {
  const int64_t L = config.num_hidden_layers;
  const double W = std::max(1, world), f32 = sizeof(float);
  // FSDP's units (as FsdpModel builds them) and the frozen layer groups (as FrozenWeights).
  std::vector<double> unit(L + 1, 0), frozen_layer(L, 0);
  double frozen_root = 0, lookup = 0, largest_trained = 0;
  std::vector<bool> is_mlp(registry.layout.size(), false);
  for (const LayerParams& lp : registry.layers)
    for (int id : {lp.gate_proj, lp.up_proj, lp.down_proj}) is_mlp[id] = true;
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
  double shards = 0, largest_unit = 0;
  for (int64_t k = 0; k <= L; ++k) {
    shards += std::ceil(unit[k] / W);
    if (k > 0) largest_unit = std::max(largest_unit, unit[k]);
  }
  // A gathered unit: fp32 parameters and gradients, the bf16 receive buffer, the bf16 send and
  // fp32 reduce-scatter buffers of one shard.
  auto gathered = [&](double full) {
    return full * (2 * f32 + 2) + std::ceil(full / W) * (2 + f32);
  };
  const double largest_frozen_layer =
      frozen_layer.empty() ? 0 : *std::max_element(frozen_layer.begin(), frozen_layer.end());
  WorkerMemoryEstimate e;
  e.sharded_state = 4 * f32 * shards;
  e.gathered_units = gathered(unit[0]) + 2 * gathered(largest_unit);
  e.frozen_fp32 = f32 * (frozen_root + 2 * largest_frozen_layer);
  e.activations = EstimateActivationBytes(config, batch, seq);
  if (!trainable[registry.embed_tokens])  // the frozen head's block of weights and logits
    e.activations += f32 * static_cast<double>(kFrozenHeadBlock) *
                     static_cast<double>(config.hidden_size + batch * seq);
  e.checkpoint_writer = 2 * f32 * largest_trained;  // one tensor gathered, and its pieces
  e.frozen_lookup_elements = lookup;
  e.terms = {
      {"sharded fp32 master weights, gradients and 2 AdamW moments", e.sharded_state},
      {"gathered FSDP units (the root for the whole step, two layer slots)", e.gathered_units},
      {"frozen tensors converted to fp32 (outside the layers, two layers)", e.frozen_fp32},
      {"activations", e.activations},
      {"the checkpoint writer's largest tensor", e.checkpoint_writer},
  };
  std::stable_sort(e.terms.begin(), e.terms.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return e;
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
    advice = "lower --batch-size-per-device or --max-seq-len";
  else if (what.find("sharded") != std::string::npos || what.find("gathered") != std::string::npos)
    advice =
        "train fewer tensors (--freeze, e.g. '^(embed_tokens|layers\\.([0-9]|1[0-9]|2[0-9])\\.)' "
        "to train only the last layers) or shard over more hosts (the sharded state falls as "
        "1/workers)";
  else if (fit >= 1)
    advice = StrCat("at most ", fit,
                    " such worker(s) fit on this host: fewer workers here (--topology / "
                    "--num-workers), or more hosts");
  else
    advice = "even one worker does not fit: a smaller model, or a host with more memory";
  return ResourceExhausted(StrCat(line, ": ", advice));
}

}  // namespace st
