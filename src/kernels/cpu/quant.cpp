#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace st {

void Q4KScaleMin(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

namespace {

constexpr int64_t kQK = 32;    // values per block of Q8_0 and Q4_0
constexpr int64_t kQKK = 256;  // values per super-block of the K-quants

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", kQK, 2 + kQK / 2, true},
    {GgmlType::kQ5_0, "Q5_0", kQK, 2 + 4 + kQK / 2, true},
    {GgmlType::kQ8_0, "Q8_0", kQK, 2 + kQK, true},
    {GgmlType::kQ4_K, "Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2, true},
    {GgmlType::kQ6_K, "Q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true},
    {GgmlType::kBF16, "BF16", 1, 2, true},
};

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = FloatToHalf(v);
  std::memcpy(p, &h, 2);
}

float GetHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// C's roundf: halves away from zero (ggml's Q8_0 rounding; std::nearbyint would round to even).
float RoundHalfAway(float v) {
  return std::round(v);
}

void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + kQK) {
    float amax = 0;
    for (int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    PutHalf(out, d);
    for (int64_t j = 0; j < kQK; ++j)
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(RoundHalfAway(x[j] * id)));
  }
}

// The value of a 32-value block with the largest magnitude, its sign kept (the first of equals).
float LargestMagnitude(const float* x) {
  float amax = 0, max = 0;
  for (int64_t j = 0; j < kQK; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

void QuantizeQ4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + kQK / 2) {
    // The value of largest magnitude keeps its sign: it maps to -8 exactly.
    const float d = LargestMagnitude(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    PutHalf(out, d);
    auto q = [&](float v) {
      const float t = std::trunc(v * id + 8.5f);
      return static_cast<uint8_t>(std::clamp(t, 0.0f, 15.0f));
    };
    for (int64_t j = 0; j < kQK / 2; ++j)
      out[2 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + kQK / 2]) << 4));
  }
}

// Q5_0: Q4_0's rule at 5 bits. Codes 0..31 (the largest magnitude maps to 0, that is -16); the
// low nibbles as Q4_0 packs them, bit 4 of value j in bit j of the little-endian word qh.
void QuantizeQ5_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + 4 + kQK / 2) {
    const float d = LargestMagnitude(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    PutHalf(out, d);
    auto q = [&](float v) {
      const float t = std::trunc(v * id + 16.5f);
      return static_cast<uint32_t>(std::clamp(t, 0.0f, 31.0f));
    };
    uint32_t qh = 0;
    for (int64_t j = 0; j < kQK / 2; ++j) {
      const uint32_t lo = q(x[j]), hi = q(x[j + kQK / 2]);
      out[6 + j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      qh |= ((lo >> 4) & 1u) << j;
      qh |= ((hi >> 4) & 1u) << (j + kQK / 2);
    }
    for (int k = 0; k < 4; ++k) out[2 + k] = static_cast<uint8_t>(qh >> (8 * k));
  }
}

void DequantizeQ5_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK; ++b, in += 2 + 4 + kQK / 2, y += kQK) {
    const float d = GetHalf(in);
    uint32_t qh = 0;
    for (int k = 0; k < 4; ++k) qh |= static_cast<uint32_t>(in[2 + k]) << (8 * k);
    for (int64_t j = 0; j < kQK / 2; ++j) {
      const int lo = static_cast<int>((in[6 + j] & 0x0F) | (((qh >> j) & 1u) << 4));
      const int hi = static_cast<int>((in[6 + j] >> 4) | (((qh >> (j + kQK / 2)) & 1u) << 4));
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void DequantizeQ8_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK; ++b, in += 2 + kQK) {
    const float d = GetHalf(in);
    for (int64_t j = 0; j < kQK; ++j) *y++ = static_cast<float>(static_cast<int8_t>(in[2 + j])) * d;
  }
}

