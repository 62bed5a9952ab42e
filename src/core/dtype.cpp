#include "core/dtype.h"

namespace st {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

const char* PrecisionName(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "fp32";
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal half: renormalise.
    int e = -1;
    do {
      e++;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return BitsFloat(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | mant << 13);
  return BitsFloat(sign | (exp + 127 - 15) << 23 | mant << 13);
}

uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (rounds to inf) or inf
  if (abs < 0x38800000u) {                        // subnormal or zero in half
    if (abs < 0x33000000u) return sign;           // below half of the smallest subnormal
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - ... maps to a 10-bit mantissa
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) half_m++;
    return sign | static_cast<uint16_t>(half_m);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

void ConvertToF32(DType src_type, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;  // empty buffers may be null pointers, which memcpy must never see
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      return;
    }
  }
}

void ConvertFromF32(DType dst_type, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;  // empty buffers may be null pointers, which memcpy must never see
  switch (dst_type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
      return;
    }
  }
}

}  // namespace st
