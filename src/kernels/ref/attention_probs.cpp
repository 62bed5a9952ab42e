// The previous fast CPU attention (query blocks of 64 rows, each block's scores, softmax and P V
// over the union of its rows' visible key ranges, probabilities [B,H,T,T] kept for the backward),
// moved here unchanged as the oracle and benchmark baseline of the tiled kernel.
#include "kernels/ref/attention_probs.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fastmath.h"

namespace st::ref {

using cpu::FastExp;

namespace {

// Per-thread scratch that grows to the largest request and is then reused.
float* Scratch(int64_t count) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

constexpr int64_t kQueryBlock = 64;

// The key range [lo, hi) that covers every visible key of query rows [q0, q1); a row with no
// visible key widens it to all T keys (it attends uniformly, see AttnMask).
struct KeyRange {
  int64_t lo, hi;
};

bool RowHasVisibleKey(const AttnMask& m, int64_t b, int64_t T, int64_t q) {
  const int64_t lo = m.Lo(b, T, q);
  if (m.pad == nullptr) return true;
  for (int64_t k = lo; k <= q; ++k)
    if (m.pad[b * T + k]) return true;
  return false;
}

KeyRange BlockKeyRange(const AttnMask& m, int64_t b, int64_t T, int64_t q0, int64_t q1,
                       bool* any_empty) {
  *any_empty = false;
  for (int64_t q = q0; q < q1; ++q)
    if (!RowHasVisibleKey(m, b, T, q)) *any_empty = true;
  if (*any_empty) return {0, T};
  return {m.Lo(b, T, q0), q1};  // Lo is nondecreasing along the row
}

// Softmax of row i over its visible keys inside [lo, hi); other entries of [lo, hi) become 0.
// A row without visible keys gets 1/T on all T keys.
void SoftmaxRow(float* row, const AttnMask& m, int64_t b, int64_t T, int64_t i, KeyRange r) {
  const int64_t vis_lo = std::max(r.lo, m.Lo(b, T, i));
  const int64_t vis_hi = std::min(r.hi, i + 1);
  const uint8_t* pad = m.pad ? m.pad + b * T : nullptr;
  float mx = -INFINITY;
  bool any = false;
  for (int64_t j = vis_lo; j < vis_hi; ++j)
    if (!pad || pad[j]) {
      mx = std::max(mx, row[j]);
      any = true;
    }
  if (!any) {
    for (int64_t j = 0; j < T; ++j) row[j] = 1.0f / static_cast<float>(T);
    return;
  }
  for (int64_t j = r.lo; j < vis_lo; ++j) row[j] = 0;
  for (int64_t j = vis_hi; j < r.hi; ++j) row[j] = 0;
  float sum = 0;
  if (pad) {
    for (int64_t j = vis_lo; j < vis_hi; ++j) {
      const float e = pad[j] ? FastExp(row[j] - mx) : 0.0f;
      row[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = vis_lo; j < vis_hi; ++j) {
      const float e = FastExp(row[j] - mx);
      row[j] = e;
      sum += e;
    }
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = vis_lo; j < vis_hi; ++j) row[j] *= inv;
}

}  // namespace

void AttentionProbsForward(const float* q, const float* k, const float* v, float* out, float* probs,
                           int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                           const AttnMask& mask) {
  const int64_t group = H / Hkv;
  const int64_t ldq = H * D, ldk = Hkv * D;
  // One (batch, head) per task; BLAS calls inside a parallel region run single-threaded.
#pragma omp parallel for schedule(dynamic, 1) if (B * H >= omp_get_max_threads() && B * H > 1)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, g = h / group;
    const float* qb = q + b * T * ldq + h * D;
    const float* kb = k + b * T * ldk + g * D;
    const float* vb = v + b * T * ldk + g * D;
    float* ob = out + b * T * ldq + h * D;
    float* pb = probs + bh * T * T;
    for (int64_t q0 = 0; q0 < T; q0 += kQueryBlock) {
      const int64_t q1 = std::min(T, q0 + kQueryBlock), rows = q1 - q0;
      bool any_empty;
      const KeyRange r = BlockKeyRange(mask, b, T, q0, q1, &any_empty);
      const int64_t cols = r.hi - r.lo;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, 1.0f, qb + q0 * ldq, ldq,
                  kb + r.lo * ldk, ldk, 0.0f, pb + q0 * T + r.lo, T);
      for (int64_t i = q0; i < q1; ++i) SoftmaxRow(pb + i * T, mask, b, T, i, r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f,
                  pb + q0 * T + r.lo, T, vb + r.lo * ldk, ldk, 0.0f, ob + q0 * ldq, ldq);
    }
  }
}

void AttentionProbsBackward(const float* q, const float* k, const float* v, const float* probs,
                            const float* dout, float* dq, float* dk, float* dv, int64_t B,
                            int64_t T, int64_t H, int64_t Hkv, int64_t D, const AttnMask& mask) {
  const int64_t group = H / Hkv;
  const int64_t ldq = H * D, ldk = Hkv * D;
  // One (batch, kv head) per task: the query heads of a group all add into the same dk/dv.
#pragma omp parallel for schedule(dynamic, 1) if (B * Hkv >= omp_get_max_threads() && B * Hkv > 1)
  for (int64_t bg = 0; bg < B * Hkv; ++bg) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    const float* kb = k + b * T * ldk + g * D;
    const float* vb = v + b * T * ldk + g * D;
    float* dkb = dk + b * T * ldk + g * D;
    float* dvb = dv + b * T * ldk + g * D;
    float* ds = Scratch(kQueryBlock * T);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* qb = q + b * T * ldq + h * D;
      const float* gob = dout + b * T * ldq + h * D;
      float* dqb = dq + b * T * ldq + h * D;
      const float* pb = probs + (b * H + h) * T * T;
      for (int64_t q0 = 0; q0 < T; q0 += kQueryBlock) {
        const int64_t q1 = std::min(T, q0 + kQueryBlock), rows = q1 - q0;
        bool any_empty;
        const KeyRange r = BlockKeyRange(mask, b, T, q0, q1, &any_empty);
        const int64_t cols = r.hi - r.lo;
        // dP = dO V^T over the block's key range.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, 1.0f, gob + q0 * ldq,
                    ldq, vb + r.lo * ldk, ldk, 0.0f, ds, cols);
        // dS = P * (dP - rowsum(P * dP))
        for (int64_t i = 0; i < rows; ++i) {
          const float* p = pb + (q0 + i) * T + r.lo;
          float* d = ds + i * cols;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j < cols; ++j) dot += p[j] * d[j];
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) d[j] = p[j] * (d[j] - dot);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f, ds, cols,
                    kb + r.lo * ldk, ldk, 0.0f, dqb + q0 * ldq, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, ds, cols,
                    qb + q0 * ldq, ldq, 1.0f, dkb + r.lo * ldk, ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.0f,
                    pb + q0 * T + r.lo, T, gob + q0 * ldq, ldq, 1.0f, dvb + r.lo * ldk, ldk);
      }
    }
  }
}

}  // namespace st::ref
