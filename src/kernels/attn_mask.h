// Which keys a query may see in causal self-attention (shared by every attention backend).
#pragma once

#include <algorithm>
#include <cstdint>

namespace st {

struct AttnMask {
  // [B,T], nonzero = real token, 0 = padding; null means no padding. Padding keys are never
  // visible.
  const uint8_t* pad = nullptr;
  // Sliding window W: query q sees keys k with q - W < k <= q. 0 = full causal attention.
  int64_t window = 0;
  // [B,T] or null: the first key each query may see, the first token of its document when several
  // examples are packed into one row (document masking: no token attends across an example
  // boundary, and a sliding window restarts with each example). Nondecreasing along a row, and
  // start[q] <= q. null = 0 for every query.
  const int32_t* start = nullptr;

  // The first key query q of row b may see (window and document); its last is q itself.
  int64_t Lo(int64_t b, int64_t T, int64_t q) const {
    int64_t lo = window > 0 ? std::max<int64_t>(0, q - window + 1) : 0;
    if (start != nullptr) lo = std::max<int64_t>(lo, start[b * T + q]);
    return lo;
  }
  bool Visible(int64_t b, int64_t T, int64_t q, int64_t k) const {
    if (k > q || k < Lo(b, T, q)) return false;
    return pad == nullptr || pad[b * T + k] != 0;
  }
};

}  // namespace st
