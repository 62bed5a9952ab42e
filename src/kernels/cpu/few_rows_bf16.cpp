// y[N,out] = x[N,in] . w[out,in]^T for a few rows with x and w both in bf16 (ops_cpu.h's
// LinearForwardFewBf16): the batched decoder's steps under --precision bf16.
//
// Why not the widening kernel (LinearForwardFew on bf16 weights): it widens every weight to fp32
// and spends one FMA per product, so at eight rows it is bound by FMA throughput and by the fp32
// x rows it reloads (eight rows of 2048 floats do not fit L1), not by the weight bytes it
// streams. VDPBF16PS takes two bf16 products per fp32 lane and instruction and reads x in bf16:
// half the instructions and half the x bytes. Why not oneDNN's bf16 matmul (GemmBf16): it runs at
// M = 8, but slower than this on a Zen 4: half the rate on cached weights, about 0.85x streaming
// them from memory (docs/grpo.md, "Speed", has the measurement).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"

namespace st::cpu {

namespace {

// The reference semantics: the bf16 values widened exactly to fp32, fp32 products and sums (the
// result equals VDPBF16PS's up to the summation order). Runs where the CPU lacks AVX512-BF16
// (there --precision bf16 is refused, ResolvePrecision, so only tests call it) or the kernels are
// capped below x86-64-v4 (SLICETRAIN_MAX_CPU_ISA).
void FewRowsBf16Plain(const uint16_t* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                      int64_t out) {
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
  for (int64_t o = 0; o < out; ++o) {
    const uint16_t* r = w + o * in;
    for (int64_t t = 0; t < N; ++t) {
      const uint16_t* xt = x + t * in;
      float a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t j = 0; j < in; ++j) a += BF16ToFloat(r[j]) * BF16ToFloat(xt[j]);
      y[t * out + o] = a;
    }
  }
}

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves (inside
// _mm512_reduce_add_ps) as maybe-uninitialized: a false positive (isa_v4.cpp does the same).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

inline __m512bh Load32(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}
inline __m512bh Load32(const uint16_t* p, __mmask32 m) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, p));
}

// How far ahead of each weight row the loop prefetches, in values (4 KB): each 64-byte line of
// weights feeds 8 x 32 products here, so the hardware prefetcher alone falls behind memory;
// bench_rollout on a Zen 4 ran fastest at 2048 among 512-8192 (within its ~10 % noise).
constexpr int64_t kPrefetch = 2048;

// y[k * ldy + {0, 1}] = x row k . w rows r0, r1 for k < TN (r1 written only when `two`): 2 x TN
// accumulators in registers; each 32-value step loads 2 weight vectors and TN x vectors for 2 x TN
// VDPBF16PS. A tail of in % 32 values is loaded under a mask (zeros add nothing).
template <int TN>
inline void Tile(const uint16_t* r0, const uint16_t* r1, const uint16_t* x, int64_t in, float* y,
                 int64_t ldy, bool two) {
  __m512 a0[TN], a1[TN];
  for (int k = 0; k < TN; ++k) a0[k] = a1[k] = _mm512_setzero_ps();
  const int64_t body = in - in % 32;
  for (int64_t j = 0; j < body; j += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(r0 + j + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(r1 + j + kPrefetch), _MM_HINT_T0);
    const __m512bh w0 = Load32(r0 + j), w1 = Load32(r1 + j);
    for (int k = 0; k < TN; ++k) {
      const __m512bh xv = Load32(x + k * in + j);
      a0[k] = _mm512_dpbf16_ps(a0[k], w0, xv);
      a1[k] = _mm512_dpbf16_ps(a1[k], w1, xv);
    }
  }
  if (body < in) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (in - body)) - 1);
    const __m512bh w0 = Load32(r0 + body, m), w1 = Load32(r1 + body, m);
    for (int k = 0; k < TN; ++k) {
      const __m512bh xv = Load32(x + k * in + body, m);
      a0[k] = _mm512_dpbf16_ps(a0[k], w0, xv);
      a1[k] = _mm512_dpbf16_ps(a1[k], w1, xv);
    }
  }
  for (int k = 0; k < TN; ++k) {
    y[k * ldy] = _mm512_reduce_add_ps(a0[k]);
    if (two) y[k * ldy + 1] = _mm512_reduce_add_ps(a1[k]);
  }
}

void FewRowsBf16Avx512(const uint16_t* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                       int64_t out) {
  // Pairs of weight rows, each read once for up to eight x rows per pass (the x rows, N x in
  // bf16, stay in L1/L2; the weights stream from memory once).
  const int64_t pairs = (out + 1) / 2;
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
  for (int64_t b = 0; b < pairs; ++b) {
    const int64_t o = 2 * b;
    const bool two = o + 1 < out;
    const uint16_t* r0 = w + o * in;
    const uint16_t* r1 = two ? r0 + in : r0;
    for (int64_t t0 = 0; t0 < N; t0 += 8) {
      const uint16_t* xt = x + t0 * in;
      float* yt = y + t0 * out + o;
      switch (std::min<int64_t>(8, N - t0)) {
        case 1:
          Tile<1>(r0, r1, xt, in, yt, out, two);
          break;
        case 2:
          Tile<2>(r0, r1, xt, in, yt, out, two);
          break;
        case 3:
          Tile<3>(r0, r1, xt, in, yt, out, two);
          break;
        case 4:
          Tile<4>(r0, r1, xt, in, yt, out, two);
          break;
        case 5:
          Tile<5>(r0, r1, xt, in, yt, out, two);
          break;
        case 6:
          Tile<6>(r0, r1, xt, in, yt, out, two);
          break;
        case 7:
          Tile<7>(r0, r1, xt, in, yt, out, two);
          break;
        default:
          Tile<8>(r0, r1, xt, in, yt, out, two);
          break;
      }
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool HasAvx512Bf16FewRows() {
  return DetectCpu().avx512_bf16 && ActiveKernelIsa() == KernelIsa::kX86_64_v4;
}

void LinearForwardFewBf16(const uint16_t* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                          int64_t out) {
  ST_CHECK(N >= 1 && N <= kFewRows) << "LinearForwardFewBf16 of " << N << " rows";
  if (HasAvx512Bf16FewRows())
    FewRowsBf16Avx512(x, w, y, N, in, out);
  else
    FewRowsBf16Plain(x, w, y, N, in, out);
}

}  // namespace st::cpu
