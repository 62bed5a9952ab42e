#include "train/step_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>

#include "kernels/cpu/ops_cpu.h"

namespace st {

namespace {

constexpr int kHostChars = 64;  // gethostname() text per rank, one float per byte
constexpr int kAddrChars = 48;  // the rank's process-group address

void PutText(const std::string& text, float* out, int n) {
  for (int i = 0; i < n; ++i)
    out[i] = i < static_cast<int>(text.size()) ? static_cast<float>(static_cast<uint8_t>(text[i]))
                                               : 0.0f;
}

std::string GetText(const float* in, int n) {
  std::string s;
  for (int i = 0; i < n && in[i] != 0.0f; ++i) s += static_cast<char>(static_cast<uint8_t>(in[i]));
  return s;
}

}  // namespace

std::array<float, WorkerSample::kFloats> WorkerSample::Pack() const {
  return {step_s,  data_s,       comm_wait_s, compute_s, real_tokens, grad_sq,
          rss_mib, peak_rss_mib, comm_mib,    comm_s,    tokens};
}

WorkerSample WorkerSample::Unpack(const float* f) {
  WorkerSample s;
  s.step_s = f[0];
  s.data_s = f[1];
  s.comm_wait_s = f[2];
  s.compute_s = f[3];
  s.real_tokens = f[4];
  s.grad_sq = f[5];
  s.rss_mib = f[6];
  s.peak_rss_mib = f[7];
  s.comm_mib = f[8];
  s.comm_s = f[9];
  s.tokens = f[10];
  return s;
}

StatusOr<std::vector<WorkerInfo>> GatherWorkerInfo(comm::ProcessGroup& pg,
                                                   const comm::CollectiveOptions& opts) {
  // [pid, threads, hostname chars, address chars]: pids stay below 2^22 (pid_max), exact as
  // floats.
  constexpr int kN = 2 + kHostChars + kAddrChars;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::vector<float> mine(kN), all(static_cast<size_t>(kN) * pg.size());
  mine[0] = static_cast<float>(::getpid());
  mine[1] = static_cast<float>(cpu::NumThreads());
  PutText(host, mine.data() + 2, kHostChars);
  PutText(pg.host(), mine.data() + 2 + kHostChars, kAddrChars);
  ST_RETURN_IF_ERROR(pg.AllGather(mine.data(), all.data(), kN, DType::kF32, opts));
  std::vector<WorkerInfo> out(pg.size());
  for (int r = 0; r < pg.size(); ++r) {
    const float* f = all.data() + static_cast<size_t>(r) * kN;
    out[r].rank = r;
    out[r].pid = static_cast<int64_t>(f[0]);
    out[r].threads = static_cast<int>(f[1]);
    out[r].hostname = GetText(f + 2, kHostChars);
    out[r].address = GetText(f + 2 + kHostChars, kAddrChars);
  }
  return out;
}

StatusOr<std::vector<WorkerSample>> GatherSamples(comm::ProcessGroup& pg, const WorkerSample& mine,
                                                  const comm::CollectiveOptions& opts) {
  const auto packed = mine.Pack();
  std::vector<float> all(static_cast<size_t>(WorkerSample::kFloats) * pg.size());
  ST_RETURN_IF_ERROR(
      pg.AllGather(packed.data(), all.data(), WorkerSample::kFloats, DType::kF32, opts));
  std::vector<WorkerSample> out;
  for (int r = 0; r < pg.size(); ++r)
    out.push_back(
        WorkerSample::Unpack(all.data() + static_cast<size_t>(r) * WorkerSample::kFloats));
  return out;
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:" || key == "VmHWM:") {
      double kib = 0;
      in >> kib;
      (key == "VmRSS:" ? m.rss_mib : m.peak_mib) = kib / 1024.0;
    }
    in.ignore(1 << 20, '\n');
  }
  if (m.peak_mib == 0) {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    m.peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  }
  return m;
}

