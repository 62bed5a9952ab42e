// Helpers shared by the tests: random buffers and error metrics.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace st::test {

inline std::vector<float> RandomVec(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal()) * scale;
  return v;
}

// max |a - b| / max(max |b|, tiny): error relative to the tensor's scale.
inline double RelError(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}
inline double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  return RelError(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}

inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

}  // namespace st::test
