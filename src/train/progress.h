// Rank 0's account of a run, for people and tools: the seed's printed lines (set-up, one per
// epoch, the final ones), the --progress bar or lines, and the TrainingObserver's callbacks.
// Not measurement (train_step.h, step_metrics.h) and never a collective, so reporting cannot
// change what the ranks exchange. On other ranks it prints nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "train/step_metrics.h"
#include "train/train_state.h"
#include "train/train_step.h"

namespace st {

// What the set-up lines say about the data and the model.
struct SetupSummary {
  std::string data;  // DatasetReport::Summary()
  int64_t examples = 0, max_seq_len = 0, truncated = 0, steps_per_epoch = 0;
  int64_t tokens = 0, split = 0;  // the examples' tokens; examples split into pieces
  int64_t untrained = 0;          // examples (pieces) without a target (e.g. answer truncated)
  // "template gemma-chat, loss on responses; packed into rows of 512 tokens"
  std::string layout;
  int world = 1;
  int64_t batch_size_per_device = 0;
  int64_t accumulation = 1;      // micro-batches per optimizer step
  bool sync_each_batch = false;  // each micro-batch reduce-scatters (--sync-each-batch)
  double lr = 0;
  std::string lr_schedule;  // LrSchedule::Describe()
  int64_t trainable_parameters = 0, frozen_parameters = 0;
  // A LoRA run's adapters, as PEFT's print_trainable_parameters would summarise them:
  // "LoRA r=16, alpha=32 (scaling 2) on 70 modules (q_proj,v_proj)"; "" for full fine-tuning.
  std::string adapters;
  // A multimodal model: what each part trains, "Parts: text 191133 parameters (41280 trainable);
  // vision tower 12345 + projection 768 frozen (...); audio tower not read"; "" for a text model.
  std::string parts;
  // "precision=bf16 (AVX512-BF16 bf16 matmuls, fp32 master weights), CPU AMD EPYC 9B14, 1
  // thread per worker" (ComputeSummary).
  std::string compute;
  // A preference run: examples are pairs (two sequences of up to max_seq_len each); pairs
  // dropped because the prompt fills max_seq_len; the objective ("dpo (sigmoid, beta 0.1; ...)").
  bool pairs = false;
  int64_t dropped = 0;
  std::string objective;
};

// The compute line's text for a run in precision p with `threads` threads per worker.
std::string ComputeSummary(Precision p, int threads);

// The end-of-run memory line's figures, per worker.
struct MemoryReport {
  size_t sharded_bytes = 0, frozen_bytes = 0, activation_bytes = 0;
  float peak_rss_mib = 0;              // max over ranks
  const char* checkpointing = "none";  // --activation-checkpointing as resolved
};

class ProgressReporter {
 public:
  // mode: --progress once the CLI has resolved auto (bar | lines | off); observer: may be null.
  ProgressReporter(int rank, std::string mode, int64_t num_epochs, TrainingObserver* observer);

  // "Setting up process group ..." and "Data: ...".
  void Setup(const SetupSummary& setup) const;
  // Once the run's starting state is known: says when nothing is left to do, then the observer's
  // OnStart. Keeps the run's tokens per step and trainable parameters for Step.
  void Start(const RunInfo& run);
  // After each step: the bar or line, and the observer's step record. `steps_run`: steps of this
  // epoch run since it (re)started, over `elapsed_s`.
  void Step(const TrainState& state, int64_t steps_in_epoch, int64_t steps_run, double elapsed_s,
            double lr, StepResult step);
  // The seed's "Epoch E/N | loss=..." line and the observer's epoch record.
  void Epoch(EpochMetrics epoch);
  // An evaluation: its own line unless it is the epoch's (the epoch line shows that one), and the
  // observer.
  void Eval(EvalMetrics eval, bool at_epoch_end);
  // --sample-prompts: each answer on a line of its own, and the observer.
  void Samples(const SampleMetrics& samples) const;
  // The memory line, the seed's final metrics (the last epoch's) and the kept checkpoint.
  void Finish(const MemoryReport& memory, const std::string& best_checkpoint) const;

 private:
  int rank_;
  std::string mode_;
  int64_t num_epochs_;
  TrainingObserver* observer_;
  int64_t tokens_per_step_ = 0, trainable_parameters_ = 0;
  // A preference objective's metrics summed over the epoch's steps so far (rank 0).
  std::vector<std::pair<std::string, double>> objective_sums_;
  int64_t objective_steps_ = 0;
  double epoch_tokens_ = 0;    // rank 0: positions computed by all ranks in this epoch so far
  std::string final_metrics_;  // the seed's dict of the last epoch
};

}  // namespace st
