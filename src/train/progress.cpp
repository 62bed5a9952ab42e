#include "train/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "kernels/cpu/cpu_features.h"

namespace st {

namespace {

// Progress of an epoch on rank 0: a bar redrawn in place on a terminal, or a plain line every
// tenth of the epoch.
// extra: more " | name value" fields after the loss (a preference objective's metrics).
void ShowProgress(const std::string& mode, int64_t epoch, int64_t epochs, int64_t step,
                  int64_t steps, double loss, double tokens_per_s, double elapsed,
                  const std::string& extra) {
  if (mode == "off") return;
  const double eta = step > 0 ? elapsed / step * (steps - step) : 0.0;
  const int eta_s = static_cast<int>(eta + 0.5);
  if (mode == "bar") {
    const int width = 24, filled = static_cast<int>(width * step / std::max<int64_t>(1, steps));
    std::printf("\r  epoch %lld/%lld [%s%s] %lld/%lld | loss %.4f%s | %.0f tokens/s | ETA %d:%02d ",
                (long long)epoch, (long long)epochs, std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), (long long)step, (long long)steps, loss,
                extra.c_str(), tokens_per_s, eta_s / 60, eta_s % 60);
    if (step == steps) std::printf("\r%*s\r", 100 + static_cast<int>(extra.size()), "");
  } else {
    const int64_t every = std::max<int64_t>(1, steps / 10);
    if (step % every != 0 || step == steps) return;
    std::printf("  epoch %lld/%lld step %lld/%lld | loss %.4f%s | %.0f tokens/s | ETA %d:%02d\n",
                (long long)epoch, (long long)epochs, (long long)step, (long long)steps, loss,
                extra.c_str(), tokens_per_s, eta_s / 60, eta_s % 60);
  }
  std::fflush(stdout);
}

// The seed's final metrics: Ray's result dict as Python prints it.
std::string SeedMetrics(const EpochMetrics& e) {
  char metrics[256];
  std::snprintf(metrics, sizeof(metrics),
                "{'epoch': %lld, 'loss': %.4f, 'epoch_time_s': %.2f, 'tokens_per_s': %.1f}",
                (long long)e.epoch, std::round(e.loss * 1e4) / 1e4, e.epoch_time_s, e.tokens_per_s);
  return metrics;
}

}  // namespace

std::string ComputeSummary(Precision p, int threads) {
  const cpu::CpuFeatures& f = cpu::DetectCpu();
  const std::string how =
      p == Precision::kBf16 ? StrCat("bf16 matmuls on ", cpu::Bf16GemmIsa(),
                                     " with fp32 accumulation, fp32 master weights")
                            : StrCat("fp32 matmuls on OpenBLAS ", cpu::BlasCoreName(), " kernels");
  return StrCat("precision=", PrecisionName(p), " (", how, "); CPU ",
                f.model.empty() ? std::string("unknown") : f.model, " [", cpu::IsaName(f),
                "], kernels ", cpu::KernelIsaName(cpu::ActiveKernelIsa()), ", ", threads,
                threads == 1 ? " thread" : " threads", " per worker");
}

ProgressReporter::ProgressReporter(int rank, std::string mode, int64_t num_epochs,
                                   TrainingObserver* observer)
    : rank_(rank), mode_(std::move(mode)), num_epochs_(num_epochs), observer_(observer) {}

