#include "train/objectives/grpo.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace st {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// torch.nanmean / TRL's nanstd (Bessel's correction over the non-NaN values) of x[begin, end).
double NanMean(const std::vector<double>& x, size_t begin, size_t end) {
  double s = 0;
  int64_t n = 0;
  for (size_t i = begin; i < end; ++i)
    if (!std::isnan(x[i])) {
      s += x[i];
      ++n;
    }
  return n ? s / static_cast<double>(n) : kNaN;
}
double NanStd(const std::vector<double>& x, size_t begin, size_t end) {
  const double m = NanMean(x, begin, end);
  double v = 0;
  int64_t n = 0;
  for (size_t i = begin; i < end; ++i)
    if (!std::isnan(x[i])) {
      v += (x[i] - m) * (x[i] - m);
      ++n;
    }
  if (n == 0) return kNaN;
  // nanmean of the squares times count / (count - 1): inf x 0 = NaN for a single value, as torch.
  const double mean_sq = v / static_cast<double>(n);
  const double correction = static_cast<double>(n) / static_cast<double>(n - 1);
  return std::sqrt(mean_sq * correction);
}
// torch.isclose(x, 0): |x| <= 1e-8 (atol; rtol times 0 adds nothing); NaN is not close.
bool IsCloseToZero(double x) {
  return std::abs(x) <= 1e-8;
}

enum Sum { kLoss, kKl, kTokens, kLow, kHigh, kRegion, kEntropy, kEntropyTokens, kSums };

}  // namespace

Status ValidateGrpoOptions(const GrpoOptions& o, int64_t reward_functions) {
  if (o.num_generations < 2)
    return InvalidArgument(StrCat("--num-generations must be at least 2 (advantages compare the ",
                                  "completions of a prompt), got ", o.num_generations));
  if (o.loss_type != "grpo" && o.loss_type != "bnpo" && o.loss_type != "dr_grpo" &&
      o.loss_type != "dapo")
    return InvalidArgument(StrCat("--loss-type ", o.loss_type,
                                  " is not a GRPO loss: use grpo, bnpo, dr_grpo or dapo"));
  if (o.scale_rewards != "group" && o.scale_rewards != "batch" && o.scale_rewards != "none")
    return InvalidArgument(
        StrCat("--scale-rewards must be group, batch or none, got '", o.scale_rewards, "'"));
  if (!(o.beta >= 0)) return InvalidArgument(StrCat("--beta must be >= 0, got ", o.beta));
  if (!(o.epsilon > 0 && o.epsilon < 1))
    return InvalidArgument(StrCat("--epsilon must be in (0, 1), got ", o.epsilon));
  if (o.epsilon_high >= 0 && o.epsilon_high <= 0)
    return InvalidArgument(StrCat("--epsilon-high must be > 0, got ", o.epsilon_high));
  if (o.num_iterations < 1)
    return InvalidArgument(StrCat("--num-iterations must be >= 1, got ", o.num_iterations));
  if (o.max_completion_length < 1)
    return InvalidArgument(
        StrCat("--max-completion-length must be >= 1, got ", o.max_completion_length));
  if (reward_functions < 1)
    return InvalidArgument(
        "--objective grpo needs a reward: --reward-command CMD (a program) or --reward SPEC "
        "(exact:COLUMN, numeric:COLUMN, regex:PATTERN, overlong:MAX:CACHE)");
  if (!o.reward_weights.empty() &&
      static_cast<int64_t>(o.reward_weights.size()) != reward_functions)
    return InvalidArgument(StrCat("--reward-weights has ", o.reward_weights.size(), " values for ",
                                  reward_functions,
                                  " reward functions (the --reward ones first, then the "
                                  "--reward-command ones)"));
  return Status::Ok();
}

