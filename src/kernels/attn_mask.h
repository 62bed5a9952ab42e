// Which keys a query may see in causal self-attention (shared by every attention backend).
#pragma once

#include <cstdint>

namespace st {

struct AttnMask {
  // [B,T], nonzero = real token, 0 = padding; null means no padding. Padding keys are never
  // visible.
  const uint8_t* pad = nullptr;
  // Sliding window W: query q sees keys k with q - W < k <= q. 0 = full causal attention.
  int64_t window = 0;

  bool Visible(int64_t b, int64_t T, int64_t q, int64_t k) const {
    if (k > q) return false;
    if (window > 0 && k <= q - window) return false;
    return pad == nullptr || pad[b * T + k] != 0;
  }
};

}  // namespace st
