#include "observe/recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "observe/runs.h"

namespace st::observe {

namespace fs = std::filesystem;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

// Shortest round-trip text of a sample value; Prometheus spells infinities and NaN its own way.
std::string Value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Replaces `path` with `text` through a rename, so a reader never sees half a file. Best effort:
// observability never stops training.
void WriteFileAtomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text << "\n";
    if (!out) return;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

}  // namespace

std::string PrometheusLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += std::string("\\") + c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void RunRecorder::OnStart(const RunInfo& run) {
  std::lock_guard<std::mutex> lock(mu_);
  run_ = run;
  started_ = true;
  status_ = "running";
  start_time_ = Now();
  // On --resume, keep the history up to the checkpoint the run continues from and rewrite the
  // file with it, so that metrics.jsonl holds each step once.
  const MetricsLog old = ReadMetricsLog(run.run_dir);
  jsonl_.open(fs::path(run.run_dir) / "metrics.jsonl", std::ios::trunc);
  for (const auto& s : old.steps)
    if (run.resumed_step > 0 && s.value("step", int64_t{0}) <= run.resumed_step) {
      jsonl_ << s.dump() << "\n";
      KeepRecentLocked(s);
    }
  for (const auto& e : old.epochs)
    if (e.value("epoch", int64_t{0}) <= run.first_epoch) epochs_.push_back(e);
  for (const auto& e : epochs_) jsonl_ << e.dump() << "\n";
  for (const auto* kept : {&old.evals, &old.samples})
    for (const auto& e : *kept)
      if (run.resumed_step > 0 && e.value("step", int64_t{0}) <= run.resumed_step) {
        jsonl_ << e.dump() << "\n";
        if (kept == &old.evals) evals_.push_back(e);
      }
  jsonl_.flush();
  if (tensorboard_) {
    // A new file per (re)start, as TensorBoard's writers do; the reader merges a directory's. A
    // resumed run purges what the earlier one wrote after the checkpoint it continues from, as
    // metrics.jsonl above keeps each step once.
    StatusOr<EventFileWriter> w =
        EventFileWriter::Open((fs::path(run.run_dir) / "tensorboard").string(), start_time_,
                              run.resumed_step > 0 ? run.resumed_step + 1 : 0);
    if (w.ok())
      events_.emplace(std::move(*w));
    else
      std::fprintf(stderr, "slicetrain finetune: warning: %s; no TensorBoard events\n",
                   w.status().message().c_str());
  }
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerInfo& w : run.workers) workers.push_back(ToJson(w));
  WriteFileAtomically(fs::path(run.run_dir) / "cluster.json",
                      nlohmann::json{{"world_size", run.world_size}, {"workers", workers}}.dump(2));
  heartbeat_time_ = start_time_;
  pid_start_ = ProcessStartTicks(::getpid());
  WriteRunJsonLocked();
  ++version_;
  changed_.notify_all();
  if (!heartbeat_.joinable())
    heartbeat_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!changed_.wait_for(lock, std::chrono::seconds(kHeartbeatSeconds),
                                [this] { return stop_heartbeat_; })) {
        heartbeat_time_ = Now();
        WriteRunJsonLocked();
      }
    });
}

RunRecorder::~RunRecorder() {
  StopHeartbeat();
}

void RunRecorder::StopHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_heartbeat_ = true;
  }
  changed_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void RunRecorder::KeepRecentLocked(nlohmann::json step) {
  steps_.push_back(std::move(step));
  while (steps_.size() > kRecentSteps) steps_.pop_front();
}

std::vector<nlohmann::json> RunRecorder::StepsAfterLocked(int64_t since_step) const {
  // Older than the recent window: from metrics.jsonl, which holds every step (flushed per step).
  if (!steps_.empty() && steps_.front().value("step", int64_t{0}) > since_step + 1)
    return ReadMetricsLog(run_.run_dir, since_step).steps;
  size_t s = steps_.size();
  while (s > 0 && steps_[s - 1].value("step", int64_t{0}) > since_step) --s;
  return {steps_.begin() + static_cast<std::ptrdiff_t>(s), steps_.end()};
}

void RunRecorder::AppendLocked(const nlohmann::json& record) {
  if (jsonl_.is_open()) {
    jsonl_ << record.dump() << "\n";
    jsonl_.flush();
  }
  if (sink_.is_open()) {
    sink_ << record.dump() << "\n";
    sink_.flush();
  }
}

Status RunRecorder::AddJsonlSink(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_.open(path, std::ios::app);
  if (!sink_.is_open())
    return IoError(StrCat(path, ": cannot open for appending: ", std::strerror(errno)));
  return Status::Ok();
}