GroupAdvantagesResult GroupAdvantages(const std::vector<std::vector<double>>& rewards,
                                      const std::vector<double>& weights, int64_t G,
                                      const std::string& scale_rewards) {
  const size_t N = rewards.size(), F = N ? rewards[0].size() : weights.size();
  const size_t g = static_cast<size_t>(G);
  ST_CHECK(G >= 1 && N % g == 0) << N << " rewards are not groups of " << G;
  GroupAdvantagesResult out;
  std::vector<double> r(N, 0.0);
  for (size_t i = 0; i < N; ++i) {
    bool any = false;
    for (size_t f = 0; f < F; ++f) {
      const double w = weights.empty() ? 1.0 : weights[f];
      if (std::isnan(rewards[i][f])) continue;
      r[i] += rewards[i][f] * w;  // nansum
      any = true;
    }
    if (!any) r[i] = kNaN;  // unscorable: out of the statistics, advantage 0
  }
  std::vector<double> std_r(N);
  if (scale_rewards == "batch") {
    const double s = N > 1 ? NanStd(r, 0, N) : 0.0;
    std::fill(std_r.begin(), std_r.end(), s);
  } else {
    for (size_t b = 0; b < N; b += g) {
      const double s = g > 1 ? NanStd(r, b, b + g) : 0.0;
      std::fill(std_r.begin() + static_cast<int64_t>(b),
                std_r.begin() + static_cast<int64_t>(b + g), s);
    }
  }
  out.advantages.resize(N);
  int64_t zero_std = 0;
  for (size_t b = 0; b < N; b += g) {
    const double mean = NanMean(r, b, b + g);
    for (size_t i = b; i < b + g; ++i) {
      double a = r[i] - mean;
      if (scale_rewards != "none") a /= std_r[i] + 1e-4;
      out.advantages[i] = std::isnan(a) ? 0.0 : a;
      zero_std += IsCloseToZero(std_r[i]);
    }
  }
  out.frac_reward_zero_std = N ? static_cast<double>(zero_std) / static_cast<double>(N) : 0.0;
  out.reward = NanMean(r, 0, N);
  out.reward_std = NanStd(r, 0, N);
  std::vector<double> column(N);
  for (size_t f = 0; f < F; ++f) {
    for (size_t i = 0; i < N; ++i) column[i] = rewards[i][f];
    out.func_mean.push_back(NanMean(column, 0, N));
    out.func_std.push_back(NanStd(column, 0, N));
  }
  return out;
}

const std::vector<std::string>& GrpoLossMetricNames() {
  static const std::vector<std::string> names = {"loss",         "kl_sum",        "tokens",
                                                 "clip_low_sum", "clip_high_sum", "clip_region_sum",
                                                 "entropy_sum",  "entropy_tokens"};
  return names;
}

