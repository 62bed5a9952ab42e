// The runs of a storage path as `slicetrain runs` and the dashboard's Jobs tab see them: each
// <storage>/<run>/ with its run.json (flags, status, times: written by the RunRecorder), its
// checkpoint_*/trainer_state.json + metrics.json (written by the trainer) and metrics.jsonl.
// Read-only; runs written before run.json existed are listed from their checkpoints alone.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace st::observe {

struct CheckpointSummary {
  std::string name;  // checkpoint_<time>
  int64_t epoch = 0;
  int64_t global_step = 0;
  int64_t step_in_epoch = 0;  // > 0: a --save-steps checkpoint inside epoch `epoch` + 1
  double score = 0;           // the run's checkpoint score attribute (loss by default)
  nlohmann::json metrics;     // metrics.json
};

struct RunSummary {
  std::string name, dir;
  std::string status;                   // running | finished | failed | interrupted | unknown
  double start_time = 0, end_time = 0;  // unix seconds; 0 = unknown
  int64_t epochs_done = 0, num_epochs = 0;
  int64_t steps = 0;  // step records in metrics.jsonl
  std::string score_attribute = "loss", score_order = "min";
  bool has_best = false;
  double best_score = 0;
  nlohmann::json flags;                        // run.json's, or {}
  std::vector<CheckpointSummary> checkpoints;  // oldest epoch first
};

// Every run directory under `storage`, newest first. A missing storage path gives no runs.
std::vector<RunSummary> ScanRuns(const std::string& storage);
// One run directory.
RunSummary ReadRun(const std::string& run_dir);

nlohmann::json ToJson(const RunSummary& r);
// The `slicetrain runs` table: NAME, STARTED (UTC), STATUS, EPOCHS, BEST <attr>, CHECKPOINTS.
std::string RunsTable(const std::vector<RunSummary>& runs);

// The step and epoch records of <run_dir>/metrics.jsonl with step > since_step (whole-file
// parse; broken lines, e.g. a half-written last one, are skipped).
struct MetricsLog {
  // evals: --eval-split's records; samples: --sample-prompts' records
  std::vector<nlohmann::json> steps, epochs, evals, samples;
};
MetricsLog ReadMetricsLog(const std::string& run_dir, int64_t since_step = 0);

// "2026-12-02 14:39:57" (UTC) or "-".
std::string FormatTime(double unix_seconds);
// Whether process `pid` exists on this machine (kill(pid, 0)).
bool ProcessAlive(int64_t pid);
// The start time of process `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot), 0 when
// there is no such process, or -1 when it is a zombie (dead, not yet reaped). With the pid it
// names one process, even after the pid is reused.
int64_t ProcessStartTicks(int64_t pid);
// A run whose run.json says "running" is taken as interrupted when rank 0's process (same host)
// is gone, or (another host) its heartbeat is older than this many seconds.
constexpr double kHeartbeatStaleSeconds = 60;

}  // namespace st::observe
