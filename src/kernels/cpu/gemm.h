// The one matrix-product interface of the CPU backend: C = alpha * op(A) op(B) + beta * C in a
// chosen Precision. fp32 goes to OpenBLAS's sgemm; bf16 rounds the operands to bf16 (round to
// nearest even, as torch does) and runs oneDNN's bf16 matmul, which accumulates in fp32 and writes
// fp32 (AMX tiles on Sapphire Rapids and later, AVX512-BF16 dot products on Cooper Lake and Zen 4).
// On a CPU for which oneDNN has no bf16 matmul (AVX2-only ones) the same bf16 values are widened
// to fp32 and multiplied by sgemm: correct, slower than fp32 (the commands refuse --precision bf16
// there). Callers ask for a product and a precision, never for a library or an instruction set.
//
// Not thread-safe across threads sharing state: every thread has its own primitive cache and
// conversion scratch (threads-as-ranks tests run several engines in one process).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace st::cpu {

enum class Trans { kNo, kYes };

// Row-major: op(A) is [M, K] (A stored [M, lda] or, transposed, [K, lda]), op(B) is [K, N]
// (B stored [K, ldb] or, transposed, [N, ldb]), C is [M, ldc]. beta 0 overwrites C (which may
// then hold anything, NaN included); beta 1 accumulates.
// In bf16 each operand is rounded into per-thread scratch of at most kBf16OperandCap elements
// (or one row of K, if longer): larger ones go in blocks of rows or columns of C.
constexpr int64_t kBf16OperandCap = int64_t{4} << 20;
void Gemm(Precision p, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// The bf16 product on operands already in bf16 (a gathered FSDP unit, a frozen checkpoint
// tensor): no conversion.
void GemmBf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
              int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// dst[rows, cols] (contiguous) = bf16(src[rows, ld]) rounded to nearest even; threaded when
// large. Dispatches at run time to AVX512-BF16's conversion instruction where the CPU has it.
void RoundToBf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst);

// Bytes of the calling thread's bf16 conversion scratch now (for memory reports and tests).
size_t GemmScratchBytes();
// Whether oneDNN runs the bf16 products on this CPU (false: the widened fp32 products above).
bool GemmBf16Native();
// The number of oneDNN matmul primitives the calling thread has created so far (one per distinct
// shape, transposition, alpha and beta; a step's shapes repeat, so this stops growing).
int64_t GemmPrimitivesCreated();

}  // namespace st::cpu
