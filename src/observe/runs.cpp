#include "observe/runs.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace st::observe {

namespace fs = std::filesystem;

namespace {

nlohmann::json ReadJsonFile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

template <typename T>
T Get(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

double MTime(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

int64_t ProcessStartTicks(int64_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return 0;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  std::vector<std::string> fields;  // fields[0] is field 3 (state)
  while (rest >> field) fields.push_back(field);
  if (fields.size() < 20) return 0;
  if (fields[0] == "Z" || fields[0] == "X") return -1;
  return std::strtoll(fields[19].c_str(), nullptr, 10);
}

std::string FormatTime(double t) {
  if (t <= 0) return "-";
  const std::time_t s = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

MetricsLog ReadMetricsLog(const std::string& run_dir, int64_t since_step) {
  MetricsLog log;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const std::string type = Get<std::string>(j, "type", "");
    if (type == "step" && Get<int64_t>(j, "step", 0) > since_step)
      log.steps.push_back(std::move(j));
    else if (type == "epoch" && Get<int64_t>(j, "global_step", 0) > since_step)
      log.epochs.push_back(std::move(j));
    else if (type == "eval" && Get<int64_t>(j, "step", 0) > since_step)
      log.evals.push_back(std::move(j));
    else if (type == "samples" && Get<int64_t>(j, "step", 0) > since_step)
      log.samples.push_back(std::move(j));
  }
  return log;
}

RunSummary ReadRun(const std::string& run_dir) {
  RunSummary r;
  r.dir = run_dir;
  r.name = fs::path(run_dir).filename().string();
  const nlohmann::json run = ReadJsonFile(fs::path(run_dir) / "run.json");
  r.flags = Get<nlohmann::json>(run, "flags", nlohmann::json::object());
  r.status = Get<std::string>(run, "status", "unknown");
  r.start_time = Get<double>(run, "start_time", 0);
  r.end_time = Get<double>(run, "end_time", 0);
  r.num_epochs = Get<int64_t>(r.flags, "num_epochs", 0);
  r.score_attribute = Get<std::string>(r.flags, "checkpoint_score_attribute", "loss");
  r.score_order = Get<std::string>(r.flags, "checkpoint_score_order", "min");
  // A run that says "running" but whose rank-0 process is gone from this host (or is another
  // process under a reused pid, or a zombie), or whose heartbeat stopped on another host, was
  // killed or lost its host.
  if (r.status == "running" || r.status == "starting") {
    const int64_t pid = Get<int64_t>(run, "pid", 0), ticks = Get<int64_t>(run, "pid_start", 0);
    bool gone = false;
    if (Get<std::string>(run, "hostname", "") == HostName()) {
      const int64_t now_ticks = ProcessStartTicks(pid);
      gone = !ProcessAlive(pid) || now_ticks < 0 || (ticks > 0 && now_ticks != ticks);
    } else {
      const double beat = Get<double>(run, "heartbeat_time", 0);
      gone = beat > 0 && Now() - beat > kHeartbeatStaleSeconds;
    }
    if (gone) r.status = "interrupted";
  }

  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint_", 0) != 0 || !e.is_directory(ec)) continue;
    const nlohmann::json state = ReadJsonFile(e.path() / "trainer_state.json");
    if (!state.is_object()) continue;
    CheckpointSummary c;
    c.name = name;
    c.epoch = Get<int64_t>(state, "epoch", 0);
    c.global_step = Get<int64_t>(state, "global_step", 0);
    c.step_in_epoch = Get<int64_t>(state, "step_in_epoch", 0);
    c.metrics = ReadJsonFile(e.path() / "metrics.json");
    const nlohmann::json& source = c.metrics.is_object() ? c.metrics : state;
    c.score = Get<double>(source, r.score_attribute.c_str(), Get<double>(state, "loss", 0));
    r.checkpoints.push_back(std::move(c));
  }
  std::sort(r.checkpoints.begin(), r.checkpoints.end(),
            [](const CheckpointSummary& a, const CheckpointSummary& b) {
              return a.global_step != b.global_step ? a.global_step < b.global_step
                                                    : a.name < b.name;
            });
  for (const CheckpointSummary& c : r.checkpoints) {
    r.epochs_done = std::max(r.epochs_done, c.epoch);
    if (c.step_in_epoch > 0) continue;  // a restart point, not scored
    const bool better = r.score_order == "max" ? c.score > r.best_score : c.score < r.best_score;
    if (!r.has_best || better) r.best_score = c.score;
    r.has_best = true;
  }
  const MetricsLog log = ReadMetricsLog(run_dir);
  r.steps = static_cast<int64_t>(log.steps.size());
  for (const auto& e : log.epochs)
    r.epochs_done = std::max(r.epochs_done, Get<int64_t>(e, "epoch", 0));
  if (r.start_time == 0) r.start_time = MTime(run_dir);
  if (r.status == "unknown" && r.num_epochs > 0 && r.epochs_done >= r.num_epochs)
    r.status = "finished";
  return r;
}

std::vector<RunSummary> ScanRuns(const std::string& storage) {
  std::vector<RunSummary> runs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(storage, ec)) {
    if (!e.is_directory(ec)) continue;
    const fs::path d = e.path();
    const std::string name = d.filename().string();
    if (name.empty() || name[0] == '.') continue;
    bool is_run = fs::exists(d / "run.json", ec) || fs::exists(d / "metrics.jsonl", ec);
    for (const auto& c : fs::directory_iterator(d, ec))
      if (!is_run && c.path().filename().string().rfind("checkpoint_", 0) == 0) is_run = true;
    if (is_run) runs.push_back(ReadRun(d.string()));
  }
  std::sort(runs.begin(), runs.end(), [](const RunSummary& a, const RunSummary& b) {
    return a.start_time != b.start_time ? a.start_time > b.start_time : a.name < b.name;
  });
  return runs;
}

nlohmann::json ToJson(const RunSummary& r) {
  nlohmann::json ckpts = nlohmann::json::array();
  for (const CheckpointSummary& c : r.checkpoints)
    ckpts.push_back({{"name", c.name},
                     {"path", (fs::path(r.dir) / c.name).string()},
                     {"epoch", c.epoch},
                     {"global_step", c.global_step},
                     {"step_in_epoch", c.step_in_epoch},
                     {"score", c.score},
                     {"metrics", c.metrics}});
  return {{"name", r.name},
          {"dir", r.dir},
          {"status", r.status},
          {"start_time", r.start_time},
          {"end_time", r.end_time},
          {"epochs_done", r.epochs_done},
          {"num_epochs", r.num_epochs},
          {"steps", r.steps},
          {"score_attribute", r.score_attribute},
          {"score_order", r.score_order},
          {"best_score", r.has_best ? nlohmann::json(r.best_score) : nlohmann::json()},
          {"flags", r.flags},
          {"checkpoints", ckpts}};
}

std::string RunsTable(const std::vector<RunSummary>& runs) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STARTED (UTC)", "STATUS", "EPOCHS", "BEST SCORE", "CHECKPOINTS"}};
  for (const RunSummary& r : runs) {
    char best[64] = "-";
    if (r.has_best)
      std::snprintf(best, sizeof(best), "%s=%.4f (%s)", r.score_attribute.c_str(), r.best_score,
                    r.score_order.c_str());
    const std::string epochs =
        r.num_epochs > 0 ? std::to_string(r.epochs_done) + "/" + std::to_string(r.num_epochs)
                         : std::to_string(r.epochs_done);
    std::string ckpts;
    for (const CheckpointSummary& c : r.checkpoints)
      ckpts += (ckpts.empty() ? "" : ", ") + c.name + " (epoch " + std::to_string(c.epoch) + ")";
    rows.push_back(
        {r.name, FormatTime(r.start_time), r.status, epochs, best, ckpts.empty() ? "-" : ckpts});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  std::ostringstream out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
  return out.str();
}

}  // namespace st::observe