void ProgressReporter::Setup(const SetupSummary& s) const {
  if (rank_ != 0) return;
  std::printf("Setting up process group for: env:// [rank=0, world_size=%d]\n", s.world);
  std::string split;
  if (s.split > 0) split = StrCat(", ", s.split, " split into pieces");
  const std::string micro = s.accumulation > 1
                                ? StrCat(" x ", s.accumulation, " micro-batches",
                                         s.sync_each_batch ? " (each reduce-scattered)" : "")
                                : std::string();
  if (s.untrained > 0) split += StrCat(", ", s.untrained, " with no target left");
  std::printf(
      "Data: %s; %lld %s of up to %lld tokens%s (mean %.1f; %lld truncated%s); %s; %lld "
      "steps per epoch of %d x %lld%s; lr=%g (%s); %.2f M trainable parameters, %.2f M frozen\n",
      s.data.c_str(), (long long)s.examples, s.pairs ? "pairs" : "examples",
      (long long)s.max_seq_len, s.pairs ? " a side" : "",
      s.examples > 0 ? static_cast<double>(s.tokens) / static_cast<double>(s.examples) : 0.0,
      (long long)s.truncated, split.c_str(), s.layout.c_str(), (long long)s.steps_per_epoch,
      s.world, (long long)s.batch_size_per_device, micro.c_str(), s.lr, s.lr_schedule.c_str(),
      s.trainable_parameters / 1e6, s.frozen_parameters / 1e6);
  if (s.pairs)
    std::printf(
        "Objective: %s; %lld pairs (each chosen + rejected, up to %lld tokens a side), "
        "%lld dropped because the prompt fills --max-seq-len\n",
        s.objective.c_str(), (long long)s.examples, (long long)s.max_seq_len, (long long)s.dropped);
  else if (!s.objective.empty())
    std::printf("Objective: %s; %lld prompts of up to %lld tokens, %lld longer ones dropped\n",
                s.objective.c_str(), (long long)s.examples, (long long)s.max_seq_len,
                (long long)s.dropped);
  if (!s.compute.empty()) std::printf("Compute: %s\n", s.compute.c_str());
  if (!s.adapters.empty()) {
    const double all = static_cast<double>(s.trainable_parameters + s.frozen_parameters);
    std::printf("%s: trainable params: %lld || all params: %.0f || trainable%%: %.4f\n",
                s.adapters.c_str(), (long long)s.trainable_parameters, all,
                all > 0 ? 100.0 * static_cast<double>(s.trainable_parameters) / all : 0.0);
  }
  if (!s.parts.empty()) std::printf("%s\n", s.parts.c_str());
  std::fflush(stdout);
}

void ProgressReporter::Start(const RunInfo& run) {
  tokens_per_step_ = run.tokens_per_step;
  trainable_parameters_ = run.trainable_parameters;
  if (run.first_epoch >= run.num_epochs && rank_ == 0)
    std::printf("The run already finished %lld epochs (--num-epochs %lld): nothing to do\n",
                (long long)run.first_epoch, (long long)run.num_epochs);
  if (observer_) observer_->OnStart(run);
}

namespace {
std::string FormatMetric(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}
}  // namespace

void ProgressReporter::Step(const TrainState& state, int64_t steps_in_epoch, int64_t steps_run,
                            double elapsed_s, double lr, StepResult step) {
  if (rank_ != 0) return;
  // Positions computed since the epoch (or the resume) started: batches vary in shape.
  if (steps_run <= 1) epoch_tokens_ = 0;
  for (const WorkerSample& w : step.samples) epoch_tokens_ += w.tokens;
  // A preference objective's metrics: their means over the epoch's steps so far, for the step
  // lines (as the loss there) and the epoch line.
  if (steps_run <= 1) objective_sums_.clear(), objective_steps_ = 0;
  if (objective_sums_.size() != step.objective_metrics.size())
    objective_sums_.assign(step.objective_metrics.size(), {"", 0.0});
  for (size_t i = 0; i < step.objective_metrics.size(); ++i) {
    objective_sums_[i].first = step.objective_metrics[i].first;
    objective_sums_[i].second += step.objective_metrics[i].second;
  }
  ++objective_steps_;
  std::string extra;
  for (const auto& [name, sum] : objective_sums_)
    if (name == "rewards/accuracies" || name == "rewards/margins")
      extra += StrCat(" | ", name.substr(8), " ", FormatMetric(sum / objective_steps_));
    else if (name == "reward")  // GRPO: the mean reward of the epoch's completions so far
      extra += StrCat(" | reward ", FormatMetric(sum / objective_steps_));
  // GRPO --log-completions: a few of the step's completions, one line each.
  if (step.completions.is_array())
    for (const nlohmann::json& c : step.completions) {
      std::string text =
          c["completion"].is_string() ? c["completion"].get<std::string>() : c["completion"].dump();
      for (char& ch : text)
        if (ch == '\n') ch = ' ';
      if (text.size() > 120) text = text.substr(0, 117) + "...";
      std::printf("  completion | reward %s | advantage %s | %s\n", c["reward"].dump().c_str(),
                  FormatMetric(c["advantage"].get<double>()).c_str(), text.c_str());
    }
  ShowProgress(mode_, state.epoch + 1, num_epochs_, state.step_in_epoch, steps_in_epoch,
               state.epoch_loss_sum / state.step_in_epoch, epoch_tokens_ / elapsed_s, elapsed_s,
               extra);
  if (!observer_) return;
  StepMetrics sm = SummariseStep(std::move(step.samples), step.loss, lr, step.grad_norm,
                                 tokens_per_step_, trainable_parameters_);
  sm.step = state.global_step;
  sm.epoch = state.epoch + 1;
  sm.step_in_epoch = state.step_in_epoch;
  sm.steps_in_epoch = steps_in_epoch;
  sm.objective = step.objective_metrics;
  sm.completions = std::move(step.completions);
  observer_->OnStep(sm);
}