void RunRecorder::EnableTensorBoard(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  tensorboard_ = on;
}

void RunRecorder::WriteEventsLocked(double wall_time, int64_t step,
                                    const std::vector<Scalar>& scalars) {
  if (!events_) return;
  if (Status st = events_->Add(wall_time, step, scalars); !st.ok()) {
    std::fprintf(stderr, "slicetrain finetune: warning: %s; no more TensorBoard events\n",
                 st.message().c_str());
    events_.reset();
  }
}

void RunRecorder::OnStep(const StepMetrics& step) {
  nlohmann::json j = ToJson(step);
  std::lock_guard<std::mutex> lock(mu_);
  AppendLocked(j);
  const double epoch = static_cast<double>(step.epoch - 1) +
                       static_cast<double>(step.step_in_epoch) /
                           static_cast<double>(std::max<int64_t>(1, step.steps_in_epoch));
  auto f = [](double v) { return static_cast<float>(v); };
  WriteEventsLocked(step.unix_time, step.step,
                    {{"train/loss", f(step.loss)},
                     {"train/learning_rate", f(step.lr)},
                     {"train/grad_norm", f(step.grad_norm)},
                     {"train/epoch", f(epoch)},
                     {"train/tokens_per_s", f(step.tokens_per_s)},
                     {"train/real_tokens_per_s", f(step.real_tokens_per_s)},
                     {"train/model_flops_per_s", f(step.model_flops_per_s)},
                     {"time/step_s", f(step.step_s)},
                     {"time/compute_s", f(step.compute_s)},
                     {"time/comm_wait_s", f(step.comm_wait_s)},
                     {"time/data_s", f(step.data_s)}});
  if (!step.objective.empty()) {
    std::vector<Scalar> extra;
    for (const auto& [name, v] : step.objective) extra.push_back({"train/" + name, f(v)});
    WriteEventsLocked(step.unix_time, step.step, extra);
  }
  KeepRecentLocked(std::move(j));
  last_ = step;
  has_last_ = true;
  last_step_time_ = step.unix_time;
  tokens_total_ += static_cast<double>(step.tokens);
  real_tokens_total_ += static_cast<double>(step.real_tokens);
  comm_mib_total_ += step.comm_mib;
  comm_s_total_ += step.comm_s;
  ++version_;
  changed_.notify_all();
}

void RunRecorder::OnEval(const EvalMetrics& eval) {
  nlohmann::json j = ToJson(eval);
  std::lock_guard<std::mutex> lock(mu_);
  AppendLocked(j);
  evals_.push_back(j);
  WriteEventsLocked(eval.unix_time, eval.step,
                    {{"eval/loss", static_cast<float>(eval.eval_loss)},
                     {"eval/perplexity", static_cast<float>(std::exp(eval.eval_loss))}});
  if (!eval.objective_metrics.empty()) {
    std::vector<Scalar> extra;
    for (const auto& [name, v] : eval.objective_metrics)
      extra.push_back({"eval/" + name, static_cast<float>(v)});
    WriteEventsLocked(eval.unix_time, eval.step, extra);
  }
  ++version_;
  changed_.notify_all();
}

void RunRecorder::OnSamples(const SampleMetrics& samples) {
  std::lock_guard<std::mutex> lock(mu_);
  AppendLocked(ToJson(samples));
  ++version_;
  changed_.notify_all();
}

void RunRecorder::OnEpoch(const EpochMetrics& epoch) {
  nlohmann::json j = ToJson(epoch);
  std::lock_guard<std::mutex> lock(mu_);
  AppendLocked(j);
  WriteEventsLocked(epoch.unix_time, epoch.global_step,
                    {{"epoch/loss", static_cast<float>(epoch.loss)},
                     {"epoch/epoch_time_s", static_cast<float>(epoch.epoch_time_s)},
                     {"epoch/tokens_per_s", static_cast<float>(epoch.tokens_per_s)},
                     {"epoch/real_tokens_per_s", static_cast<float>(epoch.real_tokens_per_s)}});
  epochs_.push_back(std::move(j));
  WriteRunJsonLocked();
  ++version_;
  changed_.notify_all();
}

void RunRecorder::Finish(const Status& status) {
  StopHeartbeat();
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status.ok() ? "finished" : "failed";
  error_ = status.ok() ? "" : status.message();
  end_time_ = Now();
  if (started_) WriteRunJsonLocked();
  jsonl_.close();
  sink_.close();
  ++version_;
  changed_.notify_all();
}

void RunRecorder::SetDashboardUrl(const std::string& url) {
  std::lock_guard<std::mutex> lock(mu_);
  dashboard_url_ = url;
  if (started_) WriteRunJsonLocked();
}

