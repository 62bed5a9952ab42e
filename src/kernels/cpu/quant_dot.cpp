// Products of weights in ggml's 32-value blocks (Q8_0, Q4_0) with activations rounded to int8
// blocks first, as llama.cpp computes them (ggml's vec_dot_q8_0_q8_0 and vec_dot_q4_0_q8_0): per
// block one integer dot product of 32 codes, scaled by the weight block's and the activation
// block's scales. With AVX512-VNNI (VPDPBUSD: 32 unsigned x signed byte products summed into eight
// int32 per instruction on 256-bit registers) this takes far fewer instructions a block than
// widening the codes to fp32 against fp32 activations (the decoder's products before; measured in
// docs/gguf.md), which left decoding from 8- and 4-bit weights bound by arithmetic, not memory.
//
// The VNNI code is compiled under its own `#pragma GCC target` (avx512vnni is not part of any
// x86-64 level) and has internal linkage only, so none of its instantiations can be picked by the
// linker for baseline code (isa_kernels.h explains the hazard). It runs when the CPU has
// AVX512-VNNI and the kernels run at x86-64-v4 (SLICETRAIN_MAX_CPU_ISA below that turns it off,
// as it does every AVX-512 path); elsewhere plain integer loops compute the same integers.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops_cpu.h"

namespace st::cpu {
namespace {

constexpr int64_t kBlock = 32;

// Rounds rows of x to int8 blocks as ggml's quantize_row_q8_0_ref does (d = max|x| / 127, codes
// round-half-away(x / d); a block of zeros has d = 0), keeping d in fp32 (ggml stores it as fp16)
// and each block's sum of codes (Q4_0's offset of 8 is taken out through it).
struct Int8Rows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sum;

  void Quantize(const float* x, int64_t N, int64_t in) {
    const int64_t blocks = in / kBlock;
    q.resize(static_cast<size_t>(N * in));
    d.resize(static_cast<size_t>(N * blocks));
    sum.resize(static_cast<size_t>(N * blocks));
    for (int64_t i = 0; i < N * blocks; ++i) {
      const float* xb = x + i * kBlock;
      float amax = 0;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float dd = amax / 127.0f, id = dd != 0 ? 1.0f / dd : 0.0f;
      int32_t s = 0;
      int8_t* qb = q.data() + i * kBlock;
      for (int j = 0; j < kBlock; ++j) {
        const float v = std::round(xb[j] * id);
        qb[j] = v >= -127.0f && v <= 127.0f ? static_cast<int8_t>(v) : 0;  // NaN: 0, never UB
        s += qb[j];
      }
      d[static_cast<size_t>(i)] = dd;
      sum[static_cast<size_t>(i)] = s;
    }
  }
};

inline float BlockScale(const uint8_t* blk) {
  uint16_t h;
  std::memcpy(&h, blk, 2);
  return HalfToFloat(h);
}

// The plain loops: per block the integer dot product of the codes (Q4_0's nibble - 8), then the
// two scales.
void ProductPlain(GgmlType type, const Int8Rows& a, const uint8_t* w, float* y, int64_t N,
                  int64_t in, int64_t out) {
  const int64_t blocks = in / kBlock, bb = GgmlTypeOf(type).block_bytes, row_bytes = blocks * bb;
  const bool q4 = type == GgmlType::kQ4_0;
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* r = w + o * row_bytes;
    for (int64_t t = 0; t < N; ++t) {
      float acc = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = r + b * bb;
        const int8_t* xq = a.q.data() + t * in + b * kBlock;
        int32_t s = 0;
        if (q4) {
          for (int j = 0; j < 16; ++j) {
            s += ((blk[2 + j] & 0x0F) - 8) * xq[j];
            s += ((blk[2 + j] >> 4) - 8) * xq[j + 16];
          }
        } else {
          const auto* wq = reinterpret_cast<const int8_t*>(blk + 2);
          for (int j = 0; j < kBlock; ++j) s += wq[j] * xq[j];
        }
        acc += BlockScale(blk) * a.d[static_cast<size_t>(t * blocks + b)] * static_cast<float>(s);
      }
      y[t * out + o] = acc;
    }
  }
}

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves as (maybe)
// uninitialized: a false positive (isa_v4.cpp does the same).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

