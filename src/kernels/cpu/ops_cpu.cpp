#include "kernels/cpu/ops_cpu.h"

#include <cblas.h>
#include <omp.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/status.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/gelu.h"

namespace st::cpu {

void SetNumThreads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int NumThreads() {
  return omp_get_max_threads();
}

namespace {

// Elementwise loops below this many elements run on one thread (team start-up costs ~1-2 us).
constexpr int64_t kParallelMin = 1 << 14;

inline float FastGelu(float z) {
  return 0.5f * z * (1.0f + FastTanh(kGeluBeta * (z + kGeluKappa * z * z * z)));
}

}  // namespace

void LinearForward(const float* x, const float* w, float* y, int64_t N, int64_t in, int64_t out,
                   float alpha, bool accumulate) {
  if (N == 0 || out == 0) return;
  if (N == 1) {  // one token (decoding): a matrix-vector product, bound by reading w once
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, alpha, w, in, x, 1, accumulate ? 1.0f : 0.0f,
                y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, alpha, x, in, w, in,
              accumulate ? 1.0f : 0.0f, y, out);
}

// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves
// (_mm512_undefined_*) as maybe-uninitialized: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void LinearForwardBf16(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                       int64_t out, float* scratch) {
  if (N == 0 || out == 0) return;
  auto widen = [](uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); };
  if (N == 1) {
#ifdef __AVX512F__
    if (in % 32 == 0) {
      // Row by row, 32 weights per step. Unpacking 16-bit zeros below each bf16 gives the fp32
      // values in one instruction per 16, but in the order of the 128-bit lanes' low then high
      // quarters; x is permuted once into `scratch` to match. The weights are prefetched 2 KB
      // ahead (the hardware prefetcher alone leaves a fifth of the bandwidth unused here).
      float* xp = scratch;
      for (int64_t j = 0; j < in; j += 32)
        for (int lane = 0; lane < 4; ++lane)
          for (int k = 0; k < 4; ++k) {
            xp[j + lane * 4 + k] = x[j + lane * 8 + k];
            xp[j + 16 + lane * 4 + k] = x[j + lane * 8 + 4 + k];
          }
      const __m512i zero = _mm512_setzero_si512();
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
      for (int64_t o = 0; o < out; ++o) {
        const uint16_t* r = w + o * in;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t j = 0; j < in; j += 32) {
          _mm_prefetch(reinterpret_cast<const char*>(r + j + 1024), _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(r + j);
          a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)),
                               _mm512_loadu_ps(xp + j), a0);
          a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)),
                               _mm512_loadu_ps(xp + j + 16), a1);
        }
        y[o] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
      }
      return;
    }
#endif
    // Four rows at a time: four independent accumulations (the FMA latency is hidden) and each
    // x element loaded once for them.
    const int64_t blocks = (out + 3) / 4;
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t o = 4 * b;
      if (o + 4 <= out) {
        const uint16_t *r0 = w + o * in, *r1 = r0 + in, *r2 = r1 + in, *r3 = r2 + in;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (int64_t j = 0; j < in; ++j) {
          const float xj = x[j];
          a0 += xj * widen(r0[j]);
          a1 += xj * widen(r1[j]);
          a2 += xj * widen(r2[j]);
          a3 += xj * widen(r3[j]);
        }
        y[o] = a0, y[o + 1] = a1, y[o + 2] = a2, y[o + 3] = a3;
      } else {
        for (int64_t k = o; k < out; ++k) {
          const uint16_t* r = w + k * in;
          float acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < in; ++j) acc += x[j] * widen(r[j]);
          y[k] = acc;
        }
      }
    }
    return;
  }
  // Tiles of about kBf16TileElements weights: one threaded widening, one sgemm each.
  const int64_t tile = std::max<int64_t>(1, std::min(out, kBf16TileElements / in));
  for (int64_t o0 = 0; o0 < out; o0 += tile) {
    const int64_t rows = std::min(tile, out - o0);
    const int64_t n = rows * in;
    const uint16_t* src = w + o0 * in;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t j = 0; j < n; ++j) scratch[j] = widen(src[j]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, rows, in, 1.0f, x, in, scratch, in,
                0.0f, y + o0, out);
  }
}
#pragma GCC diagnostic pop

