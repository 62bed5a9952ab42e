// Products of weights in ggml's blocks (Q8_0, Q4_0, Q5_0 of 32 values; Q4_K, Q6_K super-blocks of
// 256) with activations rounded to int8 blocks of 32 first, as llama.cpp computes them (ggml's
// vec_dot_q8_0_q8_0, vec_dot_q4_0_q8_0, ...): per 32 values one integer dot product of the codes,
// scaled by the weight's and the activation block's scales. With AVX512-VNNI (VPDPBUSD: 32
// unsigned x signed byte products summed into eight int32 per instruction on 256-bit registers)
// or AVX2 (VPMADDUBSW and VPMADDWD for the same) this takes far fewer instructions a block than
// widening the codes to fp32 against fp32 activations (the decoder's products before; measured in
// docs/gguf.md), which left decoding from 8- and 4-bit weights bound by arithmetic, not memory.
//
// Unlike llama.cpp, the K-quants meet the same 32-value activation blocks as the others (ggml
// rounds activations per 256 for them, Q8_K): one activation format for every type of a mixture
// (q4_k_m holds Q4_K, Q6_K, Q5_0, Q8_0 and fp32 matrices), and a finer rounding. Q4_K's sub-blocks
// are 32 values, so each meets one activation block; Q6_K's are 16, two to an activation block,
// their two scales in the two halves of the eight int32 lanes a byte dot product leaves.
//
// The SIMD tiles (quant_dot_tiles.inc) are compiled twice, for AVX2 and for AVX512-VNNI, each under
// its own `#pragma GCC target` (avx512vnni is not part of any x86-64 level) with internal linkage
// only, so none of their instantiations can be picked by the linker for baseline code
// (isa_kernels.h explains the hazard). VNNI runs when the CPU has AVX512-VNNI and the kernels run
// at x86-64-v4, AVX2 at x86-64-v3 (SLICETRAIN_MAX_CPU_ISA lowers both, as it does every path);
// below that plain integer loops compute the same integers.
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
#include "kernels/cpu/quant.h"

namespace st::cpu {
namespace {

constexpr int64_t kBlock = 32;   // values per activation block (and per Q8_0/Q4_0/Q5_0 block)
constexpr int64_t kSuper = 256;  // values per K-quant super-block

// Rounds rows of x to int8 blocks as ggml's quantize_row_q8_0_ref does (d = max|x| / 127, codes
// round-half-away(x / d); a block of zeros has d = 0), keeping d in fp32 (ggml stores it as fp16),
// with what the weights' offsets and minimums are taken out through: per block d times its sum of
// codes (ds), and per 16 values d times their sum (ds16, for Q6_K's 16-value sub-blocks).
struct Int8Rows {
  std::vector<int8_t> q;
  std::vector<float> d, ds, ds16;

