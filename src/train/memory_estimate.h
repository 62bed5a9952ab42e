// What one finetune worker will hold in memory, estimated from the model's parameter registry
// before anything is allocated, and the up-front refusal of a job whose local workers cannot fit
// in what the host gives. A lower bound of today's engine (fp32 load copy, checkpoint gather
// buffer, FSDP shards, replicated frozen tensors, gathered units, activations); not yet the full
// memory plan of docs/training.md (runtime overheads are not counted).
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
};

// One worker of `world` with a per-worker batch of `batch` x `seq` tokens.
WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable, int world,
                                          int64_t batch, int64_t seq);

// ResourceExhausted when `local_workers` such workers need more than `available_bytes` (0 =
// unknown: no check): one line naming the total, the largest term and what would shrink it.
Status CheckHostMemory(const WorkerMemoryEstimate& estimate, int local_workers,
                       size_t available_bytes, const std::string& model_id);

}  // namespace st