void ProgressReporter::Epoch(EpochMetrics e) {
  final_metrics_ = SeedMetrics(e);
  if (rank_ != 0) return;
  std::string eval;
  if (e.eval_loss >= 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " | eval_loss=%.4f", e.eval_loss);
    eval = buf;
  }
  std::printf(
      "Epoch %lld/%lld | loss=%.4f | epoch_time=%.2fs | tokens/s=%.1f | real_tokens/s=%.1f%s\n",
      (long long)e.epoch, (long long)num_epochs_, e.loss, e.epoch_time_s, e.tokens_per_s,
      e.real_tokens_per_s, eval.c_str());
  if (!objective_sums_.empty() && objective_steps_ > 0) {
    std::string line;
    for (const auto& [name, sum] : objective_sums_)
      line += StrCat(line.empty() ? "" : " | ", name, "=",
                     FormatMetric(sum / static_cast<double>(objective_steps_)));
    const bool rl = objective_sums_.front().first == "reward";
    std::printf("Epoch %lld/%lld %s metrics (mean of its steps) | %s\n", (long long)e.epoch,
                (long long)num_epochs_, rl ? "reward" : "preference", line.c_str());
  }
  std::fflush(stdout);
  if (!observer_) return;
  e.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  observer_->OnEpoch(e);
}

void ProgressReporter::Eval(EvalMetrics e, bool at_epoch_end) {
  if (rank_ != 0) return;
  if (!at_epoch_end) {  // the epoch line carries the epoch-end evaluation
    std::printf(
        "Eval at step %lld (epoch %lld) | eval_loss=%.4f | perplexity=%.3f | %lld tokens "
        "in %.2fs\n",
        (long long)e.step, (long long)e.epoch, e.eval_loss, std::exp(e.eval_loss),
        (long long)e.tokens, e.eval_s);
  }
  if (!e.objective_metrics.empty()) {
    std::string line;
    for (const auto& [name, v] : e.objective_metrics)
      line += StrCat(line.empty() ? "" : " | ", "eval_", name, "=", FormatMetric(v));
    std::printf("Eval at step %lld (epoch %lld) preference metrics | %s\n", (long long)e.step,
                (long long)e.epoch, line.c_str());
  }
  std::fflush(stdout);
  if (!observer_) return;
  e.unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  observer_->OnEval(e);
}

void ProgressReporter::Samples(const SampleMetrics& s) const {
  if (rank_ != 0) return;
  std::printf("Samples from %s (greedy, %.1fs):\n", s.checkpoint.c_str(), s.generate_s);
  // One line each: newlines shown as \n.
  auto one_line = [](const std::string& t) {
    std::string out;
    for (char c : t) out += c == '\n' ? std::string("\\n") : std::string(1, c);
    return out;
  };
  for (size_t i = 0; i < s.answers.size(); ++i)
    std::printf("  [%zu] %s -> %s\n", i + 1, one_line(s.answers[i].prompt).c_str(),
                one_line(s.answers[i].completion).c_str());
  std::fflush(stdout);
  if (observer_) observer_->OnSamples(s);
}

void ProgressReporter::Finish(const MemoryReport& m, const std::string& best_checkpoint) const {
  if (rank_ != 0) return;
  std::printf(
      "Memory per worker: sharded state %.1f MiB (fp32 master, grads, 2 AdamW moments), "
      "frozen fp32 %.1f MiB, activations %.1f MiB (--activation-checkpointing %s), peak RSS "
      "%.0f MiB (max over ranks)\n",
      m.sharded_bytes / 1048576.0, m.frozen_bytes / 1048576.0, m.activation_bytes / 1048576.0,
      m.checkpointing, m.peak_rss_mib);
  std::printf("Training completed! Final metrics: %s\n", final_metrics_.c_str());
  std::printf("Saved checkpoint: %s\n",
              best_checkpoint.empty() ? "(none)" : best_checkpoint.c_str());
  std::fflush(stdout);
}

}  // namespace st
