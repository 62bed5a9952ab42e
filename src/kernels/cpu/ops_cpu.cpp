#include "kernels/cpu/ops_cpu.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_kernels.h"

namespace st::cpu {

void SetNumThreads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int NumThreads() {
  return omp_get_max_threads();
}

void LinearForward(const float* x, const float* w, float* y, int64_t N, int64_t in, int64_t out,
                   float alpha, bool accumulate) {
  if (N == 0 || out == 0) return;
  if (N == 1) {  // one token (decoding): a matrix-vector product, bound by reading w once
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, alpha, w, in, x, 1, accumulate ? 1.0f : 0.0f,
                y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, alpha, x, in, w, in,
              accumulate ? 1.0f : 0.0f, y, out);
}

void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                    int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  if (N == 0) return;
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, alpha, dy, out, w, in,
                accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, alpha, dy, out, x, in, 1.0f,
                dw, in);
}

void LinearForwardMixed(const float* x, const float* w, float* y, int64_t N, int64_t in,
                        int64_t out, float alpha, bool accumulate) {
  if (N == 0 || out == 0) return;
  Gemm(Precision::kBf16, Trans::kNo, Trans::kYes, N, out, in, alpha, x, in, w, in,
       accumulate ? 1.0f : 0.0f, y, out);
}

void LinearBackwardMixed(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         int64_t N, int64_t in, int64_t out, float alpha, bool accumulate_dx) {
  if (N == 0) return;
  if (dx)
    Gemm(Precision::kBf16, Trans::kNo, Trans::kNo, N, in, out, alpha, dy, out, w, in,
         accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dw)
    Gemm(Precision::kBf16, Trans::kYes, Trans::kNo, out, in, N, alpha, dy, out, x, in, 1.0f, dw,
         in);
}

// Every other op runs the kernels compiled for the x86-64 level this CPU has (isa_kernels.h).
namespace {

const KernelTable& Kernels() {
  switch (ActiveKernelIsa()) {
    case KernelIsa::kX86_64_v4:
      return v4::Table();
    case KernelIsa::kX86_64_v3:
      return v3::Table();
    case KernelIsa::kX86_64_v2:
      break;
  }
  return v2::Table();
}

}  // namespace

void EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C,
                      float scale) {
  Kernels().embedding_forward(ids, table, out, N, C, scale);
}

void EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C,
                       float scale, int32_t padding_id) {
  Kernels().embedding_backward(ids, dout, dtable, N, C, scale, padding_id);
}

void RmsNormForward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                    float eps) {
  Kernels().rms_norm_forward(x, w, y, rstd, N, C, eps);
}

void RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                     float* dw, int64_t N, int64_t C, bool accumulate_dx) {
  Kernels().rms_norm_backward(x, w, rstd, dy, dx, dw, N, C, accumulate_dx);
}

void Rope(float* x, const float* cos, const float* sin, const int32_t* pos, int64_t B, int64_t T,
          int64_t heads, int64_t D, bool inverse) {
  Kernels().rope(x, cos, sin, pos, B, T, heads, D, inverse);
}

void AttentionForward(const float* q, const float* k, const float* v, float* out, float* lse,
                      int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      const AttnMask& mask) {
  Kernels().attention_forward(q, k, v, out, lse, B, T, H, Hkv, D, mask);
}

void AttentionBackward(const float* q, const float* k, const float* v, const float* out,
                       const float* lse, const float* dout, float* dq, float* dk, float* dv,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       const AttnMask& mask) {
  Kernels().attention_backward(q, k, v, out, lse, dout, dq, dk, dv, B, T, H, Hkv, D, mask);
}

void GeluMulForward(const float* a, const float* b, float* out, int64_t n) {
  Kernels().gelu_mul_forward(a, b, out, n);
}

void GeluMulBackward(const float* a, const float* b, const float* dout, float* da, float* db,
                     int64_t n) {
  Kernels().gelu_mul_backward(a, b, dout, da, db, n);
}

void SoftcapForward(float* z, int64_t n, float cap) {
  Kernels().softcap_forward(z, n, cap);
}

double CrossEntropyForward(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t* valid) {
  return Kernels().cross_entropy_forward(logits, targets, N, V, valid);
}

void CrossEntropySoftcapBackward(float* logits, const int32_t* targets, int64_t N, int64_t V,
                                 float cap, float scale) {
  Kernels().cross_entropy_softcap_backward(logits, targets, N, V, cap, scale);
}

void Add(float* y, const float* x, int64_t n) {
  Kernels().add(y, x, n);
}

void Scale(float* y, float s, int64_t n) {
  Kernels().scale(y, s, n);
}

void ReserveAttentionScratch(int64_t max_B, int64_t max_T, int64_t H, int64_t max_Hkv,
                             int64_t max_D) {
  Kernels().reserve_attention_scratch(max_B, max_T, H, max_Hkv, max_D);
}

double AttentionWorkspaceBytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                               int threads) {
  return Kernels().attention_workspace_bytes(B, T, H, Hkv, D, threads);
}

void LinearForwardBf16(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                       int64_t out, float* scratch) {
  Kernels().linear_forward_bf16(x, w, y, N, in, out, scratch);
}

void DecodeAttention(const float* q, float* out, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                     const float* const* keys, const float* const* values, const int32_t* pos,
                     int64_t slots, int64_t window, int64_t span, float* scratch) {
  Kernels().decode_attention(q, out, n, H, Hkv, D, keys, values, pos, slots, window, span, scratch);
}

void LinearForwardFew(const float* x, const float* w, float* y, int64_t N, int64_t in,
                      int64_t out) {
  Kernels().linear_forward_few_f32(x, w, y, N, in, out);
}

void LinearForwardFew(const float* x, const uint16_t* w, float* y, int64_t N, int64_t in,
                      int64_t out) {
  Kernels().linear_forward_few_bf16(x, w, y, N, in, out);
}

}  // namespace st::cpu
