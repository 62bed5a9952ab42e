// AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction, eps added after the
// square root) on flat fp32 buffers: under FSDP each rank steps its own shard. Also the global
// gradient-norm clipping of torch.nn.utils.clip_grad_norm_. Not a general optimizer framework.
#pragma once

#include <cstdint>

namespace st {

struct AdamWConfig {
  double lr = 2e-5;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// One step (step >= 1 counts steps taken including this one) over n elements:
//   p *= 1 - lr * wd;  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
void AdamWStep(const AdamWConfig& cfg, int64_t step, float* params, const float* grads,
               float* exp_avg, float* exp_avg_sq, int64_t n);

// Sum of squares of g[0..n) in double (a rank's share of the global norm).
double SumOfSquares(const float* g, int64_t n);

// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (total_norm + 1e-6)).
float ClipCoefficient(double total_norm, double max_norm);

}  // namespace st
