// The previous fast CPU attention, which materialises the probabilities [B,H,T,T]: kept as an
// independent oracle for the tiled kernel (tests/test_kernels.cpp) and as the baseline in
// bench/bench_kernels.cpp. Not used in training: its memory is quadratic in T.
#pragma once

#include <cstdint>

#include "kernels/attn_mask.h"

namespace st::ref {

// Causal self-attention with grouped KV heads (query head h uses kv head h / (H/Hkv)), scale 1.0.
// q/out [B,T,H,D], k/v [B,T,Hkv,D], probs [B,H,T,T] (entries outside a row's visible keys are 0 or
// never written). A query row with no visible key attends uniformly (1/T) to all T keys.
void AttentionProbsForward(const float* q, const float* k, const float* v, float* out, float* probs,
                           int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                           const AttnMask& mask);
// dq (overwritten) [B,T,H,D]; dk, dv [B,T,Hkv,D] are accumulated into. probs is the forward's.
void AttentionProbsBackward(const float* q, const float* k, const float* v, const float* probs,
                            const float* dout, float* dq, float* dk, float* dv, int64_t B,
                            int64_t T, int64_t H, int64_t Hkv, int64_t D, const AttnMask& mask);

}  // namespace st::ref
