// One optimizer step on one batch, on every rank: collate the rank's rows, forward and backward
// through FSDP, clip by the global norm when asked, the AdamW step, and the step's measurements
// gathered from every rank (step_metrics.h). Not the data order (data/batching.h), nor what is
// printed, observed or checkpointed after a step (the trainer's epoch loop).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "data/batching.h"
#include "model/gemma4.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"
#include "train/step_metrics.h"
#include "train/train_state.h"

namespace st {

// The engine's view of a collated batch (no copy; tb must outlive it).
inline Batch BatchOf(const TokenBatch& tb) {
  return Batch{tb.input_ids.data(),
               tb.attention_mask.data(),
               tb.labels.data(),
               tb.B,
               tb.T,
               tb.position_ids.empty() ? nullptr : tb.position_ids.data()};
}

// What a step works on; all of it outlives the step.
struct StepParts {
  Gemma4Engine& engine;
  FsdpModel& fsdp;
  const AdamWConfig& adam;
  double max_grad_norm;  // 0 = no clipping
  comm::ProcessGroup& pg;
  comm::CollectiveOptions collective;
  uint64_t seed = 0;  // the run's: with the step and the rank, the LoRA dropout masks' seed
  bool sync_each_batch = false;  // every micro-batch reduce-scatters (--sync-each-batch)
};

struct StepResult {
  double loss = 0;          // the global batch's mean token loss
  double grad_norm = -1;    // the global norm when clipping, else -1 (SummariseStep sums grad_sq)
  int64_t real_tokens = 0;  // attention-mask ones of this rank's batch
  int64_t tokens = 0;       // positions of this rank's batch (B x T, padding included)
  std::vector<WorkerSample> samples;  // [world]: every rank's measurements of the step
};

// Runs the step on `micro` (its micro-batches: one, or --gradient-accumulation-steps) of `set`,
// batched as `batching` says, and advances `state` (global_step, step_in_epoch,
// epoch_loss_sum). With several micro-batches the loss is the mean over all of their targets (one
// all-reduce of the count first) and only the last reduce-scatters, as transformers >= 4.46 and
// FSDP2's no-sync accumulate (every one with parts.sync_each_batch, adding into the shards).
// Collectives, the same on every rank: FsdpModel::ForwardBackward's, one all-reduce when clipping,
// then one all-gather of the samples after the optimizer step.
StatusOr<StepResult> TrainStep(const StepParts& parts, const TokenizedSet& set,
                               std::span<const StepRows> micro, const BatchingOptions& batching,
                               TrainState& state);

}  // namespace st
