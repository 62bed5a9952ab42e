// One optimizer step of a preference objective (DPO, ORPO) on every rank, and its held-out
// evaluation: the pairs of each micro-batch in one forward (train/objectives/objective.h's
// PairBatch), the reference's log-probs from the same engine with the LoRA adapters switched off
// (no second copy of the model, as TRL with PEFT), the objective's loss as per-token weights of
// the backward, then the step's common end (train_step.h's FinishStep).
// Collectives, the same on every rank: one all-reduce of the window's pair and token counts, per
// micro-batch the reference forward's (FsdpModel::Forward) then FsdpModel::ForwardBackward's,
// FinishStep's, and one all-reduce of the metrics.
#pragma once

#include <span>
#include <vector>

#include "data/preference.h"
#include "train/objectives/objective.h"
#include "train/train_step.h"

namespace st {

StatusOr<StepResult> PreferenceTrainStep(const StepParts& parts, const Objective& objective,
                                         const PreferenceSet& set, std::span<const StepRows> micro,
                                         const BatchingOptions& batching, TrainState& state);

// The objective's metrics over every pair of `set` (each once; every rank calls it), the loss
// first: what `eval_loss` and the eval_* metrics report.
StatusOr<std::vector<double>> PreferenceEvaluate(Gemma4Engine& engine, FsdpModel& fsdp,
                                                 const Objective& objective,
                                                 const PreferenceSet& set,
                                                 const BatchingOptions& batching,
                                                 comm::ProcessGroup& pg,
                                                 const comm::CollectiveOptions& collective);

}  // namespace st
