// gelu with the tanh approximation (transformers' "gelu_pytorch_tanh") and its derivative.
#pragma once

#include <cmath>

namespace st {

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

inline float GeluTanh(float z) {
  float inner = kGeluBeta * (z + kGeluKappa * z * z * z);
  return 0.5f * z * (1.0f + std::tanh(inner));
}

// d gelu / dz = 0.5 (1 + t) + 0.5 z (1 - t^2) beta (1 + 3 kappa z^2)
inline float GeluTanhGrad(float z) {
  float inner = kGeluBeta * (z + kGeluKappa * z * z * z);
  float t = std::tanh(inner);
  return 0.5f * (1.0f + t) +
         0.5f * z * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * z * z);
}

}  // namespace st