void DequantizeQ4_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK; ++b, in += 2 + kQK / 2, y += kQK) {
    const float d = GetHalf(in);
    for (int64_t j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((in[2 + j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((in[2 + j] >> 4) - 8) * d;
    }
  }
}

// ggml's nearest_int: round to nearest with ties to even (the FPU's default mode), for the small
// magnitudes the K-quant searches produce.
int NearestInt(float v) {
  return static_cast<int>(std::nearbyint(v));
}

// The K-quants' searches, written from ggml-quants.c's reference quantizers. Their results are
// compared byte for byte with ggml's (tests/test_gguf.cpp), so each sum runs in ggml's order and
// with its float types, and this file is compiled without floating-point contraction (an FMA
// rounds once where ggml's reference build rounds twice).

// A sub-block of Q4_K as x ~ scale * L - m with L in [0, nmax] and m >= 0 (ggml's
// make_qkx2_quants without the absolute-error option): the levels of the range [min(x, 0), max(x)]
// first, then nstep + 1 candidate grids around it, each refitted by weighted least squares (scale
// and min), keeping the one of least weighted squared error. Returns the scale, *neg_min = m.
float FitScaleAndMin(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                     float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill_n(L, n, uint8_t{0});
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (hi - lo);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * static_cast<float>(L[i]) + lo - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t trial[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float wl = w[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float s = (sum_w * sum_xl - sum_x * sum_l) / det;
    float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (m > 0) {
      m = 0;
      s = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = s * static_cast<float>(trial[i]) + m - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      std::copy_n(trial, n, L);
      best = err;
      scale = s;
      lo = m;
    }
  }
  *neg_min = -lo;
  return scale;
}

// A sub-block of Q6_K as x ~ scale * (L - nmax) with L - nmax in [-nmax, nmax - 1] (ggml's
// make_qx_quants weighted by x^2): the grid through the value of largest magnitude, refitted by
// least squares, then 18 grids around it, keeping the best fit. Returns the scale (0 for an
// all-zero sub-block).
float FitSymmetricScale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax < 1e-15f) {
    std::fill_n(L, n, int8_t{0});
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sum_lx, float* sum_l2) {
    *sum_lx = 0;
    *sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sum_lx += w * x[i] * static_cast<float>(l);
      *sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
  };
  auto levels = [&](float iscale) {
    for (int i = 0; i < n; ++i)
      L[i] = static_cast<int8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sum_lx, sum_l2;
  fit(iscale, &sum_lx, &sum_l2);
  levels(iscale);
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
    fit(iscale, &sum_lx, &sum_l2);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      levels(iscale);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

void PackQ4KScaleMin(int j, uint8_t sc, uint8_t m, uint8_t* s);

// Q4_K: per super-block of 256, eight sub-blocks of 32 fitted (weights |x| + the sub-block's RMS),
// their scales and mins quantized to 6 bits against the largest of each (fp16 d and dmin), then
// every value requantized on its sub-block's final grid.
void QuantizeQ4_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQKK; ++b, x += kQKK, out += 144) {
    uint8_t L[kQKK];
    float w[32], scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
      const float rms = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
      scales[j] = FitScaleAndMin(32, 15, xs, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* packed = out + 4;
    std::fill_n(packed, 12, uint8_t{0});
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls =
          std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
      const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
      PackQ4KScaleMin(j, ls, lm, packed);
    }
    PutHalf(out, max_scale / 63.0f);
    PutHalf(out + 2, max_min / 63.0f);
    const float d = GetHalf(out), dmin = GetHalf(out + 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4KScaleMin(j, packed, &sc, &m);
      const float dj = d * static_cast<float>(sc);
      if (dj == 0) continue;  // the fit's levels stay
      const float mj = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l)
        L[32 * j + l] =
            static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + l] + mj) / dj), 0, 15));
    }
    uint8_t* q = out + 16;
    for (int c = 0; c < 4; ++c, q += 32)
      for (int l = 0; l < 32; ++l)
        q[l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

// Q6_K: per super-block of 256, sixteen sub-blocks of 16 fitted symmetrically on 64 levels, their
// scales quantized to int8 against the largest in magnitude (fp16 d), every value requantized on
// its sub-block's final grid.
void QuantizeQ6_K(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQKK; ++b, x += kQKK, out += 210) {
    int8_t L[kQKK];
    float scales[16];
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitSymmetricScale(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::fill_n(out, 210, uint8_t{0});
    if (max_abs < 1e-15f) continue;  // all zero, d = 0
    const float iscale = -128.0f / max_scale;
    PutHalf(out + 208, 1 / iscale);
    int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
    for (int j = 0; j < 16; ++j)
      sc[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
    const float d = GetHalf(out + 208);
    for (int j = 0; j < 16; ++j) {
      const float dj = d * static_cast<float>(sc[j]);
      if (dj == 0) continue;  // the fit's levels stay
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] =
            static_cast<int8_t>(32 + std::clamp(NearestInt(x[16 * j + l] / dj), -32, 31));
    }
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32) {
      const int8_t* Lh = L + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 0x0F) | ((Lh[l + 64] & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0x0F) | ((Lh[l + 96] & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                     ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

// The inverse of Q4KScaleMin (s zeroed first).
void PackQ4KScaleMin(int j, uint8_t sc, uint8_t m, uint8_t* s) {
  if (j < 4) {
    s[j] = sc;
    s[j + 4] = m;
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0x0F) | ((m & 0x0F) << 4));
    s[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
    s[j] |= static_cast<uint8_t>((m >> 4) << 6);
  }
}

// Q4_K super-block: fp16 d, fp16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles; value =
// d * scale * q - dmin * min per sub-block of 32, each 32 bytes holding two sub-blocks (low
// nibbles, then high).
void DequantizeQ4_K(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQKK; ++b, in += 144) {
    const float d = GetHalf(in), dmin = GetHalf(in + 2);
    const uint8_t* scales = in + 4;
    const uint8_t* q = in + 16;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      Q4KScaleMin(2 * c, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      Q4KScaleMin(2 * c + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q6_K super-block: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one
// per 16 values), fp16 d; value = d * scale * (q - 32), in two halves of 128 values.
void DequantizeQ6_K(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQKK; ++b, in += 210) {
    const uint8_t* ql = in;
    const uint8_t* qh = in + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(in + 192);
    const float d = GetHalf(in + 208);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

std::optional<GgmlTypeInfo> GgmlTypeOf(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

GgmlTypeInfo GgmlTypeOf(GgmlType t) {
  return *GgmlTypeOf(static_cast<uint32_t>(t));
}

std::optional<GgmlType> ParseGgmlType(const std::string& name) {
  std::string up = name;
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const GgmlTypeInfo& t : kTypes)
    if (up == t.name) return t.type;
  return std::nullopt;
}

size_t GgmlRowBytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo info = GgmlTypeOf(t);
  if (n < 0 || n % info.block_elems != 0) return 0;
  return static_cast<size_t>(n / info.block_elems * info.block_bytes);
}

bool QuantizeRow(GgmlType t, const float* x, int64_t n, void* out) {
  const GgmlTypeInfo info = GgmlTypeOf(t);
  if (!info.quantize || n % info.block_elems != 0) return false;
  auto* o = static_cast<uint8_t*>(out);
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(o, x, static_cast<size_t>(n) * 4);
      return true;
    case GgmlType::kF16:
      ConvertFromF32(DType::kF16, x, o, n);
      return true;
    case GgmlType::kBF16:
      ConvertFromF32(DType::kBF16, x, o, n);
      return true;
    case GgmlType::kQ8_0:
      QuantizeQ8_0(x, n, o);
      return true;
    case GgmlType::kQ4_0:
      QuantizeQ4_0(x, n, o);
      return true;
    case GgmlType::kQ5_0:
      QuantizeQ5_0(x, n, o);
      return true;
    case GgmlType::kQ4_K:
      QuantizeQ4_K(x, n, o);
      return true;
    case GgmlType::kQ6_K:
      QuantizeQ6_K(x, n, o);
      return true;
  }
  return false;
}

void DequantizeRow(GgmlType t, const void* in, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(in);
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      ConvertToF32(DType::kF16, p, out, n);
      return;
    case GgmlType::kBF16:
      ConvertToF32(DType::kBF16, p, out, n);
      return;
    case GgmlType::kQ8_0:
      DequantizeQ8_0(p, n, out);
      return;
    case GgmlType::kQ4_0:
      DequantizeQ4_0(p, n, out);
      return;
    case GgmlType::kQ5_0:
      DequantizeQ5_0(p, n, out);
      return;
    case GgmlType::kQ4_K:
      DequantizeQ4_K(p, n, out);
      return;
    case GgmlType::kQ6_K:
      DequantizeQ6_K(p, n, out);
      return;
  }
}

}  // namespace st
