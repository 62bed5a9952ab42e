// One optimizer step on one batch, on every rank: collate the rank's rows, forward and backward
// through FSDP, clip by the global norm when asked, the AdamW step, and the step's measurements
// gathered from every rank (step_metrics.h). Not the data order (data/batching.h), nor what is
// printed, observed or checkpointed after a step (the trainer's epoch loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "data/batching.h"
#include "model/gemma4.h"
#include "model/vision/image_encoder.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"
#include "train/step_metrics.h"
#include "train/train_state.h"
#include "train/vision_lora.h"

namespace st {

// The engine's view of a collated batch (no copy; tb must outlive it).
inline Batch BatchOf(const TokenBatch& tb) {
  Batch b{tb.input_ids.data(),
          tb.attention_mask.data(),
          tb.labels.data(),
          tb.B,
          tb.T,
          tb.position_ids.empty() ? nullptr : tb.position_ids.data()};
  if (tb.soft_token_rows > 0) {
    b.soft_tokens = tb.soft_tokens.data();
    b.num_soft_tokens = tb.soft_token_rows;
    b.soft_token_id = tb.soft_token_id;
  }
  return b;
}

// A vision model's soft tokens for the batch's images into tb (none: nothing to do); `saved`
// (a tower that trains) receives what its backward needs.
Status EncodeImages(const vision::ImageEncoder* encoder, TokenBatch& tb,
                    vision::VisionSaved* saved = nullptr);

// The LoRA dropout masks' seed of micro-batch k of the step after global_step on `rank`: they
// differ per step, micro-batch and rank, and are the same when a resumed run redoes a step.
inline uint64_t StepDropoutSeed(uint64_t seed, int64_t global_step, int rank, size_t k) {
  return (seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(global_step)) * 0x100000001b3ull +
         static_cast<uint64_t>(rank) + (static_cast<uint64_t>(k) << 32);
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
  // A vision model's processor and tower: the batches' images into soft tokens.
  const vision::ImageEncoder* images = nullptr;
  // LoRA on that tower (null: the tower is frozen): trained beside the text model.
  VisionLoraTrainer* vision_lora = nullptr;
};

struct StepResult {
  double loss = 0;          // the global batch's mean token loss
  double grad_norm = -1;    // the global norm when clipping, else -1 (SummariseStep sums grad_sq)
  int64_t real_tokens = 0;  // attention-mask ones of this rank's batch
  int64_t tokens = 0;       // positions of this rank's batch (B x T, padding included)
  std::vector<WorkerSample> samples;  // [world]: every rank's measurements of the step
  // A preference objective's metrics (TRL's names: rewards/chosen, ...), the global batch's.
  std::vector<std::pair<std::string, double>> objective_metrics;
  nlohmann::json completions;  // GRPO --log-completions (rank 0's; see StepMetrics)
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

// The end every kind of step shares, once the gradients are in the shards: clipping, the AdamW
// step (state.global_step advances; out.loss is added to the epoch's sum) and the step's
// measurements from every rank, timed from s0 (collation until s1) against the collective totals
// c0 and comm wait wait0 taken when the step began.
Status FinishStep(const StepParts& parts, std::chrono::steady_clock::time_point s0,
                  std::chrono::steady_clock::time_point s1, const comm::CollectiveTotals& c0,
                  double wait0, TrainState& state, StepResult& out);

}  // namespace st
