// Learning-rate schedules, the same value at every step as transformers' get_scheduler for the same
// arguments (tests/fixtures/lr_schedules.json from tools/make_lr_fixtures.py): the lr of optimizer
// step k (0-based: the k-th update, after k scheduler steps) is lr x Factor(k).
//
//   constant              1
//   constant_with_warmup  k / W during the warm-up, then 1
//   linear                warm-up, then down to 0 at the last step
//   cosine                warm-up, then half a cosine to 0, or to min_lr_ratio x lr
//                         (transformers' cosine_with_min_lr with min_lr_rate)
//   cosine_with_restarts  warm-up, then `cycles` hard-restarted cosines to 0
//   polynomial            warm-up, then (lr - lr_end) x remaining^power + lr_end, lr_end =
//                         min_lr_ratio x lr (transformers' default lr_end 1e-7 when the ratio is 0)
//   wsd                   warm-up, stable at 1, then a cosine decay over the last `decay_steps` to
//                         min_lr_ratio (transformers' warmup_stable_decay, linear warm-up from
//                         min_lr_ratio)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace st {

enum class LrSchedulerType {
  kConstant,
  kConstantWithWarmup,
  kLinear,
  kCosine,
  kCosineWithRestarts,
  kPolynomial,
  kWsd
};

StatusOr<LrSchedulerType> ParseLrScheduler(std::string_view name);
const char* LrSchedulerName(LrSchedulerType type);

struct LrSchedule {
  LrSchedulerType type = LrSchedulerType::kConstant;
  double lr = 0;             // the peak (the optimizer's) learning rate
  int64_t warmup_steps = 0;  // W
  int64_t total_steps = 1;   // optimizer steps of the whole run
  double min_lr_ratio = 0;   // cosine, polynomial, wsd
  double cycles = 1;         // cosine_with_restarts
  double power = 1;          // polynomial
  int64_t decay_steps = 0;   // wsd

  // lr x the factor at 0-based optimizer step k.
  double At(int64_t k) const;
  double Factor(int64_t k) const;
  // "cosine, warm-up 10 of 300 steps, min 0.1 x lr"
  std::string Describe() const;
};

// Warm-up steps from --warmup-steps / --warmup-ratio as transformers computes them:
// warmup_steps when > 0, else ceil(total x ratio).
int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace st
