// Per-step training metrics: what every rank measures in a step (time split, tokens, memory,
// collectives), gathered with one small all_gather per step over the job's process group (no
// other connection), and the observer interface through which the trainer hands the result to
// rank 0's recorder and dashboard (src/observe/). Not a logger: nothing here writes files.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"

namespace st {

// Who a rank is, gathered once at the start (the dashboard's Cluster tab).
struct WorkerInfo {
  int rank = 0;
  std::string hostname;  // gethostname()
  std::string address;   // the process group's address of the rank
  int64_t pid = 0;
  int threads = 0;  // the compute threads the rank runs (OpenMP / BLAS)
};

// What one rank measured in one step; travels as kFloats floats.
struct WorkerSample {
  float step_s = 0;        // the rank's whole step: data + compute + comm wait
  float data_s = 0;        // collating the batch
  float comm_wait_s = 0;   // blocked on collectives compute did not hide (FsdpModel)
  float compute_s = 0;     // step_s - data_s - comm_wait_s
  float real_tokens = 0;   // attention-mask ones of the rank's batch
  float grad_sq = 0;       // sum of squares of the rank's gradient shard (before clipping)
  float rss_mib = 0;       // VmRSS after the step
  float peak_rss_mib = 0;  // VmHWM: the process's peak so far
  float comm_mib = 0;      // collective buffer MiB this step (comm::CollectiveTotals)
  float comm_s = 0;        // seconds inside collectives this step (comm thread included)
  float tokens = 0;        // positions the rank computed: its batch's B x T, padding included
  static constexpr int kFloats = 11;
  std::array<float, kFloats> Pack() const;
  static WorkerSample Unpack(const float* f);
};

// The step as rank 0 reports it: global figures plus every rank's sample.
struct StepMetrics {
  int64_t step = 0;   // global step, from 1
  int64_t epoch = 0;  // from 1
  int64_t step_in_epoch = 0, steps_in_epoch = 0;
  double unix_time = 0;  // when the step ended (rank 0's clock)
  double loss = 0;       // the global batch's mean token loss
  double lr = 0;
  double grad_norm = 0;                               // global L2 norm before clipping
  double step_s = 0;                                  // slowest rank
  double compute_s = 0, comm_wait_s = 0, data_s = 0;  // mean over ranks
  int64_t tokens = 0;       // positions computed in the global batch (padding included)
  int64_t real_tokens = 0;  // non-padding tokens of the global batch
  double tokens_per_s = 0, real_tokens_per_s = 0;
  double model_flops_per_s = 0;       // 6 x trainable parameters x tokens / step_s
  double comm_mib = 0, comm_s = 0;    // summed over ranks
  std::vector<WorkerSample> workers;  // [world]
  // A preference objective's metrics under TRL's names (rewards/chosen, logps/rejected, ...).
  std::vector<std::pair<std::string, double>> objective;
  // GRPO with --log-completions: some of rank 0's completions ({prompt, completion, rewards,
  // advantage}), recorded with the step; empty otherwise.
  nlohmann::json completions;
};

// The seed's per-epoch figures.
struct EpochMetrics {
  int64_t epoch = 0;
  int64_t global_step = 0;
  double loss = 0, epoch_time_s = 0, tokens_per_s = 0, real_tokens_per_s = 0;
  double unix_time = 0;
  double eval_loss = -1;  // the held-out loss at the epoch's end; < 0: no evaluation
};

// One evaluation on the held-out split (--eval-split): the mean loss over its targets.
struct EvalMetrics {
  int64_t step = 0;   // the global step it followed
  int64_t epoch = 0;  // from 1
  double eval_loss = 0;
  int64_t tokens = 0;  // targets
  double eval_s = 0;
  double unix_time = 0;
  // A preference objective's metrics on the held-out pairs (reported as eval_<name>).
  std::vector<std::pair<std::string, double>> objective_metrics;
};

// --sample-prompts: what a checkpoint answered (greedy), after the epoch that wrote it.
struct SampleMetrics {
  int64_t step = 0;
  int64_t epoch = 0;
  std::string checkpoint;
  struct Answer {
    std::string prompt, completion, stop;
    int64_t new_tokens = 0;
  };
  std::vector<Answer> answers;
  double generate_s = 0;
  double unix_time = 0;
};

// What the run is, handed to the observer once the run directory exists.
struct RunInfo {
  std::string run_name, run_dir, storage_path;
  nlohmann::json flags;  // the options, as given
  int world_size = 1;
  int64_t num_epochs = 0, first_epoch = 0, steps_per_epoch = 0;
  int64_t resumed_step = 0;          // the global step of the checkpoint resumed from (0: none)
  int64_t tokens_per_step = 0;       // at most: world x batch x max_seq_len
  int64_t trainable_parameters = 0;  // for model FLOP/s
  std::vector<WorkerInfo> workers;   // [world]
};

// Rank 0 gets the run's progress through this; every callback runs on the training thread
// between steps, so an implementation must be quick (no I/O that can block for long).
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  virtual void OnStart(const RunInfo& /*run*/) {}
  virtual void OnStep(const StepMetrics& /*step*/) {}
  virtual void OnEpoch(const EpochMetrics& /*epoch*/) {}
  virtual void OnEval(const EvalMetrics& /*eval*/) {}
  virtual void OnSamples(const SampleMetrics& /*samples*/) {}
};

// Every rank calls these at the same point (one all_gather each); the result is [world] on
// every rank.
StatusOr<std::vector<WorkerInfo>> GatherWorkerInfo(comm::ProcessGroup& pg,
                                                   const comm::CollectiveOptions& opts);
StatusOr<std::vector<WorkerSample>> GatherSamples(comm::ProcessGroup& pg, const WorkerSample& mine,
                                                  const comm::CollectiveOptions& opts);

// This process's resident and peak resident memory in MiB (/proc/self/status VmRSS, VmHWM;
// getrusage's ru_maxrss when /proc is missing).
struct ProcessMemory {
  double rss_mib = 0, peak_mib = 0;
};
ProcessMemory ReadProcessMemory();

// Global figures of a step from the ranks' samples.
StepMetrics SummariseStep(std::vector<WorkerSample> samples, double loss, double lr,
                          double clipped_norm, int64_t tokens, int64_t trainable_parameters);

// JSON forms (the JSONL records of docs/observe.md).
nlohmann::json ToJson(const WorkerInfo& w);
nlohmann::json ToJson(const StepMetrics& s);
nlohmann::json ToJson(const EvalMetrics& e);
nlohmann::json ToJson(const SampleMetrics& s);
nlohmann::json ToJson(const EpochMetrics& e);

}  // namespace st
