// ggml's tensor element types and their quantization blocks, as GGUF files (llama.cpp, Ollama)
// store them: written from ggml's definitions (ggml-common.h's block structs, ggml-quants.c's
// reference quantizers), checked byte for byte against the `gguf` package's numpy versions
// (tools/make_gguf_fixtures.py, tests/test_gguf.cpp). A block is `block_elems` consecutive values
// of one row (rows are never split: a row's length must be a multiple of it) in `block_bytes`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace st {

// The ids are ggml's (enum ggml_type); only the types slicetrain reads or writes are named.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;     // ggml's spelling: "F32", "Q8_0", "Q4_K", ...
  int64_t block_elems;  // values per block (1 for the float types)
  int64_t block_bytes;  // bytes per block
  bool quantize;        // QuantizeRow supports it (the K-quants are read-only for now)
};

// nullopt for a type id slicetrain does not know.
std::optional<GgmlTypeInfo> GgmlTypeOf(uint32_t id);
GgmlTypeInfo GgmlTypeOf(GgmlType t);
// "q8_0", "Q8_0", "bf16", ... (case-insensitive) to the type; nullopt when unknown.
std::optional<GgmlType> ParseGgmlType(const std::string& name);

// Bytes of n values (n a multiple of the block; 0 when it is not).
size_t GgmlRowBytes(GgmlType t, int64_t n);

// One row of n fp32 values into `out` (GgmlRowBytes(t, n) bytes), as ggml's reference quantizers
// do: F32 as is, F16 and BF16 rounded to nearest even (NaN kept quiet), Q8_0 (per 32 values the
// fp16 scale d = max|x| / 127 and round-half-away(x / d)), Q4_0 (d = the value of largest magnitude
// / -8, nibbles min(15, trunc(x / d + 8.5)), the block's first half in the low nibbles), Q5_0 (as
// Q4_0 with d = that value / -16 and 5-bit codes min(31, trunc(x / d + 16.5)), the fifth bits in a
// 32-bit word), Q4_K and Q6_K (ggml's reference searches, without an importance matrix). Types with
// quantize == false are refused (false).
bool QuantizeRow(GgmlType t, const float* x, int64_t n, void* out);
// The n values of one stored row back to fp32 (every type of GgmlTypeOf, the K-quants included).
void DequantizeRow(GgmlType t, const void* in, int64_t n, float* out);

// Q4_K's 6-bit scale and min of sub-block j (0..7) from a super-block's 12 packed bytes: sub-blocks
// 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11 with
// their top two bits in the high bits of bytes 0-7.
void Q4KScaleMin(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);

}  // namespace st
