// What one finetune worker will hold in memory, estimated from the model's parameter registry
// before anything is allocated, and the up-front refusal of a job whose local workers cannot fit
// in what the host gives. Counts what the sharded load leaves on a rank: its FSDP shards (fp32
// master weights, gradients, 2 AdamW moments), the gathered units (the root for the whole step,
// two prefetch slots), the frozen tensors converted to fp32 (outside the layers, two layer slots),
// the checkpoint writer's one tensor and the activations. Not counted: the memory-mapped frozen
// tensors (page cache, shared by the host's workers and reclaimable) and runtime overheads.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/params.h"

namespace st {

struct WorkerMemoryEstimate {
  std::vector<std::pair<std::string, double>> terms;  // (what, bytes), largest first
  double total() const;
  // Bytes of each part, for reports (the same figures as the terms).
  double sharded_state = 0, gathered_units = 0, frozen_fp32 = 0, activations = 0,
         checkpoint_writer = 0;
  // Frozen elements never copied (the per-layer table when frozen): read from the checkpoint's
  // mapped files, or generated for a preset.
  double frozen_lookup_elements = 0;
};

// One worker of `world` with a per-worker batch of `batch` x `seq` tokens; layer_units: FSDP units
// are whole decoder layers (--fsdp-units layer), else each layer's MLP (the seed's).
WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable, int world,
                                          int64_t batch, int64_t seq, bool layer_units = false);

// ResourceExhausted when `local_workers` such workers need more than `available_bytes` (0 =
// unknown: no check): one line naming the total, the largest term and what would shrink it.
Status CheckHostMemory(const WorkerMemoryEstimate& estimate, int local_workers,
                       size_t available_bytes, const std::string& model_id);

}  // namespace st