StepMetrics SummariseStep(std::vector<WorkerSample> samples, double loss, double lr,
                          double known_norm, int64_t tokens, int64_t trainable_parameters) {
  StepMetrics s;
  s.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.loss = loss;
  s.lr = lr;
  s.tokens = tokens;
  double grad_sq = 0, real = 0, computed = 0;
  for (const WorkerSample& w : samples) {
    s.step_s = std::max(s.step_s, static_cast<double>(w.step_s));
    s.compute_s += w.compute_s;
    s.comm_wait_s += w.comm_wait_s;
    s.data_s += w.data_s;
    s.comm_mib += w.comm_mib;
    s.comm_s += w.comm_s;
    grad_sq += w.grad_sq;
    real += w.real_tokens;
    computed += w.tokens;
  }
  // The ranks' own counts (batches vary in shape with dynamic padding and packing); `tokens`
  // when they have none.
  if (computed > 0) s.tokens = tokens = static_cast<int64_t>(std::llround(computed));
  const double n = std::max<size_t>(1, samples.size());
  s.compute_s /= n;
  s.comm_wait_s /= n;
  s.data_s /= n;
  s.real_tokens = static_cast<int64_t>(std::llround(real));
  s.grad_norm = known_norm >= 0 ? known_norm : std::sqrt(grad_sq);
  if (s.step_s > 0) {
    s.tokens_per_s = static_cast<double>(tokens) / s.step_s;
    s.real_tokens_per_s = real / s.step_s;
    s.model_flops_per_s = 6.0 * static_cast<double>(trainable_parameters) * s.tokens_per_s;
  }
  s.workers = std::move(samples);
  return s;
}

nlohmann::json ToJson(const WorkerInfo& w) {
  return {{"rank", w.rank},
          {"hostname", w.hostname},
          {"address", w.address},
          {"pid", w.pid},
          {"threads", w.threads}};
}

nlohmann::json ToJson(const StepMetrics& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (size_t r = 0; r < s.workers.size(); ++r) {
    const WorkerSample& w = s.workers[r];
    workers.push_back({{"rank", r},
                       {"step_s", w.step_s},
                       {"compute_s", w.compute_s},
                       {"comm_wait_s", w.comm_wait_s},
                       {"data_s", w.data_s},
                       {"real_tokens", w.real_tokens},
                       {"tokens", w.tokens},
                       {"rss_mib", w.rss_mib},
                       {"peak_rss_mib", w.peak_rss_mib},
                       {"comm_mib", w.comm_mib},
                       {"comm_s", w.comm_s}});
  }
  nlohmann::json j = {{"type", "step"},
                      {"step", s.step},
                      {"epoch", s.epoch},
                      {"step_in_epoch", s.step_in_epoch},
                      {"steps_in_epoch", s.steps_in_epoch},
                      {"time", s.unix_time},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"step_s", s.step_s},
                      {"compute_s", s.compute_s},
                      {"comm_wait_s", s.comm_wait_s},
                      {"data_s", s.data_s},
                      {"tokens", s.tokens},
                      {"real_tokens", s.real_tokens},
                      {"tokens_per_s", s.tokens_per_s},
                      {"real_tokens_per_s", s.real_tokens_per_s},
                      {"model_flops_per_s", s.model_flops_per_s},
                      {"comm_mib", s.comm_mib},
                      {"comm_s", s.comm_s},
                      {"workers", workers}};
  for (const auto& [name, value] : s.objective) j[name] = value;
  if (s.completions.is_array() && !s.completions.empty()) j["completions"] = s.completions;
  return j;
}

nlohmann::json ToJson(const EpochMetrics& e) {
  nlohmann::json j = {{"type", "epoch"},
                      {"epoch", e.epoch},
                      {"global_step", e.global_step},
                      {"time", e.unix_time},
                      {"loss", e.loss},
                      {"epoch_time_s", e.epoch_time_s},
                      {"tokens_per_s", e.tokens_per_s},
                      {"real_tokens_per_s", e.real_tokens_per_s}};
  if (e.eval_loss >= 0) j["eval_loss"] = e.eval_loss;
  return j;
}

nlohmann::json ToJson(const EvalMetrics& e) {
  nlohmann::json j = {{"type", "eval"},           {"step", e.step},
                      {"epoch", e.epoch},         {"time", e.unix_time},
                      {"eval_loss", e.eval_loss}, {"eval_perplexity", std::exp(e.eval_loss)},
                      {"eval_tokens", e.tokens},  {"eval_s", e.eval_s}};
  for (const auto& [name, value] : e.objective_metrics) j["eval_" + name] = value;
  return j;
}

nlohmann::json ToJson(const SampleMetrics& s) {
  nlohmann::json answers = nlohmann::json::array();
  for (const SampleMetrics::Answer& a : s.answers)
    answers.push_back({{"prompt", a.prompt},
                       {"completion", a.completion},
                       {"stop", a.stop},
                       {"new_tokens", a.new_tokens}});
  return {{"type", "samples"},          {"step", s.step},
          {"epoch", s.epoch},           {"time", s.unix_time},
          {"checkpoint", s.checkpoint}, {"generate_s", s.generate_s},
          {"samples", answers}};
}

}  // namespace st
