// ORPO (Hong et al. 2024) as TRL's ORPOTrainer computes it: with c and r the completions' mean
// log-probs per token, log_odds = (c - r) - (log(1 - e^c) - log(1 - e^r)), and
//   loss = NLL(chosen) - beta x mean(log sigmoid(log_odds))
// where NLL is the mean token loss over the chosen sequences' labelled tokens, the prompt
// included (TRL labels every attended token of the chosen side). No reference model.
// rewards/* = beta x c and beta x r; log_odds_ratio = mean log sigmoid(log_odds); log_odds_chosen
// = mean log_odds.
#include <cmath>

#include "train/objectives/objective.h"

namespace st {
namespace {

// log(1 - e^x) for x < 0, as TRL's log1mexp branches at -ln 2.
double Log1mExp(double x) {
  return x < -0.6931471805599453 ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

class Orpo final : public Objective {
 public:
  explicit Orpo(const ObjectiveOptions& o) : beta_(o.beta) {}
  bool needs_reference() const override { return false; }
  bool label_prompt() const override { return true; }
  const std::vector<std::string>& metric_names() const override {
    static const std::vector<std::string> names = {"loss",
                                                   "rewards/chosen",
                                                   "rewards/rejected",
                                                   "rewards/accuracies",
                                                   "rewards/margins",
                                                   "logps/chosen",
                                                   "logps/rejected",
                                                   "nll_loss",
                                                   "log_odds_ratio",
                                                   "log_odds_chosen"};
    return names;
  }

  void Compute(const PairBatch& b, const float* logp, const PairLogps* /*ref*/,
               const ObjectiveNorm& norm, double* sums, float* weights) const override {
    const PairLogps pol = SumPairLogps(b, logp);
    const int64_t P = b.pairs();
    const int64_t n = b.batch.B * b.batch.T;
    // The NLL over the chosen sequences' labelled targets (a sequence's first token has none).
    double nll = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = b.sequence[static_cast<size_t>(t)];
      if (s >= 0 && s % 2 == 0 && b.batch.labels[static_cast<size_t>(t)] != kIgnoreIndex)
        nll -= logp[t];
    }
    const double inv_tok = norm.chosen_targets > 0 ? 1.0 / norm.chosen_targets : 0.0;
    sums[0] += nll * inv_tok;
    sums[7] += nll * inv_tok;
    std::vector<double> dc(static_cast<size_t>(P)), dr(static_cast<size_t>(P));  // d / d mean
    const double w = 1.0 / norm.pairs;
    for (int64_t k = 0; k < P; ++k) {
      const size_t i = static_cast<size_t>(k);
      const double nc = std::max(1.0, pol.chosen_tokens[i]);
      const double nr = std::max(1.0, pol.rejected_tokens[i]);
      const double c = pol.chosen[i] / nc, r = pol.rejected[i] / nr;
      const double lo = (c - r) - (Log1mExp(c) - Log1mExp(r));
      const double ratio = LogSigmoid(lo);
      sums[0] += w * -beta_ * ratio;
      sums[1] += w * beta_ * c;
      sums[2] += w * beta_ * r;
      sums[3] += w * (beta_ * c > beta_ * r ? 1.0 : 0.0);
      sums[4] += w * beta_ * (c - r);
      sums[5] += w * c;
      sums[6] += w * r;
      sums[8] += w * ratio;
      sums[9] += w * lo;
      // d(-beta ratio)/d lo = -beta sigmoid(-lo); d lo / d c = 1 / (1 - e^c), d lo / d r the
      // negative of it at r; then per token of the mean, / n.
      const double g = -beta_ * Sigmoid(-lo);
      dc[i] = g / -std::expm1(c) / nc;
      dr[i] = -g / -std::expm1(r) / nr;
    }
    if (!weights) return;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = b.sequence[static_cast<size_t>(t)];
      weights[t] = 0.0f;
      if (s < 0) continue;
      double wt = 0;
      if (s % 2 == 0 && b.batch.labels[static_cast<size_t>(t)] != kIgnoreIndex) wt += inv_tok;
      if (b.completion[static_cast<size_t>(t)])
        wt += -(s % 2 == 0 ? dc[static_cast<size_t>(s / 2)] : dr[static_cast<size_t>(s / 2)]) * w;
      weights[t] = static_cast<float>(wt);
    }
  }

 private:
  double beta_;
};

}  // namespace

std::unique_ptr<Objective> MakeOrpo(const ObjectiveOptions& o) {
  return std::make_unique<Orpo>(o);
}

}  // namespace st
