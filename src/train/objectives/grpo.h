// GRPO (--objective grpo): the math of TRL 1.16's GRPOTrainer, apart from sampling and scoring
// (train/rollout.h, train/rewards.h) and the step that drives them (grpo_step.h):
// - GroupAdvantages: the rewards of G completions per prompt, weighted and summed over the
//   reward functions, minus their group's mean and (--scale-rewards group | batch) divided by
//   the group's or the whole batch's standard deviation + 1e-4 (TRL's "sum_then_normalize");
// - GrpoTokenLoss: the clipped surrogate per completion token, with the KL to the reference when
//   beta > 0, aggregated as --loss-type grpo | bnpo | dr_grpo | dapo says, and its gradient as
//   the per-token weights the engine's backward takes (-d loss / d logp), with the metrics TRL
//   logs (kl, clip_ratio/*).
// Goldens: tools/make_grpo_fixtures.py runs TRL's own _generate_and_score_completions and
// _compute_loss on fixed rewards and log-probs.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace st {

struct GrpoOptions {
  int64_t num_generations = 8;          // G: completions per prompt
  std::string loss_type = "dapo";       // grpo | bnpo | dr_grpo | dapo (TRL 1.16's default)
  double beta = 0.0;                    // KL coefficient (TRL's default 0: no reference model)
  double epsilon = 0.2;                 // clipping: ratio within [1 - epsilon, 1 + epsilon_high]
  double epsilon_high = -1;             // < 0: epsilon
  std::string scale_rewards = "group";  // group | batch | none
  int64_t num_iterations = 1;           // optimizer steps per generation round
  int64_t max_completion_length = 256;
  bool mask_truncated_completions = false;
  std::vector<double> reward_weights;  // empty: 1 for every reward function
  // TRL's use_bias_correction_kl (on by default in 1.16): the KL term is weighted by the
  // importance ratio to the round's policy.
  bool kl_bias_correction = true;
  double EpsilonHigh() const { return epsilon_high < 0 ? epsilon : epsilon_high; }
};

// Flag checks (no files).
Status ValidateGrpoOptions(const GrpoOptions& o, int64_t reward_functions);

// The advantages of a generation batch and the reward metrics TRL logs (reward, reward_std,
// frac_reward_zero_std, rewards/<name>/mean and /std).
struct GroupAdvantagesResult {
  std::vector<double> advantages;  // [N]
  double reward = 0, reward_std = 0, frac_reward_zero_std = 0;
  std::vector<double> func_mean, func_std;  // per reward function (NaN-aware)
};
// rewards [N][F] (NaN: that function gave no reward; a completion with none at all is left out
// of its group's statistics and gets advantage 0), N a multiple of G, consecutive groups.
GroupAdvantagesResult GroupAdvantages(const std::vector<std::vector<double>>& rewards,
                                      const std::vector<double>& weights, int64_t G,
                                      const std::string& scale_rewards);

// One micro-batch of completions, token by token ([B, T] flat, aligned as the engine's
// TargetLogProbs: position t holds log p(token t | tokens before)).
struct GrpoTokens {
  int64_t B = 0, T = 0;
  const float* logp = nullptr;         // the policy's now
  const float* old_logp = nullptr;     // at sampling (num_iterations > 1); null: logp (ratio 1)
  const float* ref_logp = nullptr;     // the reference's (beta > 0), else null
  const uint8_t* mask = nullptr;       // 1 = a completion token the loss covers
  const double* advantages = nullptr;  // [B]
  const float* entropy = nullptr;      // the policy's entropy per token, for the metric; or null
};

// The extremes over one micro-batch's completions of their clipped-token fractions (TRL's
// clip_ratio/low_min and high_max; completions with no token left out): reduced over ranks with
// MIN and MAX, then averaged over the step's micro-batches as TRL's logging averages its calls.
struct GrpoClipExtremes {
  double low_min = std::numeric_limits<double>::infinity();
  double high_max = -std::numeric_limits<double>::infinity();
};

// How a micro-batch's loss is normalised so that the step's loss is TRL's, averaged over ranks
// and accumulated micro-batches as its DDP and gradient accumulation do.
struct GrpoNorm {
  int64_t world = 1;          // ranks
  int64_t micro_batches = 1;  // of the step (gradient accumulation)
  double global_tokens = 0;   // dapo: the step's completion tokens over every rank
};

// The metric names GrpoTokenLoss adds to, in its `sums` order (the loss first).
const std::vector<std::string>& GrpoLossMetricNames();

// Adds this micro-batch's share of the step's loss and of each metric's numerator and
// denominator into `sums` (GrpoLossMetricNames order; the sums over micro-batches and ranks
// give the step's values after FinishGrpoMetrics), and writes -d loss / d logp into weights [B*T]
// when not null.
void GrpoTokenLoss(const GrpoOptions& o, const GrpoTokens& in, const GrpoNorm& norm,
                   std::vector<double>& sums, float* weights, GrpoClipExtremes* extremes = nullptr);

// The step's metrics from the summed `sums`: (name, value) pairs as TRL logs them (kl when
// beta > 0, entropy when the tokens carried it, clip_ratio/low_mean, clip_ratio/high_mean,
// clip_ratio/region_mean, and with `extremes` (already reduced over ranks, one per micro-batch)
// clip_ratio/low_min and clip_ratio/high_max); the loss is sums[0].
std::vector<std::pair<std::string, double>> FinishGrpoMetrics(
    const GrpoOptions& o, const std::vector<double>& sums,
    const std::vector<GrpoClipExtremes>& extremes = {});

}  // namespace st
