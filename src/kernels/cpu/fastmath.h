// Branch-free float exp and tanh that GCC auto-vectorises (no libm calls in hot loops; check
// with -fopt-info-vec when editing).
// exp: Cephes expf polynomial, ~1 ulp on [-87, 88]; tanh: Cephes tanhf (odd polynomial below
// 0.625, exp formula above), ~2 ulp. Tested against libm in tests/test_kernels.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace st::cpu {

inline float FastExp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: plain arithmetic, so the loop vectorises
  // (std::floor is a libm call unless -fno-trapping-math, which the build sets, but keep it safe).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

inline float FastTanh(float x) {
  const float ax = std::fabs(x);
  // Large |x|: 1 - 2 / (exp(2|x|) + 1), sign restored.
  const float e = FastExp(2.0f * ax);
  const float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  // Small |x|: odd polynomial.
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  return ax < 0.625f ? small : big;
}

}  // namespace st::cpu
