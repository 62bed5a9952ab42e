#include "train/memory_estimate.h"

#include <algorithm>

#include "model/gemma4.h"

namespace st {

double WorkerMemoryEstimate::total() const {
  double sum = 0;
  for (const auto& [what, bytes] : terms) sum += bytes;
  return sum;
}

WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable, int world,
                                          int64_t batch, int64_t seq) {
  double total = 0, train = 0, frozen = 0, largest_layer = 0;
  for (int i = 0; i < registry.layout.size(); ++i) {
    const double n = static_cast<double>(registry.layout.entry(i).numel);
    total += n;
    (trainable[i] ? train : frozen) += n;
  }
  for (const LayerParams& l : registry.layers) {
    double n = 0;
    for (int id : {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj})
      if (id >= 0) n += static_cast<double>(registry.layout.entry(id).numel);
    largest_layer = std::max(largest_layer, n);
  }
  const double f32 = sizeof(float);
  WorkerMemoryEstimate e;
  e.terms = {
      {"the whole model in fp32, read by every worker at load", total * f32},
      {"the checkpoint gather buffer (the whole model in fp32)", total * f32},
      {"sharded fp32 master weights, gradients and 2 AdamW moments",
       4 * f32 * train / std::max(1, world)},
      {"frozen tensors replicated in fp32", frozen * f32},
      // Two prefetch slots and the root unit, parameters and gradients each.
      {"gathered FSDP units", 2 * 2 * f32 * largest_layer},
      {"activations", EstimateActivationBytes(config, batch, seq)},
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
  else if (fit >= 1)
    advice = StrCat("at most ", fit,
                    " such worker(s) fit on this host: fewer workers here (--topology / "
                    "--num-workers), or more hosts");
  else
    advice =
        "even one worker does not fit: a smaller model, or a host with more memory (until "
        "sharded loading lands, every worker reads the whole model in fp32)";
  return ResourceExhausted(StrCat(line, ": ", advice));
}

}  // namespace st