bool RunRecorder::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}
std::string RunRecorder::run_dir() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_.run_dir;
}
std::string RunRecorder::run_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_.run_name;
}
std::string RunRecorder::storage_path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_.storage_path;
}
std::string RunRecorder::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}
uint64_t RunRecorder::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

uint64_t RunRecorder::WaitForChange(uint64_t seen, int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return version_ > seen; });
  return version_;
}

nlohmann::json RunRecorder::RunJson() const {
  nlohmann::json j = {{"name", run_.run_name},
                      {"dir", run_.run_dir},
                      {"status", status_},
                      {"start_time", start_time_},
                      {"end_time", end_time_ > 0 ? nlohmann::json(end_time_) : nlohmann::json()},
                      {"hostname", HostName()},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"pid_start", pid_start_},
                      {"heartbeat_time", heartbeat_time_},
                      {"world_size", run_.world_size},
                      {"num_epochs", run_.num_epochs},
                      {"first_epoch", run_.first_epoch},
                      {"steps_per_epoch", run_.steps_per_epoch},
                      {"tokens_per_step", run_.tokens_per_step},
                      {"trainable_parameters", run_.trainable_parameters},
                      {"dashboard", dashboard_url_},
                      {"flags", run_.flags}};
  if (!error_.empty()) j["error"] = error_;
  return j;
}

void RunRecorder::WriteRunJsonLocked() {
  WriteFileAtomically(fs::path(run_.run_dir) / "run.json", RunJson().dump(2));
}

nlohmann::json RunRecorder::MetricsJson(int64_t since_step) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json steps = StepsAfterLocked(since_step), epochs = nlohmann::json::array();
  for (const auto& e : epochs_)
    if (e.value("global_step", int64_t{0}) > since_step) epochs.push_back(e);
  return {{"run", run_.run_name},
          {"status", status_},
          {"steps_per_epoch", run_.steps_per_epoch},
          {"num_epochs", run_.num_epochs},
          {"steps", steps},
          {"epochs", epochs},
          {"evals", EvalsAfterLocked(since_step)}};
}

nlohmann::json RunRecorder::EvalsAfterLocked(int64_t since_step) const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : evals_)
    if (e.value("step", int64_t{0}) > since_step) out.push_back(e);
  return out;
}

nlohmann::json RunRecorder::Since(int64_t since_step, int64_t since_epoch,
                                  int64_t since_eval_step) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t e = epochs_.size();
  while (e > 0 && epochs_[e - 1].value("epoch", int64_t{0}) > since_epoch) --e;
  nlohmann::json steps = StepsAfterLocked(since_step), epochs = nlohmann::json::array();
  for (; e < epochs_.size(); ++e) epochs.push_back(epochs_[e]);
  return {{"status", status_},
          {"steps", steps},
          {"epochs", epochs},
          {"evals", EvalsAfterLocked(since_eval_step)}};
}

nlohmann::json RunRecorder::ClusterJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string me = HostName();
  const double now = Now();
  nlohmann::json workers = nlohmann::json::array();
  std::vector<std::string> hosts;
  for (const WorkerInfo& w : run_.workers) {
    nlohmann::json j = ToJson(w);
    if (has_last_ && static_cast<size_t>(w.rank) < last_.workers.size()) {
      j["rss_mib"] = last_.workers[w.rank].rss_mib;
      j["peak_rss_mib"] = last_.workers[w.rank].peak_rss_mib;
      j["last_step_s"] = last_.workers[w.rank].step_s;
    }
    // Liveness: every rank took part in the last step's gather; a rank on this host is also
    // checked by pid.
    j["last_seen_s_ago"] = last_step_time_ > 0 ? nlohmann::json(now - last_step_time_)
                                               : nlohmann::json(now - start_time_);
    const bool local = w.hostname == me;
    const bool running = status_ == "running" || status_ == "starting";
    j["alive"] = running && (!local || ProcessAlive(w.pid));
    workers.push_back(j);
    if (std::find(hosts.begin(), hosts.end(), w.hostname + " " + w.address) == hosts.end())
      hosts.push_back(w.hostname + " " + w.address);
  }
  nlohmann::json host_list = nlohmann::json::array();
  for (const std::string& h : hosts) {
    const size_t sp = h.rfind(' ');
    int n = 0;
    for (const WorkerInfo& w : run_.workers) n += (w.hostname + " " + w.address) == h;
    host_list.push_back(
        {{"hostname", h.substr(0, sp)}, {"address", h.substr(sp + 1)}, {"workers", n}});
  }
  return {{"run", run_.run_name},
          {"status", status_},
          {"world_size", run_.world_size},
          {"device", run_.flags.value("accelerator_type", std::string("CPU"))},
          {"topology", run_.flags.value("topology", std::string(""))},
          {"hosts", host_list},
          {"workers", workers}};
}