namespace {

inline float Widen(float v) {
  return v;
}
inline float Widen(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// GCC 12 warns inside _mm512_reduce_add_ps (a false positive, as above).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifdef __AVX512F__
inline __m512 Load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// y[k * ldy + {0, 1}] = x row k . w rows r0, r1 for k < TN (r1 written only when `two`).
template <int TN, typename W>
inline void FewRowsTile(const W* r0, const W* r1, const float* x, int64_t in, float* y, int64_t ldy,
                        bool two) {
  __m512 a0[TN], a1[TN];
  for (int k = 0; k < TN; ++k) a0[k] = a1[k] = _mm512_setzero_ps();
  for (int64_t j = 0; j < in; j += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(r0 + j + 512), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(r1 + j + 512), _MM_HINT_T0);
    const __m512 w0 = Load16(r0 + j), w1 = Load16(r1 + j);
    for (int k = 0; k < TN; ++k) {
      const __m512 xv = _mm512_loadu_ps(x + k * in + j);
      a0[k] = _mm512_fmadd_ps(w0, xv, a0[k]);
      a1[k] = _mm512_fmadd_ps(w1, xv, a1[k]);
    }
  }
  for (int k = 0; k < TN; ++k) {
    y[k * ldy] = _mm512_reduce_add_ps(a0[k]);
    if (two) y[k * ldy + 1] = _mm512_reduce_add_ps(a1[k]);
  }
}
#endif

template <typename W>
void LinearForwardFewRows(const float* x, const W* w, float* y, int64_t N, int64_t in,
                          int64_t out) {
  ST_CHECK(N >= 1 && N <= kFewRows) << "LinearForwardFew of " << N << " rows";
#ifdef __AVX512F__
  if (in % 16 == 0) {
    // Two weight rows against up to eight x rows per pass: 2 x TN accumulators in registers
    // (TN a compile-time count, so none spills), each 16-float step loading 2 weight and TN x
    // vectors for 2 x TN FMAs; the x rows stay in L1/L2, the weights stream once.
    const int64_t pairs = (out + 1) / 2;
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
    for (int64_t b = 0; b < pairs; ++b) {
      const int64_t o = 2 * b;
      const bool two = o + 1 < out;
      const W* r0 = w + o * in;
      const W* r1 = two ? r0 + in : r0;
      for (int64_t t0 = 0; t0 < N; t0 += 8) {
        const float* xt = x + t0 * in;
        float* yt = y + t0 * out + o;
        switch (std::min<int64_t>(8, N - t0)) {
          case 1:
            FewRowsTile<1>(r0, r1, xt, in, yt, out, two);
            break;
          case 2:
            FewRowsTile<2>(r0, r1, xt, in, yt, out, two);
            break;
          case 3:
            FewRowsTile<3>(r0, r1, xt, in, yt, out, two);
            break;
          case 4:
            FewRowsTile<4>(r0, r1, xt, in, yt, out, two);
            break;
          case 5:
            FewRowsTile<5>(r0, r1, xt, in, yt, out, two);
            break;
          case 6:
            FewRowsTile<6>(r0, r1, xt, in, yt, out, two);
            break;
          case 7:
            FewRowsTile<7>(r0, r1, xt, in, yt, out, two);
            break;
          default:
            FewRowsTile<8>(r0, r1, xt, in, yt, out, two);
            break;
        }
      }
    }
    return;
  }
#endif
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
  for (int64_t o = 0; o < out; ++o) {
    const W* r = w + o * in;
    for (int64_t t = 0; t < N; ++t) {
      const float* xt = x + t * in;
      float a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t j = 0; j < in; ++j) a += Widen(r[j]) * xt[j];
      y[t * out + o] = a;
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void LinearForwardFew(const float* x, const float* w, float* y, int64_t N, int64_t in,
                      int64_t out) {
  LinearForwardFewRows(x, w, y, N, in, out);
}

void LinearForwardFew(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                      int64_t out) {
  LinearForwardFewRows(x, w, y, N, in, out);
}

void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  if (N == 0) return;
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, alpha, dy, out, w, in,
                accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, alpha, dy, out, x, in, 1.0f,
                dw, in);
}

void LinearForwardMixed(const float* x, const float* w, float* y, int64_t N, int64_t in,
                        int64_t out, float alpha, bool accumulate) {
  if (N == 0 || out == 0) return;
  Gemm(Precision::kBf16, Trans::kNo, Trans::kYes, N, out, in, alpha, x, in, w, in,
       accumulate ? 1.0f : 0.0f, y, out);
}

void LinearBackwardMixed(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  if (N == 0) return;
  if (dx)
    Gemm(Precision::kBf16, Trans::kNo, Trans::kNo, N, in, out, alpha, dy, out, w, in,
         accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dw)
    Gemm(Precision::kBf16, Trans::kYes, Trans::kNo, out, in, N, alpha, dy, out, x, in, 1.0f, dw,
         in);
}

void EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C,
                      float scale) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* src = table + int64_t(ids[n]) * C;
    float* dst = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dst[c] = src[c] * scale;
  }
}

void EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C,
                       float scale, int32_t padding_id) {
  // Threads own disjoint column ranges, so repeated ids never race.
#pragma omp parallel if (N * C > kParallelMin)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;
    for (int64_t n = 0; n < N; ++n) {
      if (ids[n] == padding_id) continue;
      float* dst = dtable + int64_t(ids[n]) * C;
      const float* src = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += scale * src[c];
    }
  }
}

void RmsNormForward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                    float eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* yr = y + n * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    rstd[n] = r;
    if (w) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r;
    }
  }
}

void RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                     float* dw, int64_t N, int64_t C, bool accumulate_dx) {
#pragma omp parallel if (N * C > kParallelMin)
  {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* gr = dy + n * C;
      float* dxr = dx + n * C;
      const float r = rstd[n];
      float dot = 0;
      if (w) {
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; ++c) dot += gr[c] * w[c] * xr[c];
      } else {
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; ++c) dot += gr[c] * xr[c];
      }
      const float k = dot * r * r / static_cast<float>(C);  // mean(g * xhat) / rstd... folded
      if (w) {
        if (accumulate_dx) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dxr[c] += r * (gr[c] * w[c] - xr[c] * k);
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dxr[c] = r * (gr[c] * w[c] - xr[c] * k);
        }
      } else {
        if (accumulate_dx) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dxr[c] += r * (gr[c] - xr[c] * k);
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dxr[c] = r * (gr[c] - xr[c] * k);
        }
      }
    }
    if (dw) {
      // Column ranges per thread: dw[c] += sum_n dy[n,c] * x[n,c] * rstd[n], no reduction races.
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;
      for (int64_t n = 0; n < N; ++n) {
        const float* xr = x + n * C;
        const float* gr = dy + n * C;
        const float r = rstd[n];
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) dw[c] += gr[c] * xr[c] * r;
      }
    }
  }
}

void Rope(float* x, const float* cos, const float* sin, const int32_t* pos, int64_t B, int64_t T,
          int64_t heads, int64_t D, bool inverse) {
  const int64_t half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * heads * D > kParallelMin)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p_t = pos ? pos[b * T + t] : t;
      const float* cr = cos + p_t * half;
      const float* sr = sin + p_t * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + ((b * T + t) * heads + h) * D;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const float c = cr[j], s = sign * sr[j];
          const float x1 = p[j], x2 = p[j + half];
          p[j] = x1 * c - x2 * s;
          p[j + half] = x2 * c + x1 * s;
        }
      }
    }
}

void GeluMulForward(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = FastGelu(a[i]) * b[i];
}

void GeluMulBackward(const float* a, const float* b, const float* dout, float* da, float* db,
                     int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float z = a[i];
    const float t = FastTanh(kGeluBeta * (z + kGeluKappa * z * z * z));
    const float gelu = 0.5f * z * (1.0f + t);
    const float grad = 0.5f * (1.0f + t) +
                       0.5f * z * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * z * z);
    const float go = dout[i];
    da[i] = go * b[i] * grad;
    if (db) db[i] = go * gelu;
  }
}

void SoftcapForward(float* z, int64_t n, float cap) {
  if (cap <= 0) return;
  const float inv = 1.0f / cap;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) z[i] = FastTanh(z[i] * inv) * cap;
}

double CrossEntropyForward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t* valid) {
  double total = 0;
  int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, count) if (N * V > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == -100) continue;
    const float* z = logits + n * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += FastExp(z[j] - mx);
    total += std::log(double(sum)) + mx - z[targets[n]];
    ++count;
  }
  *valid = count;
  return total;
}

void CrossEntropySoftcapBackward(float* logits, const int32_t* targets, int64_t N, int64_t V,
                                 float cap, float scale) {
  const float inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* z = logits + n * V;
    const int32_t target = targets[n];
    if (target == -100) {
      std::memset(z, 0, static_cast<size_t>(V) * sizeof(float));
      continue;
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += FastExp(z[j] - mx);
    const float inv_sum = scale / sum;
    const float zt = z[target];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      const float t = z[j] * inv_cap;
      z[j] = FastExp(z[j] - mx) * inv_sum * (1.0f - t * t);
    }
    const float tt = zt * inv_cap;
    z[target] -= scale * (1.0f - tt * tt);
  }
}

void Add(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void Scale(float* y, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace st::cpu
