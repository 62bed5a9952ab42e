#include "optim/adamw.h"

#include <cmath>

namespace st {

void AdamWStep(const AdamWConfig& cfg, int64_t step, float* params, const float* grads,
               float* exp_avg, float* exp_avg_sq, int64_t n) {
  // Scalars in double then rounded to fp32, as torch computes them from Python floats.
  const float decay = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
  const float w1 = static_cast<float>(1.0 - cfg.beta1);
  const float b2 = static_cast<float>(cfg.beta2), w2 = static_cast<float>(1.0 - cfg.beta2);
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  const float step_size = static_cast<float>(cfg.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(cfg.eps);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i];
    const float p = params[i] * decay;
    const float m = exp_avg[i] + w1 * (g - exp_avg[i]);  // torch's lerp_(grad, 1 - beta1)
    const float v = exp_avg_sq[i] * b2 + w2 * g * g;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] = p - step_size * (m / denom);
  }
}

double SumOfSquares(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

float ClipCoefficient(double total_norm, double max_norm) {
  const double coef = max_norm / (total_norm + 1e-6);
  return static_cast<float>(coef < 1.0 ? coef : 1.0);
}

}  // namespace st