std::string RunRecorder::Prometheus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream o;
  const std::string run = "run=\"" + PrometheusLabel(run_.run_name) + "\"";
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  metric("slicetrain_run_info", "gauge", "The run on this dashboard (value 1) and its status.");
  o << "slicetrain_run_info{" << run << ",status=\"" << status_ << "\"} 1\n";
  metric("slicetrain_world_size", "gauge", "Workers (ranks) of the run.");
  o << "slicetrain_world_size{" << run << "} " << run_.world_size << "\n";
  if (has_last_) {
    const StepMetrics& s = last_;
    metric("slicetrain_step", "gauge", "Global step of the last completed step.");
    o << "slicetrain_step{" << run << "} " << s.step << "\n";
    metric("slicetrain_epoch", "gauge", "Epoch (from 1) of the last completed step.");
    o << "slicetrain_epoch{" << run << "} " << s.epoch << "\n";
    metric("slicetrain_loss", "gauge", "Mean token loss of the last step's global batch.");
    o << "slicetrain_loss{" << run << "} " << Value(s.loss) << "\n";
    metric("slicetrain_learning_rate", "gauge", "AdamW learning rate of the last step.");
    o << "slicetrain_learning_rate{" << run << "} " << Value(s.lr) << "\n";
    metric("slicetrain_grad_norm", "gauge", "Global gradient L2 norm before clipping.");
    o << "slicetrain_grad_norm{" << run << "} " << Value(s.grad_norm) << "\n";
    metric("slicetrain_step_seconds", "gauge",
           "Last step's time: total (slowest rank) and its split (mean over ranks).");
    o << "slicetrain_step_seconds{" << run << ",phase=\"total\"} " << Value(s.step_s) << "\n"
      << "slicetrain_step_seconds{" << run << ",phase=\"compute\"} " << Value(s.compute_s) << "\n"
      << "slicetrain_step_seconds{" << run << ",phase=\"comm_wait\"} " << Value(s.comm_wait_s)
      << "\n"
      << "slicetrain_step_seconds{" << run << ",phase=\"data\"} " << Value(s.data_s) << "\n";
    metric("slicetrain_tokens_per_second", "gauge", "Last step's global tokens per second.");
    o << "slicetrain_tokens_per_second{" << run << ",kind=\"padded\"} " << Value(s.tokens_per_s)
      << "\n"
      << "slicetrain_tokens_per_second{" << run << ",kind=\"real\"} " << Value(s.real_tokens_per_s)
      << "\n";
    metric("slicetrain_model_flops_per_second", "gauge",
           "6 x trainable parameters x padded tokens per second of the last step.");
    o << "slicetrain_model_flops_per_second{" << run << "} " << Value(s.model_flops_per_s) << "\n";
    metric("slicetrain_worker_rss_bytes", "gauge", "Resident memory of each worker.");
    for (size_t r = 0; r < s.workers.size(); ++r)
      o << "slicetrain_worker_rss_bytes{" << run << ",rank=\"" << r << "\"} "
        << Value(s.workers[r].rss_mib * 1048576.0) << "\n";
    metric("slicetrain_worker_peak_rss_bytes", "gauge", "Peak resident memory of each worker.");
    for (size_t r = 0; r < s.workers.size(); ++r)
      o << "slicetrain_worker_peak_rss_bytes{" << run << ",rank=\"" << r << "\"} "
        << Value(s.workers[r].peak_rss_mib * 1048576.0) << "\n";
  }
  metric("slicetrain_tokens_total", "counter", "Tokens trained on in this process's steps.");
  o << "slicetrain_tokens_total{" << run << ",kind=\"padded\"} " << Value(tokens_total_) << "\n"
    << "slicetrain_tokens_total{" << run << ",kind=\"real\"} " << Value(real_tokens_total_) << "\n";
  metric("slicetrain_collective_bytes_total", "counter",
         "Collective buffer bytes of the training steps, summed over ranks.");
  o << "slicetrain_collective_bytes_total{" << run << "} " << Value(comm_mib_total_ * 1048576.0)
    << "\n";
  metric("slicetrain_collective_seconds_total", "counter",
         "Seconds inside collectives during the training steps, summed over ranks.");
  o << "slicetrain_collective_seconds_total{" << run << "} " << Value(comm_s_total_) << "\n";
  return o.str();
}

}  // namespace st::observe
