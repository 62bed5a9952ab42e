#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace st {

namespace {

constexpr int64_t kQK = 32;    // values per block of Q8_0 and Q4_0
constexpr int64_t kQKK = 256;  // values per super-block of the K-quants

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", kQK, 2 + kQK / 2, true},
    {GgmlType::kQ8_0, "Q8_0", kQK, 2 + kQK, true},
    {GgmlType::kQ4_K, "Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2, false},
    {GgmlType::kQ6_K, "Q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, false},
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

void QuantizeQ4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK, out += 2 + kQK / 2) {
    // The value of largest magnitude keeps its sign: it maps to -8 exactly.
    float amax = 0, max = 0;
    for (int64_t j = 0; j < kQK; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8.0f;
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

// Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes: sub-blocks 0-3 in the
// low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11 with their top
// two bits in the high bits of bytes 0-7.
void ScaleMinK4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
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
      ScaleMinK4(2 * c, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, scales, &sc, &m);
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
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      break;
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
    case GgmlType::kQ4_K:
      DequantizeQ4_K(p, n, out);
      return;
    case GgmlType::kQ6_K:
      DequantizeQ6_K(p, n, out);
      return;
  }
}

}  // namespace st