void GrpoTokenLoss(const GrpoOptions& o, const GrpoTokens& in, const GrpoNorm& norm,
                   std::vector<double>& sums, float* weights, GrpoClipExtremes* extremes) {
  ST_CHECK(sums.size() == kSums) << "GrpoTokenLoss: " << sums.size() << " sums";
  const double lo = 1.0 - o.epsilon, hi = 1.0 + o.EpsilonHigh();
  const double share = 1.0 / static_cast<double>(norm.world * norm.micro_batches);
  double micro_tokens = 0;  // bnpo's denominator: this micro-batch's
  for (int64_t i = 0; i < in.B * in.T; ++i) micro_tokens += in.mask[i];
  for (int64_t b = 0; b < in.B; ++b) {
    double row_tokens = 0;
    for (int64_t t = 0; t < in.T; ++t) row_tokens += in.mask[b * in.T + t];
    // The factor of this sequence's token terms in the step's loss.
    double f = 0;
    if (o.loss_type == "grpo")
      f = share / std::max(1.0, row_tokens) / static_cast<double>(in.B);
    else if (o.loss_type == "bnpo")
      f = share / std::max(1.0, micro_tokens);
    else if (o.loss_type == "dr_grpo")
      f = share / static_cast<double>(in.B * o.max_completion_length);
    else  // dapo: the step's tokens over every rank (TRL's num_items_in_batch)
      f = 1.0 / std::max(1.0, norm.global_tokens);
    const double A = in.advantages[b];
    double row_low = 0, row_high = 0;
    for (int64_t t = 0; t < in.T; ++t) {
      const int64_t k = b * in.T + t;
      if (weights) weights[k] = 0.0f;
      if (!in.mask[k]) continue;
      const double logp = in.logp[k];
      const double ratio = in.old_logp ? std::exp(logp - in.old_logp[k]) : 1.0;
      const double clamped = std::clamp(ratio, lo, hi);
      const double l1 = ratio * A, l2 = clamped * A;
      double loss = -std::min(l1, l2);
      // d loss / d logp: the unclipped term's (ratio x A) when it is the minimum or the clamp
      // passes the ratio through (then both terms are equal); 0 when the clipped term wins.
      double grad = (ratio >= lo && ratio <= hi) || l1 < l2 ? -ratio * A : 0.0;
      if (o.beta != 0) {
        const double d = in.ref_logp[k] - logp;
        const double kl = std::exp(d) - d - 1.0;
        if (o.kl_bias_correction) {  // kl x ratio: the ratio's gradient counts (ratio x kl)
          loss += o.beta * kl * ratio;
          grad += o.beta * ratio * (1.0 - std::exp(d) + kl);
          sums[kKl] += kl * ratio;
        } else {
          loss += o.beta * kl;
          grad += o.beta * (1.0 - std::exp(d));
          sums[kKl] += kl;
        }
      }
      sums[kLoss] += f * loss;
      sums[kTokens] += 1;
      const bool low = ratio < lo && A<0, high = ratio> hi && A > 0;
      sums[kLow] += low;
      sums[kHigh] += high;
      sums[kRegion] += low || high;
      row_low += low;
      row_high += high;
      if (in.entropy) {
        sums[kEntropy] += in.entropy[k];
        sums[kEntropyTokens] += 1;
      }
      if (weights) weights[k] = static_cast<float>(-f * grad);
    }
    if (extremes && row_tokens > 0) {
      extremes->low_min = std::min(extremes->low_min, row_low / row_tokens);
      extremes->high_max = std::max(extremes->high_max, row_high / row_tokens);
    }
  }
}

std::vector<std::pair<std::string, double>> FinishGrpoMetrics(
    const GrpoOptions& o, const std::vector<double>& sums,
    const std::vector<GrpoClipExtremes>& extremes) {
  const double n = std::max(1.0, sums[kTokens]);
  std::vector<std::pair<std::string, double>> m;
  if (o.beta != 0) m.emplace_back("kl", sums[kKl] / n);
  if (sums[kEntropyTokens] > 0) m.emplace_back("entropy", sums[kEntropy] / sums[kEntropyTokens]);
  m.emplace_back("clip_ratio/low_mean", sums[kLow] / n);
  m.emplace_back("clip_ratio/high_mean", sums[kHigh] / n);
  m.emplace_back("clip_ratio/region_mean", sums[kRegion] / n);
  if (!extremes.empty()) {
    // The mean over micro-batches of each one's extreme (TRL logs one per _compute_loss call);
    // a micro-batch with no completion token on any rank has none (NaN in TRL) and is skipped.
    double lo = 0, hi = 0;
    int64_t nlo = 0, nhi = 0;
    for (const GrpoClipExtremes& e : extremes) {
      if (std::isfinite(e.low_min)) lo += e.low_min, ++nlo;
      if (std::isfinite(e.high_max)) hi += e.high_max, ++nhi;
    }
    m.emplace_back("clip_ratio/low_min", nlo ? lo / static_cast<double>(nlo) : kNaN);
    m.emplace_back("clip_ratio/high_max", nhi ? hi / static_cast<double>(nhi) : kNaN);
  }
  return m;
}

}  // namespace st
