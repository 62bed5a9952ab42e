// Element types that cross file and wire boundaries (f32, bf16, f16) and their conversions, and
// the compute precision of the model's matrix products (Precision).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace st {

enum class DType { kF32, kBF16, kF16 };

// The operands of the model's matrix products: kFp32 multiplies fp32 values; kBf16 rounds both
// operands to bf16 and accumulates in fp32 (PyTorch autocast's recipe). Everything else (norms,
// softmax, the loss, the residual stream, master weights, the optimizer) stays fp32 either way.
enum class Precision { kFp32, kBf16 };
const char* PrecisionName(Precision p);  // "fp32", "bf16"

constexpr size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
const char* DTypeName(DType t);  // safetensors spelling: "F32", "BF16", "F16"

struct bf16 {
  uint16_t bits;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest even (as torch does); NaN stays NaN (quiet).
inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float BF16ToFloat(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

// IEEE half <-> float (round to nearest even), for reading/writing F16 checkpoints.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// Bulk conversions used on load/save and in the FSDP gather path.
void ConvertToF32(DType src_type, const void* src, float* dst, int64_t n);
void ConvertFromF32(DType dst_type, const float* src, void* dst, int64_t n);

}  // namespace st
