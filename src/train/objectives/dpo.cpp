// DPO (Rafailov et al. 2023) as TRL's DPOTrainer computes it, loss types sigmoid, hinge, ipo and
// robust. With delta = (c - c_ref) - (r - r_ref), c and r the completions' summed log-probs:
//   sigmoid: -log sigmoid(beta delta)
//   hinge:   relu(1 - beta delta)
//   ipo:     (delta_avg - 1 / (2 beta))^2, delta_avg from per-token averages of c - c_ref, r -
//   r_ref robust:  (-(1 - e) log sigmoid(beta delta) + e log sigmoid(-beta delta)) / (1 - 2e)
// averaged over the global batch's pairs. rewards/* = beta x the log ratios.
#include <cmath>

#include "train/objectives/objective.h"

namespace st {
namespace {

enum class LossType { kSigmoid, kHinge, kIpo, kRobust };

class Dpo final : public Objective {
 public:
  explicit Dpo(const ObjectiveOptions& o) : beta_(o.beta), eps_(o.label_smoothing) {
    type_ = o.loss_type == "hinge"    ? LossType::kHinge
            : o.loss_type == "ipo"    ? LossType::kIpo
            : o.loss_type == "robust" ? LossType::kRobust
                                      : LossType::kSigmoid;
  }
  bool needs_reference() const override { return true; }
  bool label_prompt() const override { return false; }
  const std::vector<std::string>& metric_names() const override {
    static const std::vector<std::string> names = {"loss",
                                                   "rewards/chosen",
                                                   "rewards/rejected",
                                                   "rewards/accuracies",
                                                   "rewards/margins",
                                                   "logps/chosen",
                                                   "logps/rejected"};
    return names;
  }

  void Compute(const PairBatch& b, const float* logp, const PairLogps* ref,
               const ObjectiveNorm& norm, double* sums, float* weights) const override {
    ST_CHECK(ref != nullptr) << "DPO needs the reference log-probs";
    const PairLogps pol = SumPairLogps(b, logp);
    const int64_t P = b.pairs();
    std::vector<double> dc(static_cast<size_t>(P)), dr(static_cast<size_t>(P));  // d loss / d c, r
    for (int64_t k = 0; k < P; ++k) {
      const size_t i = static_cast<size_t>(k);
      const double cl = pol.chosen[i] - ref->chosen[i];
      const double rl = pol.rejected[i] - ref->rejected[i];
      const double delta = cl - rl;
      const double z = beta_ * delta;
      double loss = 0, g = 0;  // g: d loss / d delta
      switch (type_) {
        case LossType::kSigmoid:
          loss = -LogSigmoid(z);
          g = -beta_ * Sigmoid(-z);
          break;
        case LossType::kHinge:
          loss = std::max(0.0, 1.0 - z);
          g = 1.0 - z > 0 ? -beta_ : 0.0;
          break;
        case LossType::kRobust:
          loss = (-(1 - eps_) * LogSigmoid(z) + eps_ * LogSigmoid(-z)) / (1 - 2 * eps_);
          g = (-(1 - eps_) * beta_ * Sigmoid(-z) - eps_ * beta_ * Sigmoid(z)) / (1 - 2 * eps_);
          break;
        case LossType::kIpo: {
          const double nc = std::max(1.0, pol.chosen_tokens[i]);
          const double nr = std::max(1.0, pol.rejected_tokens[i]);
          const double u = cl / nc - rl / nr - 1.0 / (2.0 * beta_);
          loss = u * u;
          dc[i] = 2 * u / nc;
          dr[i] = -2 * u / nr;
          break;
        }
      }
      if (type_ != LossType::kIpo) dc[i] = g, dr[i] = -g;
      const double rc = beta_ * cl, rr = beta_ * rl, w = 1.0 / norm.pairs;
      sums[0] += w * loss;
      sums[1] += w * rc;
      sums[2] += w * rr;
      sums[3] += w * (rc > rr ? 1.0 : 0.0);
      sums[4] += w * (rc - rr);
      sums[5] += w * pol.chosen[i];
      sums[6] += w * pol.rejected[i];
    }
    if (!weights) return;
    const int64_t n = b.batch.B * b.batch.T;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = b.sequence[static_cast<size_t>(t)];
      weights[t] = 0.0f;
      if (s < 0 || !b.completion[static_cast<size_t>(t)]) continue;
      const size_t k = static_cast<size_t>(s / 2);
      // The token loss is -log p: its weight is -d loss / d log p, over the global pairs.
      weights[t] = static_cast<float>(-(s % 2 == 0 ? dc[k] : dr[k]) / norm.pairs);
    }
  }

 private:
  double beta_, eps_;
  LossType type_;
};

}  // namespace

PairLogps SumPairLogps(const PairBatch& b, const float* logp) {
  PairLogps out;
  const size_t P = static_cast<size_t>(b.pairs());
  out.chosen.assign(P, 0.0), out.rejected.assign(P, 0.0);
  out.chosen_tokens.assign(P, 0.0), out.rejected_tokens.assign(P, 0.0);
  const int64_t n = b.batch.B * b.batch.T;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = b.sequence[static_cast<size_t>(t)];
    if (s < 0 || !b.completion[static_cast<size_t>(t)]) continue;
    const size_t k = static_cast<size_t>(s / 2);
    (s % 2 == 0 ? out.chosen : out.rejected)[k] += logp[t];
    (s % 2 == 0 ? out.chosen_tokens : out.rejected_tokens)[k] += 1.0;
  }
  return out;
}

Status ValidateObjectiveOptions(const ObjectiveOptions& o) {
  if (o.objective != "sft" && o.objective != "dpo" && o.objective != "orpo")
    return InvalidArgument("--objective must be sft, dpo, orpo or grpo, got '" + o.objective + "'");
  if (o.objective == "sft") return Status::Ok();
  if (!(o.beta > 0) || !std::isfinite(o.beta))
    return InvalidArgument("--beta must be a positive number");
  if (o.loss_type != "sigmoid" && o.loss_type != "hinge" && o.loss_type != "ipo" &&
      o.loss_type != "robust")
    return InvalidArgument("--loss-type must be sigmoid, hinge, ipo or robust, got '" +
                           o.loss_type + "'");
  if (o.objective == "orpo" && o.loss_type != "sigmoid")
    return InvalidArgument("--loss-type is DPO's; ORPO has one loss (drop --loss-type)");
  if (!(o.label_smoothing >= 0 && o.label_smoothing < 0.5))
    return InvalidArgument("--label-smoothing must be in [0, 0.5)");
  if (o.label_smoothing > 0 && o.loss_type != "robust")
    return InvalidArgument(
        "--label-smoothing applies to --loss-type robust (TRL's sigmoid loss ignores it)");
  return Status::Ok();
}

StatusOr<std::unique_ptr<Objective>> MakeObjective(const ObjectiveOptions& o) {
  ST_RETURN_IF_ERROR(ValidateObjectiveOptions(o));
  if (o.objective == "dpo") return MakeDpo(o);
  if (o.objective == "orpo") return MakeOrpo(o);
  return InvalidArgument("--objective " + o.objective + " is not a preference objective");
}

std::unique_ptr<Objective> MakeDpo(const ObjectiveOptions& o) {
  return std::make_unique<Dpo>(o);
}

}  // namespace st
