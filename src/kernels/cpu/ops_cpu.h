// Fast CPU kernels: GEMMs through OpenBLAS, elementwise and attention loops threaded with OpenMP
// (one thread team shared with OpenBLAS's OpenMP build, so the two never oversubscribe).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/attn_mask.h"
#include "kernels/cpu/quant.h"

namespace st::cpu {
#include "kernels/ops_decl.inc"

// Attention (attention_cpu.cpp) works on tiles of 64 rows (the query heads of one kv head stacked
// over 64 / (H/Hkv) queries) x 128 keys; its scratch is linear in T: per OpenMP thread two
// [64, 128] tiles and three packed [64, D] row blocks, plus, on the calling thread, per-call
// tables ([B, T+1] real-token prefix counts, [B, H, T] row dots dout . out, [B, Hkv, D] means of
// V). ReserveAttentionScratch grows all of them now for every shape up to the given maxima, on
// every thread of the current OpenMP team, so that no later call allocates. The engine calls it at
// construction, from the thread that later runs the steps.
void ReserveAttentionScratch(int64_t max_B, int64_t max_T, int64_t H, int64_t max_Hkv,
                             int64_t max_D);
// Bytes of all the scratch above that AttentionForward/Backward use at this shape with `threads`
// OpenMP threads (for the memory plan).
double AttentionWorkspaceBytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                               int threads);

// y[N,out] = x[N,in] . w[out,in]^T with w stored in bf16 (decoding a bf16 checkpoint reads half
// the bytes): fp32 arithmetic on the exact widened weights. N = 1 is a matrix-vector product
// threaded over output rows (with AVX-512 and in % 32 == 0, x is first permuted into `scratch`);
// N > 1 widens about kBf16TileElements weights at a time (at least one row) into `scratch`
// (Bf16ScratchFloats(in) floats) and multiplies them with sgemm.
constexpr int64_t kBf16TileElements = int64_t{1} << 20;
inline int64_t Bf16ScratchFloats(int64_t in) {
  return std::max(kBf16TileElements, in);
}
void LinearForwardBf16(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                       int64_t out, float* scratch);

// The decoder's attention for n query rows, each over its own sequence's KV cache: row t at
// position pos[t] sees the keys of positions [lo, pos[t]] (lo = pos[t] - window + 1 when
// window > 0, else 0), held in a ring of `slots` rows, position p at row p % slots of keys[t] and
// values[t] ([slots, Hkv, D] each). q and out [n, H, D]; query head h uses kv head h / (H / Hkv);
// scale 1.0, fp32 softmax. span: the most keys a row sees; scratch: omp_get_max_threads() *
// (H / Hkv) * span floats.
void DecodeAttention(const float* q, float* out, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                     const float* const* keys, const float* const* values, const int32_t* pos,
                     int64_t slots, int64_t window, int64_t span, float* scratch);

// y[N,out] = x[N,in] . w[out,in]^T for a few rows (2 <= N <= kFewRows), w in fp32 or bf16
// (widened exactly): each weight row is read once for all N rows of x, which stay in cache. The
// batched decoder's steps: a GEMM library first copies (packs) the whole weight matrix for a
// handful of rows, which costs more than the product (docs/grpo.md has the measurement).
constexpr int64_t kFewRows = 16;
void LinearForwardFew(const float* x, const float* w, float* y, int64_t N, int64_t in, int64_t out);
void LinearForwardFew(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                      int64_t out);

// The same with x too in bf16 (the caller rounds it, as for GemmBf16) and fp32 sums: the batched
// decoder's steps under --precision bf16 (kernels/cpu/few_rows_bf16.cpp). VDPBF16PS where
// HasAvx512Bf16FewRows() (AVX512-BF16 and the x86-64-v4 kernels active): two products per lane
// and instruction, half the instructions and x bytes of the widening kernel; elsewhere the bf16
// values widened exactly and multiplied in fp32 (the same result up to the summation order).
void LinearForwardFewBf16(const uint16_t* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                          int64_t out);
bool HasAvx512Bf16FewRows();

// y[N,out] = x[N,in] . w[out,in]^T with w in ggml blocks (Q8_0, Q4_0, Q5_0, Q4_K or Q6_K:
// HasInt8BlockProduct) and x rounded to int8 blocks of 32 first, as ggml's Q8_0 rounds them (d =
// max|x| / 127, codes round(x / d), d kept in fp32): per 32 values an integer dot product of the
// codes, scaled by the weight's and x's scales, the weight's offset or minimum taken out through
// x's sums (llama.cpp's vec_dot_q8_0_q8_0, vec_dot_q4_K_q8_K, ...; it rounds x per 256 for the
// K-quants). AVX512-VNNI where HasVnniBlockProducts(), AVX2 at x86-64-v3, plain integer loops
// below (the same integers; the fp32 sums may differ in the last bits): BlockProductPath() names
// the one that runs. The decoder's products for block storage (src/kernels/cpu/quant_dot.cpp).
void LinearForwardBlocksInt8(GgmlType type, const float* x, const uint8_t* w, float* y, int64_t N,
                             int64_t in, int64_t out);
bool HasInt8BlockProduct(GgmlType type);
// Whether the CPU has AVX512-VNNI and the kernels run at x86-64-v4.
bool HasVnniBlockProducts();
// "AVX512-VNNI", "AVX2" or "plain": the code LinearForwardBlocksInt8 runs on this CPU and level.
const char* BlockProductPath();

// Threads used by OpenMP regions and OpenBLAS for this process.
void SetNumThreads(int n);
int NumThreads();
}  // namespace st::cpu
