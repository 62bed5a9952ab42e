// The memory plan of a finetune job: what one worker will hold, estimated from the model's
// parameter registry and the engine's activation plan before anything is allocated, the host's
// total against what the host gives, and the up-front refusal of a job that cannot fit. Counts what
// the sharded load leaves on a rank: its FSDP shards (fp32 master weights, gradients, 2 AdamW
// moments), the gathered units (the root for the whole step, two prefetch slots), the frozen
// tensors converted to fp32 (outside the layers, two layer slots), the activations the chosen
// checkpointing keeps, the workspace (attention blocks, loss tiles, the frozen head's block, the
// checkpoint writer's tensor) and the runtime (binary, libraries, thread stacks, BLAS and
// communication buffers). Per host: the memory-mapped frozen tensors (page cache, shared by the
// host's workers and reclaimable).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/gemma4.h"
#include "model/params.h"

namespace st {

class WeightSource;

// What a worker holds besides the terms counted here: the binary and its libraries, OpenMP/OpenBLAS
// thread buffers, the data set and tokenizer, the collectives' buffers, pages of a mapped
// checkpoint it touched. A constant, not a model: it differs by workload (a gemma4-tiny or
// gemma4-small worker holds 20-100 MiB less than the plan, a worker of the 4-layer E2B-width model
// in tests/test_host.cpp about 90 MiB more; docs/install.md, "Memory"), and 96 MiB keeps every
// measured case within 7 %.
constexpr double kWorkerRuntimeBytes = 96.0 * (1 << 20);

struct WorkerMemoryEstimate {
  std::vector<std::pair<std::string, double>> terms;  // (what, bytes), largest first
  double total() const;
  // Bytes of each part, for reports (the same figures as the terms).
  double params = 0, grads = 0, optimizer = 0, gathered_units = 0, frozen_fp32 = 0, activations = 0,
         workspace = 0, runtime = kWorkerRuntimeBytes;
  double accumulation = 0;  // --gradient-accumulation-steps > 1: unsharded gradients
  double rollout = 0;       // GRPO's sampler (WorkerShape::rollout_bytes)
  double vision = 0;        // the vision tower (WorkerShape::vision_bytes)
  double reference = 0;     // GRPO's reference shard (WorkerShape::reference_shards)
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  // Frozen elements never copied (the per-layer table when frozen): read from the checkpoint's
  // mapped files, or generated for a preset.
  double frozen_lookup_elements = 0;
};

struct WorkerShape {
  int world = 1;  // workers of the job
  int64_t batch = 1, seq = 1;
  bool layer_units = false;  // FSDP units are whole decoder layers (--fsdp-units layer)
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  int threads = 1;  // compute threads per worker (the attention workspace is per thread)
  // The weights are generated (a preset), not read from files: small frozen layers are kept.
  bool generated_weights = false;
  // --gradient-accumulation-steps: above 1, every unit's unsharded gradient is kept between the
  // micro-batches (FsdpModel::Micro); 1 with --sync-each-batch, which keeps none.
  int64_t accumulation = 1;
  // --precision as resolved: bf16 adds the bf16 copies of the largest product's operands.
  Precision precision = Precision::kFp32;
  // GRPO's sampler, held while a round is generated: the policy's weights for the decoder
  // (DecodeWeights::Bytes, adapters merged), the gathered trainable tensors they are built from
  // and the decoder's KV cache and scratch for the sequences in flight (the caller's sum; 0 for
  // other objectives).
  double rollout_bytes = 0;
  // A multimodal model's vision tower once a batch has an image (vision::TowerWorkingBytes; 0 for
  // a text model or an objective that reads no images).
  double vision_bytes = 0;
  // GRPO with --beta > 0 on moving trained tensors keeps the starting fp32 shard as the KL
  // reference (GrpoKeepsReferenceShards): one more parameters' shard.
  bool reference_shards = false;
};

// One worker of shape.world with a per-worker batch of shape.batch x shape.seq tokens.
WorkerMemoryEstimate EstimateWorkerMemory(const Gemma4Config& config, const ParamRegistry& registry,
                                          const std::vector<bool>& trainable,
                                          const WorkerShape& shape);

// --activation-checkpointing auto: the least recomputation (none, then mlp, then layer) whose
// `local_workers` workers fit in available_bytes (0 = unknown: none); layer when nothing fits (the
// host check then refuses with the largest term).
ActivationCheckpointing ChooseCheckpointing(const Gemma4Config& config,
                                            const ParamRegistry& registry,
                                            const std::vector<bool>& trainable, WorkerShape shape,
                                            int local_workers, size_t available_bytes);

// ResourceExhausted when `local_workers` such workers need more than `available_bytes` (0 =
// unknown: no check): one line naming the total, the largest term and what would shrink it.
Status CheckHostMemory(const WorkerMemoryEstimate& estimate, int local_workers,
                       size_t available_bytes, const std::string& model_id);

// Bytes of the frozen tensors left in a checkpoint's memory-mapped files (0 for a preset, which
// generates them).
double MappedFrozenBytes(const WeightSource& weights, const ParamRegistry& registry,
                         const std::vector<bool>& trainable);

// The plan as `finetune --dry-run` and `info` print it: each term per worker, the host's workers
// and shared maps against what the host has available.
std::string FormatMemoryPlan(const WorkerMemoryEstimate& estimate, const WorkerShape& shape,
                             int local_workers, double mapped_bytes, size_t available_bytes);

}  // namespace st
