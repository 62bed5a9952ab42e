#include "parallel/ffn_parity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/ops_cpu.h"
#include "parallel/tensor_parallel.h"

namespace st::parallel {

namespace {
void SiluInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}
}  // namespace

StatusOr<double> FeedForwardTpParity(comm::ProcessGroup& tp_axis, const FfnParityOptions& o) {
  const int64_t B = o.batch, d = o.hidden, F = 4 * o.hidden;
  if (B < 1 || d < 1) return InvalidArgument("batch size and hidden dim must be positive");
  // Same seed on every rank: nn.Linear's default init range U(-1/sqrt(in), 1/sqrt(in)), x ~ N(0,1).
  Rng rng(o.seed);
  std::vector<float> w1(F * d), w2(d * F), x(B * d);  // [F, d], [d, F], [B, d]
  const double b1 = 1.0 / std::sqrt(static_cast<double>(d)),
               b2 = 1.0 / std::sqrt(static_cast<double>(F));
  for (auto& v : w1) v = static_cast<float>((2 * rng.Uniform() - 1) * b1);
  for (auto& v : w2) v = static_cast<float>((2 * rng.Uniform() - 1) * b2);
  for (auto& v : x) v = static_cast<float>(rng.Normal());

  // Single-device reference.
  std::vector<float> h(B * F), ref(B * d);  // [B, F], [B, d]
  cpu::LinearForward(x.data(), w1.data(), h.data(), B, d, F, 1.0f, false);
  SiluInPlace(h.data(), B * F);
  cpu::LinearForward(h.data(), w2.data(), ref.data(), B, F, d, 1.0f, false);
  for (int64_t i = 0; i < B * d; ++i) ref[i] += x[i];

  // Tensor parallel: w1 column-wise (output dim), w2 row-wise (input dim).
  ColwiseLinear l1(w1.data(), F, d, tp_axis);
  RowwiseLinear l2(w2.data(), d, F, tp_axis);
  std::vector<float> h_local(B * l1.out_local()), y(B * d);  // [B, F/P], [B, d]
  ST_RETURN_IF_ERROR(l1.Forward(x.data(), B, h_local.data()));
  SiluInPlace(h_local.data(), static_cast<int64_t>(h_local.size()));
  ST_RETURN_IF_ERROR(l2.Forward(h_local.data(), B, y.data(), tp_axis, o.collective));
  double max_diff = 0;
  for (int64_t i = 0; i < B * d; ++i)
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[i] + x[i]) - ref[i]));
  return max_diff;
}

}  // namespace st::parallel
