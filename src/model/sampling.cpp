#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace st {

Status SamplingOptions::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0)
    return InvalidArgument(StrCat("--temperature must be >= 0 (0 = greedy), got ", temperature));
  if (top_k < 0) return InvalidArgument(StrCat("--top-k must be >= 0 (0 = off), got ", top_k));
  if (!(top_p >= 0.0 && top_p <= 1.0))
    return InvalidArgument(StrCat("--top-p must be in [0, 1] (1 = off), got ", top_p));
  if (!(repetition_penalty > 0.0) || !std::isfinite(repetition_penalty))
    return InvalidArgument(
        StrCat("--repetition-penalty must be > 0 (1 = off), got ", repetition_penalty));
  return Status::Ok();
}

void ProcessLogits(const SamplingOptions& o, std::span<const int32_t> history,
                   std::span<float> logits) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const float ninf = -std::numeric_limits<float>::infinity();
  if (o.repetition_penalty != 1.0) {
    const float p = static_cast<float>(o.repetition_penalty);
    std::vector<int32_t> seen(history.begin(), history.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= V) continue;
      float& x = logits[static_cast<size_t>(id)];
      x = x < 0 ? x * p : x / p;
    }
  }
  if (o.greedy()) return;
  if (o.temperature != 1.0) {
    const float t = static_cast<float>(o.temperature);
    for (float& x : logits) x /= t;
  }
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(),
                     std::greater<float>());
    const float kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (float& x : logits)
      if (x < kth) x = ninf;
  }
  if (o.top_p < 1.0) {
    // Ascending order; the softmax's cumulative sum from the smallest; entries whose sum stays
    // <= 1 - top_p go, except the largest.
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] < logits[static_cast<size_t>(b)];
    });
    const float m = logits[static_cast<size_t>(order.back())];
    float sum = 0;
    for (float x : logits) sum += std::exp(x - m);
    const float limit = static_cast<float>(1.0 - o.top_p);
    float cum = 0;
    for (int64_t j = 0; j + 1 < V; ++j) {
      float& x = logits[static_cast<size_t>(order[static_cast<size_t>(j)])];
      cum += std::exp(x - m) / sum;
      if (cum <= limit) x = ninf;
    }
  }
}

int32_t Sampler::Next(std::span<const int32_t> history, std::span<float> logits) {
  ProcessLogits(o_, history, logits);
  const int64_t V = static_cast<int64_t>(logits.size());
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (logits[static_cast<size_t>(v)] > logits[static_cast<size_t>(best)]) best = v;
  if (o_.greedy()) return static_cast<int32_t>(best);
  const float m = logits[static_cast<size_t>(best)];
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - m));
  const double u = rng_.Uniform() * sum;
  double cum = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double p = std::exp(static_cast<double>(logits[static_cast<size_t>(v)] - m));
    cum += p;
    if (u < cum && p > 0) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(best);
}

}  // namespace st
