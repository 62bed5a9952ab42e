// One optimizer step of a preference objective (DPO, ORPO) on every rank, and its held-out
// evaluation: the pairs of each micro-batch in one forward (train/objectives/objective.h's
// PairBatch), the reference's log-probs from the same engine with the LoRA adapters switched off
// (no second copy of the model, as TRL with PEFT), the objective's loss as per-token weights of
// the backward, then the step's common end (train_step.h's FinishStep).
// Collectives, the same on every rank: one all-reduce of the window's pair and token counts, per
// micro-batch the reference forward's (FsdpModel::Forward) then FsdpModel::ForwardBackward's,
// FinishStep's, and one all-reduce of the metrics.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "data/preference.h"
#include "train/objectives/objective.h"
#include "train/train_step.h"

namespace st {

// ref_table: the reference log-probs precomputed for every pair of `set` ([2 x pairs]: chosen,
// rejected), or null: computed each step with the adapters off.
StatusOr<StepResult> PreferenceTrainStep(const StepParts& parts, const Objective& objective,
                                         const PreferenceSet& set, std::span<const StepRows> micro,
                                         const BatchingOptions& batching, TrainState& state,
                                         const std::vector<float>* ref_table = nullptr);

// How an evaluation runs the model: a forward of the batch through the engine (FSDP's, or one
// process's table), after which the engine's TargetLogProbs are the batch's.
using PairForward = std::function<Status(const Batch&)>;

// The objective's metrics over the pairs of `rows` (this rank's batches; every rank calls it with
// its own and the same number), the loss first: what `eval_loss` and the eval_* metrics report.
// Sums are all-reduced over pg (null: one process). ref_table as for PreferenceTrainStep.
StatusOr<std::vector<double>> EvaluatePairs(Gemma4Engine& engine, const PairForward& forward,
                                            const Objective& objective, const PreferenceSet& set,
                                            const std::vector<StepRows>& rows,
                                            const BatchingOptions& batching, comm::ProcessGroup* pg,
                                            const comm::CollectiveOptions& collective,
                                            const std::vector<float>* ref_table = nullptr);

// The same over every pair of `set` once, each rank its share (FSDP).
StatusOr<std::vector<double>> PreferenceEvaluate(
    Gemma4Engine& engine, FsdpModel& fsdp, const Objective& objective, const PreferenceSet& set,
    const BatchingOptions& batching, comm::ProcessGroup& pg,
    const comm::CollectiveOptions& collective, const std::vector<float>* ref_table = nullptr);

// The reference's log-prob sums of every pair of `set`, [2 x pairs] (chosen, rejected), computed
// once (TRL's precompute_ref_log_probs): with LoRA the base (adapters off), otherwise the model
// as it is (call it before the first step). Each rank computes its share of the pairs, then one
// all-reduce gives every rank the whole table.
StatusOr<std::vector<float>> PrecomputeReferenceLogps(Gemma4Engine& engine, FsdpModel& fsdp,
                                                      const PreferenceSet& set,
                                                      const BatchingOptions& batching,
                                                      comm::ProcessGroup& pg,
                                                      const comm::CollectiveOptions& collective);

}  // namespace st
