// Choosing the next token from a decoder's logits, as transformers' generate does: the logits
// processors in its order (repetition penalty, then, when sampling, temperature, top-k and top-p),
// then the argmax (greedy) or a draw from the softmax. The draws come from slicetrain's own seeded
// generator, so a seed reproduces a run here but not torch's sequence.
#pragma once

#include <cstdint>
#include <span>

#include "core/rng.h"
#include "core/status.h"

namespace st {

struct SamplingOptions {
  double temperature = 0.0;         // 0 = greedy (transformers' do_sample=False)
  int64_t top_k = 0;                // 0 = off
  double top_p = 1.0;               // 1 = off
  double repetition_penalty = 1.0;  // 1 = off; CTRL's penalty over the prompt and the output
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0; }
  // InvalidArgument naming the flag for a value transformers rejects too.
  Status Validate() const;
};

// The processors over logits [V] in place, given the ids so far (prompt and generated):
// - repetition penalty: every id that occurred (once, however often): x / p if x > 0, else x * p;
// - when sampling: / temperature; top-k keeps the logits >= the k-th largest (ties kept);
//   top-p keeps the smallest set of the largest whose probability reaches top_p (ascending
//   cumulative sum <= 1 - top_p removed, the largest always kept).
// Removed entries become -inf.
void ProcessLogits(const SamplingOptions& o, std::span<const int32_t> history,
                   std::span<float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {}
  // The next token: processes `logits` in place (ProcessLogits), then the argmax (the lowest id
  // among equal maxima, as torch.argmax) or a draw from their softmax.
  int32_t Next(std::span<const int32_t> history, std::span<float> logits);
  const SamplingOptions& options() const { return o_; }

 private:
  SamplingOptions o_;
  Rng rng_;
};

}  // namespace st
