// The checkpoints of a fine-tuning run: <storage>/<run>/checkpoint_<time>/ holds the full model as
// a Hugging Face directory (model.safetensors, config.json, tokenizer files), metrics.json,
// trainer_state.json, every rank's FSDP shard (shards/rank_R.safetensors: fp32 master weights and
// AdamW moments) and checksums.sha256, the SHA-256 of every other file, recorded at commit in
// sha256sum's format (`sha256sum -c checksums.sha256` checks a copy by hand).
// A checkpoint is built in <run>/.pending_epoch_E/ (or .pending_step_G/ for one taken inside an
// epoch) and committed with fsync + rename, so a process killed while writing never leaves a
// half-written checkpoint_* directory nor harms older ones.
// Not the training loop: the trainer decides when to write, the Checkpointer (checkpointer.h)
// which to keep and where to resume.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"
#include "io/files.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "parallel/fsdp.h"
#include "train/vision_lora.h"

namespace st {

// <run_dir>/.pending_epoch_<epoch>: where the checkpoint of `epoch` (1-based) is assembled;
// <run_dir>/.pending_step_<global_step> for a checkpoint inside an epoch (--save-steps).
std::string PendingCheckpointDir(const std::string& run_dir, int64_t epoch);
std::string PendingStepCheckpointDir(const std::string& run_dir, int64_t global_step);
// <dir>/shards/rank_<rank>.safetensors
std::string ShardPath(const std::string& dir, int rank);

// Every rank, once rank 0 has created `pending`/shards: writes this rank's shard (fsynced) and
// the SHA-256 of what is on disk beside it, for rank 0's manifest.
Status WriteCheckpointShard(const std::string& pending, FsdpModel& fsdp, int rank, int world,
                            int64_t epoch, int64_t global_step);

// How the Hugging Face model of a checkpoint is written.
struct HfExportOptions {
  // The dtype of the trained tensors; frozen tensors keep the source checkpoint's dtype and bytes.
  DType dtype = DType::kF32;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
};

// Every rank, once rank 0 has created `pending`: the Hugging Face model (config.json and one or
// more safetensors files) written by rank 0 tensor by tensor. Each trained tensor is assembled
// from every rank's piece (FsdpModel::GatherTensor, one all-gather per tensor, in registry order
// on every rank); a frozen one is copied by rank 0 from the source as stored, or converted in
// chunks (a preset). Rank 0's extra memory is one tensor, never the model.
Status WriteHfModel(const std::string& pending, const LoadedModel& model, FsdpModel& fsdp,
                    comm::ProcessGroup& pg, const comm::CollectiveOptions& collective,
                    const HfExportOptions& options);

// Every rank, once rank 0 has created `pending`: a LoRA run's PEFT adapter directory written by
// rank 0 (adapter_config.json, adapter_model.safetensors with every trained tensor, i.e. the
// adapters, under PEFT's names in `dtype`), each assembled from every rank's piece as in
// WriteHfModel (one all-gather per adapter tensor, in registry order on every rank). `vision`: a
// trained vision tower's adapters (the same on every rank), written after the text model's and
// selected by adapter_config.json's target_modules too.
Status WritePeftAdapter(const std::string& pending, const LoadedModel& model, FsdpModel& fsdp,
                        comm::ProcessGroup& pg, const PeftAdapterConfig& adapter, DType dtype,
                        const VisionLoraTrainer* vision = nullptr);

// What rank 0 adds to the ranks' shards and the model.
struct CheckpointContent {
  std::string tokenizer_dir;  // its tokenizer files are copied beside the model
  std::string metrics_json;
  std::string state_json;
};
// Rank 0, after every rank's WriteCheckpointShard and WriteHfModel: the tokenizer files and JSON
// files into `pending`, then checksums.sha256, fsync of everything, and the rename to `dir`.
Status CommitCheckpoint(const std::string& pending, const std::string& dir,
                        const CheckpointContent& content);

// A committed checkpoint of the run, as its trainer_state.json describes it.
struct CheckpointEntry {
  std::string dir;
  int64_t epoch = 0;          // epochs completed
  int64_t step_in_epoch = 0;  // steps of the next epoch also done (a --save-steps checkpoint)
  int64_t global_step = 0;
  nlohmann::json state;
};
// The run's checkpoint_* directories with a readable trainer_state.json, newest (by global step)
// first.
// Nothing is verified here beyond the JSON: see VerifyCheckpointFile.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& run_dir);

// Checks one file of a committed checkpoint (a path relative to `dir`) against the checksum
// recorded at commit: a missing manifest, a missing file or a different hash is an error naming
// the file. VerifyCheckpoint checks every file the manifest lists.
Status VerifyCheckpointFile(const std::string& dir, const std::string& relative);
Status VerifyCheckpoint(const std::string& dir);

// This rank's shard of checkpoint `dir`, verified, into the FSDP state (master weights and AdamW
// moments). A checkpoint written by another number of workers is an error that says so.
Status LoadCheckpointShard(const std::string& dir, FsdpModel& fsdp, int rank, int world);

// Removes the .pending_* directories a killed run left behind; returns how many.
int RemoveStalePendingCheckpoints(const std::string& run_dir);

}  // namespace st
