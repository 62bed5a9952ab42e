// The run's checkpointer, one per rank: writes a checkpoint of the training state (every rank its
// shard, rank 0 the model and the JSON files), keeps the best --num-to-keep by the score plus the
// newest, and finds where a resume starts (the newest checkpoint every rank can read).
// Not the checkpoint format (checkpoint.h) and not when to write one (the trainer's epoch loop).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "parallel/fsdp.h"
#include "train/checkpoint.h"
#include "train/step_metrics.h"
#include "train/train_state.h"
#include "train/vision_lora.h"

namespace st {

struct CheckpointerOptions {
  std::string run_dir;        // <storage>/<run name>
  std::string tokenizer_dir;  // its tokenizer files are copied beside the model
  int64_t steps_per_epoch = 0;
  // Retention (Ray's CheckpointConfig): the best num_to_keep by the score attribute of
  // trainer_state.json (loss, epoch, epoch_time_s, tokens_per_s), lowest first when
  // lower_is_better.
  int num_to_keep = 1;
  std::string score_attribute = "loss";
  bool lower_is_better = true;
  // The Hugging Face model's dtype and file size limit (--save-dtype, --max-shard-size).
  HfExportOptions export_options;
  // A LoRA run: each checkpoint is a PEFT adapter directory (adapter_config.json and
  // adapter_model.safetensors in adapter_dtype) instead of a model.
  std::optional<PeftAdapterConfig> adapter;
  DType adapter_dtype = DType::kF32;
  // A trained vision tower's adapters (the same on every rank): in the adapter, and their AdamW
  // state beside the shards (kVisionLoraStateFile) for a resume.
  VisionLoraTrainer* vision_lora = nullptr;
  // Fields added to every trainer_state.json (seed, model_id, fsdp_units, dataset_split).
  nlohmann::json run_state = nlohmann::json::object();
};

class Checkpointer {
 public:
  // `model` (its config and registry) and `fsdp` must outlive the checkpointer.
  Checkpointer(CheckpointerOptions options, const LoadedModel& model, FsdpModel& fsdp,
               comm::ProcessGroup& pg, const comm::CollectiveOptions& collective);

  // Every rank: the state of the newest checkpoint of the run that every rank could load its shard
  // of (one all-reduce(min) per candidate tried), with the FSDP shards loaded from it. None usable:
  // an error when `required` (--resume), else the state of a fresh start (a restart before the
  // first checkpoint).
  StatusOr<TrainState> Resume(bool required);

  // Every rank: a checkpoint of `state`, at an epoch's end (state already counts the epoch, with
  // step_in_epoch 0), ranked by `epoch`'s figures, or inside an epoch (a --save-steps restart
  // point, replaced by the next checkpoint). Collectives: a barrier, one all-gather per trained
  // tensor (WriteHfModel), a barrier.
  Status SaveEpoch(const TrainState& state, const EpochMetrics& epoch);
  Status SaveInsideEpoch(const TrainState& state);

  // Rank 0: the front of the kept list (the best after an epoch checkpoint; the newest after a
  // resume with nothing left to do); "" when there is none.
  std::string BestPath() const;
  // Rank 0: the checkpoint this rank wrote last ("" before the first).
  const std::string& LastSavedPath() const { return last_saved_; }

 private:
  struct Kept {
    std::string path;
    double score;
    bool inside_epoch = false;  // a --save-steps checkpoint: kept only until the next checkpoint
  };
  Status Save(const TrainState& state, const std::string& metrics_json, nlohmann::json fields);
  // Rank 0, after committing `dir`: drops the previous inside-epoch checkpoint, then, for an epoch
  // checkpoint, all but the best num_to_keep and `dir`.
  void Retain(const std::string& dir, double score, bool inside_epoch);
  void PrintResumed(const std::string& dir, const TrainState& state) const;

  CheckpointerOptions options_;
  const LoadedModel& model_;
  FsdpModel& fsdp_;
  comm::ProcessGroup& pg_;
  comm::CollectiveOptions collective_;
  std::vector<Kept> kept_;  // rank 0's view of the run's checkpoints
  std::string last_saved_;
};

}  // namespace st