inline float HorizontalSum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// y[k * ldy] = x row k . weight row r for k < TN. A weight block's codes are loaded (and, for
// Q4_0, unpacked) once for all TN rows. VPDPBUSD multiplies unsigned by signed bytes: Q4_0's
// nibbles are unsigned (the offset of 8 comes off through the activation block's sum); Q8_0's
// signed codes go in as |w| with their signs moved onto the activations (VPSIGNB). A block per
// 256-bit step: two blocks per 512-bit step (one scale per half) measured no faster for Q4_0.
template <int TN, bool kQ4>
inline void VnniTile(const uint8_t* r, int64_t blocks, const int8_t* xq, const float* xd,
                     const int32_t* xsum, int64_t in, float* y, int64_t ldy) {
  constexpr int64_t bb = kQ4 ? 18 : 34;
  __m256 acc[TN];
  float offset[TN];
  for (int k = 0; k < TN; ++k) acc[k] = _mm256_setzero_ps(), offset[k] = 0;
  const __m128i nibble = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = r + b * bb;
    _mm_prefetch(reinterpret_cast<const char*>(blk + bb * 16), _MM_HINT_T0);
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const float dw = _cvtsh_ss(h);
    __m256i wu, ws;
    if constexpr (kQ4) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i lo = _mm_and_si128(q, nibble);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), nibble);
      wu = _mm256_set_m128i(hi, lo);
      ws = wu;
    } else {
      ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      wu = _mm256_abs_epi8(ws);
    }
    for (int k = 0; k < TN; ++k) {
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + k * in + b * kBlock));
      if constexpr (!kQ4) xv = _mm256_sign_epi8(xv, ws);
      const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xv);
      const float s = dw * xd[k * blocks + b];
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s), acc[k]);
      if constexpr (kQ4) offset[k] += s * static_cast<float>(8 * xsum[k * blocks + b]);
    }
  }
  for (int k = 0; k < TN; ++k) y[k * ldy] = HorizontalSum(acc[k]) - offset[k];
}

template <bool kQ4>
void ProductVnni(const Int8Rows& a, const uint8_t* w, float* y, int64_t N, int64_t in,
                 int64_t out) {
  const int64_t blocks = in / kBlock, row_bytes = blocks * (kQ4 ? 18 : 34);
#pragma omp parallel for schedule(static) if (out * in > (1 << 15))
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* r = w + o * row_bytes;
    for (int64_t t0 = 0; t0 < N; t0 += 4) {
      const int8_t* xq = a.q.data() + t0 * in;
      const float* xd = a.d.data() + t0 * blocks;
      const int32_t* xs = a.sum.data() + t0 * blocks;
      float* yt = y + t0 * out + o;
      switch (N - t0 < 4 ? N - t0 : 4) {  // no std:: templates under this target (see above)
        case 1:
          VnniTile<1, kQ4>(r, blocks, xq, xd, xs, in, yt, out);
          break;
        case 2:
          VnniTile<2, kQ4>(r, blocks, xq, xd, xs, in, yt, out);
          break;
        case 3:
          VnniTile<3, kQ4>(r, blocks, xq, xd, xs, in, yt, out);
          break;
        default:
          VnniTile<4, kQ4>(r, blocks, xq, xd, xs, in, yt, out);
          break;
      }
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool HasVnniBlockProducts() {
  return DetectCpu().avx512_vnni && ActiveKernelIsa() == KernelIsa::kX86_64_v4;
}

void LinearForwardBlocksInt8(GgmlType type, const float* x, const uint8_t* w, float* y, int64_t N,
                             int64_t in, int64_t out) {
  if (N == 0 || out == 0) return;
  ST_CHECK(type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0)
      << "LinearForwardBlocksInt8 takes Q8_0 or Q4_0 weights";
  ST_CHECK(in % kBlock == 0) << "LinearForwardBlocksInt8: rows of " << in
                             << " values are not 32-value blocks";
  thread_local Int8Rows a;
  a.Quantize(x, N, in);
  if (!HasVnniBlockProducts())
    ProductPlain(type, a, w, y, N, in, out);
  else if (type == GgmlType::kQ4_0)
    ProductVnni<true>(a, w, y, N, in, out);
  else
    ProductVnni<false>(a, w, y, N, in, out);
}

}  // namespace st::cpu
