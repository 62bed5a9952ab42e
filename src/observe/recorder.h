// Rank 0's record of a live run: the TrainingObserver that keeps the recent steps and every epoch
// in memory for the dashboard, appends them to <run_dir>/metrics.jsonl (one JSON record per line),
// and keeps <run_dir>/run.json (flags, status, times) and cluster.json (the ranks) up to date.
// Thread-safe: the trainer writes from its thread, the dashboard reads from its own.
// Not a server and not a plotter (dashboard.h, plot.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "observe/tensorboard.h"
#include "train/step_metrics.h"

namespace st::observe {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string PrometheusLabel(const std::string& value);

class RunRecorder : public TrainingObserver {
 public:
  RunRecorder() = default;
  ~RunRecorder() override;  // stops the heartbeat
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;

  void OnStart(const RunInfo& run) override;
  void OnStep(const StepMetrics& step) override;
  void OnEpoch(const EpochMetrics& epoch) override;
  void OnEval(const EvalMetrics& eval) override;
  void OnSamples(const SampleMetrics& samples) override;
  // The run ended (ok or not): status into run.json; wakes every waiter.
  void Finish(const Status& status);

  // Where the dashboard is, recorded in run.json (call before OnStart or any time after).
  void SetDashboardUrl(const std::string& url);
  // Also write TensorBoard event files into <run_dir>/tensorboard (--report-to tensorboard; call
  // before OnStart): per step train/loss, train/learning_rate, train/grad_norm, train/epoch (as
  // transformers' TensorBoardCallback names them) and the throughput and time split; per epoch
  // epoch/loss and epoch/tokens_per_s.
  void EnableTensorBoard(bool on);
  // --report-to jsonl:PATH: every record metrics.jsonl gets from now on is also appended to PATH
  // (created if missing) and flushed, for a tracker that tails it. IoError if it cannot be opened.
  Status AddJsonlSink(const std::string& path);

  bool started() const;
  std::string run_dir() const;
  std::string run_name() const;
  std::string storage_path() const;
  // "starting" before OnStart, "running", then "finished" or "failed".
  std::string status() const;

  // Number of records so far (steps + epochs + status changes): the SSE cursor.
  uint64_t version() const;
  // Blocks until version() > seen or `timeout_ms` passed; returns version().
  uint64_t WaitForChange(uint64_t seen, int64_t timeout_ms) const;

  // JSON views for the dashboard (docs/observe.md).
  // {"steps": [...], "epochs": [...], "evals": [...]}: the records after since_step.
  nlohmann::json MetricsJson(int64_t since_step) const;
  // The step records with step > since_step, epoch records with epoch > since_epoch and eval
  // records with step > since_eval_step (the event stream's increments), and the status.
  nlohmann::json Since(int64_t since_step, int64_t since_epoch, int64_t since_eval_step = 0) const;
  nlohmann::json ClusterJson() const;
  nlohmann::json RunJson() const;  // run.json's content
  // The latest values in the Prometheus text exposition format (version 0.0.4).
  std::string Prometheus() const;

 private:
  void WriteRunJsonLocked();
  void AppendLocked(const nlohmann::json& record);
  // One TensorBoard event (when enabled and writing works; a failure warns once and stops it).
  void WriteEventsLocked(double wall_time, int64_t step, const std::vector<Scalar>& scalars);
  void KeepRecentLocked(nlohmann::json step);
  std::vector<nlohmann::json> StepsAfterLocked(int64_t since_step) const;
  nlohmann::json EvalsAfterLocked(int64_t since_step) const;
  void StopHeartbeat();

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  uint64_t version_ = 0;
  bool started_ = false;
  RunInfo run_;
  std::string status_ = "starting", error_, dashboard_url_;
  double start_time_ = 0, end_time_ = 0, last_step_time_ = 0;
  // The newest kRecentSteps step records (older ones are read back from metrics.jsonl), so rank
  // 0's memory stays flat however long the run; every epoch record (few).
  static constexpr size_t kRecentSteps = 256;
  std::deque<nlohmann::json> steps_;
  std::vector<nlohmann::json> epochs_;
  std::vector<nlohmann::json>
      evals_;  // --eval-split's records, every one (epoch ends and --eval-steps)
  bool has_last_ = false;
  StepMetrics last_;
  double tokens_total_ = 0, real_tokens_total_ = 0, comm_mib_total_ = 0, comm_s_total_ = 0;
  std::ofstream jsonl_;
  std::ofstream sink_;  // --report-to jsonl:PATH
  bool tensorboard_ = false;
  std::optional<EventFileWriter> events_;  // open while the run is on and writing works
  // While the run is on, run.json's heartbeat_time is renewed every kHeartbeatSeconds, so that
  // `slicetrain runs` on another host of a shared storage path tells a lost run from a live one.
  static constexpr int kHeartbeatSeconds = 10;
  double heartbeat_time_ = 0;
  int64_t pid_start_ = 0;  // this process's start time (ProcessStartTicks), read once
  bool stop_heartbeat_ = false;
  std::thread heartbeat_;
};

}  // namespace st::observe