  void Quantize(const float* x, int64_t N, int64_t in) {
    const int64_t blocks = in / kBlock;
    q.resize(static_cast<size_t>(N * in));
    d.resize(static_cast<size_t>(N * blocks));
    ds.resize(static_cast<size_t>(N * blocks));
    ds16.resize(static_cast<size_t>(2 * N * blocks));
    for (int64_t i = 0; i < N * blocks; ++i) {
      const float* xb = x + i * kBlock;
      float amax = 0;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float dd = amax / 127.0f, id = dd != 0 ? 1.0f / dd : 0.0f;
      int32_t s[2] = {0, 0};
      int8_t* qb = q.data() + i * kBlock;
      for (int j = 0; j < kBlock; ++j) {
        const float v = std::round(xb[j] * id);
        qb[j] = v >= -127.0f && v <= 127.0f ? static_cast<int8_t>(v) : 0;  // NaN: 0, never UB
        s[j / 16] += qb[j];
      }
      const size_t u = static_cast<size_t>(i);
      d[u] = dd;
      ds[u] = dd * static_cast<float>(s[0] + s[1]);
      ds16[2 * u] = dd * static_cast<float>(s[0]);
      ds16[2 * u + 1] = dd * static_cast<float>(s[1]);
    }
  }
};

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// The 32 weights of a row that meet activation block j, as w = scale[l / 16] * code - min.
struct Codes32 {
  int32_t code[kBlock];
  float scale[2];
  float min;
};

void DecodeCodes(GgmlType type, const uint8_t* row, int64_t j, Codes32* c) {
  c->min = 0;
  switch (type) {
    case GgmlType::kQ8_0: {
      const uint8_t* blk = row + j * 34;
      c->scale[0] = c->scale[1] = HalfAt(blk);
      for (int l = 0; l < kBlock; ++l) c->code[l] = static_cast<int8_t>(blk[2 + l]);
      return;
    }
    case GgmlType::kQ4_0: {
      const uint8_t* blk = row + j * 18;
      c->scale[0] = c->scale[1] = HalfAt(blk);
      for (int l = 0; l < 16; ++l) {
        c->code[l] = (blk[2 + l] & 0x0F) - 8;
        c->code[l + 16] = (blk[2 + l] >> 4) - 8;
      }
      return;
    }
    case GgmlType::kQ5_0: {
      const uint8_t* blk = row + j * 22;
      c->scale[0] = c->scale[1] = HalfAt(blk);
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      for (int l = 0; l < 16; ++l) {
        c->code[l] = static_cast<int32_t>((blk[6 + l] & 0x0F) | (((qh >> l) & 1u) << 4)) - 16;
        c->code[l + 16] =
            static_cast<int32_t>((blk[6 + l] >> 4) | (((qh >> (l + 16)) & 1u) << 4)) - 16;
      }
      return;
    }
    case GgmlType::kQ4_K: {  // sub-block j % 8: the low (even) or high (odd) nibbles of 32 bytes
      const uint8_t* blk = row + (j / 8) * 144;
      const int sub = static_cast<int>(j % 8);
      uint8_t sc, m;
      Q4KScaleMin(sub, blk + 4, &sc, &m);
      c->scale[0] = c->scale[1] = HalfAt(blk) * sc;
      c->min = HalfAt(blk + 2) * m;
      const uint8_t* q = blk + 16 + 32 * (sub / 2);
      for (int l = 0; l < kBlock; ++l) c->code[l] = sub % 2 ? q[l] >> 4 : q[l] & 0x0F;
      return;
    }
    case GgmlType::kQ6_K: {  // half j % 8 / 4 of the super-block, quarter j % 4 of that half
      const uint8_t* blk = row + (j / 8) * 210;
      const int half = static_cast<int>(j % 8 / 4), k = static_cast<int>(j % 4);
      const uint8_t* ql = blk + 64 * half + 32 * (k % 2);
      const uint8_t* qh = blk + 128 + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * half);
      const float d = HalfAt(blk + 208);
      c->scale[0] = d * sc[2 * k];
      c->scale[1] = d * sc[2 * k + 1];
      for (int l = 0; l < kBlock; ++l) {
        const int low = k < 2 ? ql[l] & 0x0F : ql[l] >> 4;
        c->code[l] = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      }
      return;
    }
    default:
      ST_CHECK(false) << "no int8 product for " << GgmlTypeOf(type).name;
  }
}

// The plain loops: per block of a weight row its codes once, then for every row of x the integer
// dot products of each 16-value half and the scales.
void ProductPlain(GgmlType type, const Int8Rows& a, const uint8_t* w, float* y, int64_t N,
                  int64_t in, int64_t out) {
  const int64_t blocks = in / kBlock;
  const size_t row_bytes = GgmlRowBytes(type, in);
#pragma omp parallel if (out * in > (1 << 15))
  {
    std::vector<float> acc(static_cast<size_t>(N));
    Codes32 c;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* r = w + o * static_cast<int64_t>(row_bytes);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = 0; b < blocks; ++b) {
        DecodeCodes(type, r, b, &c);
        for (int64_t t = 0; t < N; ++t) {
          const int8_t* xq = a.q.data() + t * in + b * kBlock;
          int32_t s0 = 0, s1 = 0;
          for (int l = 0; l < 16; ++l) s0 += c.code[l] * xq[l];
          for (int l = 16; l < kBlock; ++l) s1 += c.code[l] * xq[l];
          const size_t u = static_cast<size_t>(t * blocks + b);
          acc[static_cast<size_t>(t)] +=
              a.d[u] * (c.scale[0] * static_cast<float>(s0) + c.scale[1] * static_cast<float>(s1)) -
              c.min * a.ds[u];
        }
      }
      for (int64_t t = 0; t < N; ++t) y[t * out + o] = acc[static_cast<size_t>(t)];
    }
  }
}

// The SIMD tiles, once per instruction set (quant_dot_tiles.inc), with internal linkage.
#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c")
namespace avx2 {
#define ST_DOT_VNNI 0
#include "kernels/cpu/quant_dot_tiles.inc"
#undef ST_DOT_VNNI
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves as (maybe)
// uninitialized: a false positive (isa_v4.cpp does the same).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace vnni {
#define ST_DOT_VNNI 1
#include "kernels/cpu/quant_dot_tiles.inc"
#undef ST_DOT_VNNI
}  // namespace vnni
#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool HasVnniBlockProducts() {
  return DetectCpu().avx512_vnni && ActiveKernelIsa() == KernelIsa::kX86_64_v4;
}

const char* BlockProductPath() {
  if (HasVnniBlockProducts()) return "AVX512-VNNI";
  return ActiveKernelIsa() >= KernelIsa::kX86_64_v3 ? "AVX2" : "plain";
}

bool HasInt8BlockProduct(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ5_0 ||
         type == GgmlType::kQ4_K || type == GgmlType::kQ6_K;
}

void LinearForwardBlocksInt8(GgmlType type, const float* x, const uint8_t* w, float* y, int64_t N,
                             int64_t in, int64_t out) {
  if (N == 0 || out == 0) return;
  ST_CHECK(HasInt8BlockProduct(type))
      << "LinearForwardBlocksInt8 takes Q8_0, Q4_0, Q5_0, Q4_K or Q6_K weights, not "
      << GgmlTypeOf(type).name;
  const int64_t block = GgmlTypeOf(type).block_elems;
  ST_CHECK(in % block == 0) << "LinearForwardBlocksInt8: rows of " << in << " values are not "
                            << block << "-value blocks of " << GgmlTypeOf(type).name;
  thread_local Int8Rows a;
  a.Quantize(x, N, in);
  const int64_t row_bytes = static_cast<int64_t>(GgmlRowBytes(type, in));
  if (HasVnniBlockProducts())
    vnni::Product(type, a, w, y, N, in, out, row_bytes);
  else if (ActiveKernelIsa() >= KernelIsa::kX86_64_v3)
    avx2::Product(type, a, w, y, N, in, out, row_bytes);
  else
    ProductPlain(type, a, w, y, N, in, out);
}

}  // namespace st::cpu
