#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace st {

namespace {

struct Named {
  LrSchedulerType type;
  const char* name;
};
constexpr Named kNames[] = {{LrSchedulerType::kConstant, "constant"},
                            {LrSchedulerType::kConstantWithWarmup, "constant_with_warmup"},
                            {LrSchedulerType::kLinear, "linear"},
                            {LrSchedulerType::kCosine, "cosine"},
                            {LrSchedulerType::kCosineWithRestarts, "cosine_with_restarts"},
                            {LrSchedulerType::kPolynomial, "polynomial"},
                            {LrSchedulerType::kWsd, "wsd"}};

// transformers' polynomial default lr_end.
constexpr double kPolynomialLrEnd = 1e-7;

}  // namespace

StatusOr<LrSchedulerType> ParseLrScheduler(std::string_view name) {
  for (const Named& n : kNames)
    if (name == n.name) return n.type;
  return InvalidArgument(
      StrCat("--lr-scheduler must be constant, constant_with_warmup, linear, "
             "cosine, cosine_with_restarts, polynomial or wsd, got '",
             name, "'"));
}

const char* LrSchedulerName(LrSchedulerType type) {
  for (const Named& n : kNames)
    if (type == n.type) return n.name;
  return "?";
}

int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup_ratio));
}

double LrSchedule::Factor(int64_t k) const {
  const double step = static_cast<double>(k), W = static_cast<double>(warmup_steps);
  const double total = static_cast<double>(total_steps);
  const double pi = std::numbers::pi;
  auto warmup = [&] { return step / std::max(1.0, W); };
  switch (type) {
    case LrSchedulerType::kConstant:
      return 1.0;
    case LrSchedulerType::kConstantWithWarmup:
      return k < warmup_steps ? warmup() : 1.0;
    case LrSchedulerType::kLinear:
      if (k < warmup_steps) return warmup();
      return std::max(0.0, (total - step) / std::max(1.0, total - W));
    case LrSchedulerType::kCosine: {
      if (k < warmup_steps) return warmup();
      const double progress = (step - W) / std::max(1.0, total - W);
      double f = 0.5 * (1.0 + std::cos(pi * 0.5 * 2.0 * progress));
      f = f * (1 - min_lr_ratio) + min_lr_ratio;
      return std::max(0.0, f);
    }
    case LrSchedulerType::kCosineWithRestarts: {
      if (k < warmup_steps) return warmup();
      const double progress = (step - W) / std::max(1.0, total - W);
      if (progress >= 1.0) return 0.0;
      return std::max(0.0, 0.5 * (1.0 + std::cos(pi * std::fmod(cycles * progress, 1.0))));
    }
    case LrSchedulerType::kPolynomial: {
      if (k < warmup_steps) return warmup();
      const double lr_end = min_lr_ratio > 0 ? min_lr_ratio * lr : kPolynomialLrEnd;
      if (k > total_steps) return lr_end / lr;
      const double remaining = 1.0 - (step - W) / (total - W);
      return ((lr - lr_end) * std::pow(remaining, power) + lr_end) / lr;
    }
    case LrSchedulerType::kWsd: {
      const int64_t stable = total_steps - warmup_steps - decay_steps;
      if (k < warmup_steps) {
        const double f = warmup() * (1.0 - min_lr_ratio) + min_lr_ratio;
        return std::max(0.0, f);
      }
      if (k < warmup_steps + stable) return 1.0;
      if (k < warmup_steps + stable + decay_steps) {
        const double progress = static_cast<double>(k - warmup_steps - stable) /
                                std::max(1.0, static_cast<double>(decay_steps));
        double f = 0.5 * (1.0 + std::cos(pi * 0.5 * 2.0 * progress));
        f = f * (1.0 - min_lr_ratio) + min_lr_ratio;
        return std::max(0.0, f);
      }
      return min_lr_ratio;
    }
  }
  return 1.0;
}

double LrSchedule::At(int64_t k) const {
  return lr * Factor(k);
}

std::string LrSchedule::Describe() const {
  std::string s = StrCat(LrSchedulerName(type), " over ", total_steps, " steps");
  if (warmup_steps > 0) s += StrCat(", warm-up ", warmup_steps);
  if (type == LrSchedulerType::kWsd) s += StrCat(", decay ", decay_steps);
  if (type == LrSchedulerType::kCosineWithRestarts) s += StrCat(", ", cycles, " cycles");
  if (type == LrSchedulerType::kPolynomial && power != 1) s += StrCat(", power ", power);
  if (min_lr_ratio > 0) s += StrCat(", min ", min_lr_ratio, " x lr");
  return s;
}

}  // namespace st
