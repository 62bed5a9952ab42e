// Preference objectives (--objective dpo | orpo): the loss of a batch of pairs from the policy's
// per-token log-probs (and the reference's per-sequence sums), its gradient as per-token weights
// for the engine's backward (Batch::loss_weights), and the metrics TRL logs under the same names.
// One file per objective (dpo.cpp, orpo.cpp); the step that drives them is preference_step.h's.
// The math is TRL 1.16's DPOTrainer._compute_loss and ORPOTrainer.odds_ratio_loss; its goldens
// come from tools/make_dpo_fixtures.py.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/preference.h"

namespace st {

struct ObjectiveOptions {
  std::string objective = "sft";      // sft | dpo | orpo
  double beta = 0.1;                  // DPO's beta (IPO's tau); ORPO's lambda
  std::string loss_type = "sigmoid";  // DPO: sigmoid | ipo | hinge | robust
  double label_smoothing = 0;         // robust DPO's probability of a flipped label, in [0, 0.5)
};

// Flag checks (no files).
Status ValidateObjectiveOptions(const ObjectiveOptions& o);

// The global sums a loss is normalised by (all-reduced before the step): pairs, and the chosen
// sequences' labelled targets (ORPO's NLL mean).
struct ObjectiveNorm {
  double pairs = 0;
  double chosen_targets = 0;
};

// Per pair of a batch: the log-prob sums over the completion tokens, and the completions' token
// counts (TRL's completion_mask sums).
struct PairLogps {
  std::vector<double> chosen, rejected;
  std::vector<double> chosen_tokens, rejected_tokens;
};
// From per-token log-probs [B*T] aligned with the labels (Gemma4Engine::TargetLogProbs).
PairLogps SumPairLogps(const PairBatch& b, const float* logp);

class Objective {
 public:
  virtual ~Objective() = default;
  // The reference model's log-probs are needed (DPO), or not (ORPO).
  virtual bool needs_reference() const = 0;
  // The prompt tokens are labelled too (ORPO's NLL covers the whole chosen sequence).
  virtual bool label_prompt() const = 0;
  // The metric names, in the order Compute adds to `sums`; the first is the loss.
  virtual const std::vector<std::string>& metric_names() const = 0;
  // This rank's pairs: adds this rank's share of each global metric into sums (metric_names
  // order; normalised by `norm`, so the sum over ranks is the global batch's value) and, when
  // weights is not null, writes the weight of every label's token loss (-d loss / d logp) into
  // weights [B*T].
  virtual void Compute(const PairBatch& b, const float* logp, const PairLogps* ref,
                       const ObjectiveNorm& norm, double* sums, float* weights) const = 0;
};

// Numerically stable log sigmoid(x) and sigmoid(x), shared by the objectives.
inline double LogSigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}
inline double Sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

// "dpo" or "orpo"; InvalidArgument otherwise.
StatusOr<std::unique_ptr<Objective>> MakeObjective(const ObjectiveOptions& o);
std::unique_ptr<Objective> MakeDpo(const ObjectiveOptions& o);
std::unique_ptr<Objective> MakeOrpo(const ObjectiveOptions& o);

}  // namespace st
