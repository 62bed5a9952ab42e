#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/cpu_features.h"

namespace st::cpu {

namespace {

// ---- fp32 -> bf16 rounding ------------------------------------------------------------------

// Portable: round to nearest even in integer arithmetic (vectorised for whatever the build
// targets); NaN stays a quiet NaN.
void RoundRowPortable(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBF16(src[i]);
}

// AVX512-BF16: VCVTNEPS2BF16 rounds 16 floats to nearest even in one instruction (it treats
// denormal inputs as zero, which no training value of ours is). Compiled for that ISA alone and
// called only where cpuid says the CPU has it.
__attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw"))) void RoundRowAvx512Bf16(
    const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(h));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<const __m256i&>(h));
  }
}

using RoundRowFn = void (*)(const float*, uint16_t*, int64_t);
RoundRowFn PickRoundRow() {
  const CpuFeatures& f = DetectCpu();
  return f.avx512_bf16 && f.avx512vl && f.avx512bw ? RoundRowAvx512Bf16 : RoundRowPortable;
}

// ---- oneDNN matmul primitives, cached per thread --------------------------------------------

struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  uint32_t alpha_bits, beta_bits;
  // oneDNN splits the work for the thread count it sees when the primitive is made: one made for
  // 1 thread runs on 1 thread forever.
  int threads;
  bool operator==(const Key&) const = default;
};

struct Entry {
  Key key;
  dnnl::matmul prim;
  // Descriptors bound to the primitive; data handles set per call. `scratch` is the primitive's
  // scratchpad, which we own (scratchpad_mode::user): Debian's oneDNN is built without
  // DNNL_ENABLE_CONCURRENT_EXEC, so its library-managed scratchpad is one buffer shared by every
  // primitive of the process, and two threads running products at once (threads-as-ranks)
  // would write into each other's.
  dnnl::memory a, b, c, scratch;
  size_t scratch_bytes = 0;
  uint64_t last_use = 0;
};

// Enough for every shape of a step (a decoder layer has about ten products, forward and
// backward, plus the head's tiles and the LoRA products); a run whose shapes keep changing
// (the head's last tile) evicts the least recently used entry instead of growing.
constexpr size_t kMaxEntries = 256;

struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::vector<std::unique_ptr<Entry>> entries;
  uint64_t clock = 0;
  int64_t created = 0;
  // Conversion scratch for A and B; grows to the largest product seen, then stays.
  std::vector<uint16_t> a16, b16;
  // The primitives' scratchpad (one product runs at a time on a thread), 64-byte aligned.
  std::vector<uint8_t> scratchpad;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

dnnl::memory::desc Desc(dnnl::memory::data_type t, int64_t rows, int64_t cols, bool trans,
                        int64_t ld) {
  // op(X) is [rows, cols]; stored transposed, its element (r, c) is at c * ld + r.
  return dnnl::memory::desc({rows, cols}, t,
                            trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

Entry& Lookup(ThreadState& s, const Key& k, float alpha, float beta) {
  ++s.clock;
  for (auto& e : s.entries)
    if (e->key == k) {
      e->last_use = s.clock;
      return *e;
    }
  using dt = dnnl::memory::data_type;
  const auto a = Desc(dt::bf16, k.M, k.K, k.ta, k.lda);
  const auto b = Desc(dt::bf16, k.K, k.N, k.tb, k.ldb);
  const auto c = Desc(dt::f32, k.M, k.N, false, k.ldc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  auto entry = std::make_unique<Entry>();
  entry->key = k;
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, s.engine);
    entry->prim = dnnl::matmul(pd);
    const dnnl::memory::desc sd = pd.scratchpad_desc();
    entry->scratch_bytes = sd.get_size();
    entry->scratch = dnnl::memory(sd, s.engine, DNNL_MEMORY_NONE);
  } catch (const dnnl::error& e) {
    ST_CHECK(false) << "oneDNN bf16 matmul M=" << k.M << " N=" << k.N << " K=" << k.K
                    << " has no implementation: " << e.what();
  }
  entry->a = dnnl::memory(a, s.engine, DNNL_MEMORY_NONE);
  entry->b = dnnl::memory(b, s.engine, DNNL_MEMORY_NONE);
  entry->c = dnnl::memory(c, s.engine, DNNL_MEMORY_NONE);
  entry->last_use = s.clock;
  ++s.created;
  if (s.entries.size() >= kMaxEntries) {
    auto oldest = std::min_element(s.entries.begin(), s.entries.end(),
                                   [](auto& x, auto& y) { return x->last_use < y->last_use; });
    *oldest = std::move(entry);
    return **oldest;
  }
  s.entries.push_back(std::move(entry));
  return *s.entries.back();
}

// Whether oneDNN has a bf16 matmul for this CPU: Debian's oneDNN 2.6 implements it on AVX-512
// cores only (AVX512-BF16 and AMX natively, plain AVX-512 emulated), not on AVX2 ones. Asked once,
// with the smallest product.
bool OneDnnHasBf16Matmul() {
  static const bool has = [] {
    using dt = dnnl::memory::data_type;
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const auto a = Desc(dt::bf16, 1, 1, false, 1), c = Desc(dt::f32, 1, 1, false, 1);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

// The bf16 product where oneDNN has none: the operands' bf16 values widened exactly to fp32 and
// multiplied by sgemm, so the result is the bf16 product's up to the fp32 summation order (and
// slower than fp32 itself). The commands refuse --precision bf16 on such a CPU
// (cpu::ResolvePrecision); this keeps the library's bf16 paths (and their tests) working anywhere.
// Operands are widened in blocks of at most kBf16OperandCap elements (rows of C for A, columns
// for B), into per-thread scratch.
void GemmBf16Widened(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     float* C, int64_t ldc) {
  thread_local std::vector<float> a32, b32;
  const int64_t mb = std::max<int64_t>(1, std::min(M, kBf16OperandCap / K));
  const int64_t nb = std::max<int64_t>(1, std::min(N, kBf16OperandCap / K));
  if (static_cast<int64_t>(a32.size()) < mb * K) a32.resize(static_cast<size_t>(mb * K));
  if (static_cast<int64_t>(b32.size()) < nb * K) b32.resize(static_cast<size_t>(nb * K));
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t n = std::min(nb, N - n0);
    // op(B)[:, n0 : n0 + n] transposed: row j holds column n0 + j of op(B).
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < K; ++k)
        b32[static_cast<size_t>(j * K + k)] =
            BF16ToFloat(tb == Trans::kYes ? B[(n0 + j) * ldb + k] : B[k * ldb + n0 + j]);
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
      const int64_t m = std::min(mb, M - m0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t k = 0; k < K; ++k)
          a32[static_cast<size_t>(i * K + k)] =
              BF16ToFloat(ta == Trans::kYes ? A[k * lda + m0 + i] : A[(m0 + i) * lda + k]);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, K, alpha, a32.data(), K,
                  b32.data(), K, beta, C + m0 * ldc + n0, ldc);
    }
  }
}

}  // namespace

void RoundToBf16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst) {
  static const RoundRowFn round_row = PickRoundRow();
  if (rows <= 0 || cols <= 0) return;
  if (ld == cols) {  // one contiguous run, split evenly over the threads
    const int64_t n = rows * cols;
    constexpr int64_t kChunk = 1 << 14;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kChunk;
      round_row(src + i0, dst + i0, std::min(kChunk, n - i0));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) round_row(src + r * ld, dst + r * cols, cols);
}

void GemmBf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
              int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no products: C = beta * C
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
    return;
  }
  if (!OneDnnHasBf16Matmul()) {
    GemmBf16Widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  ThreadState& s = State();
  const Key key{M,
                N,
                K,
                lda,
                ldb,
                ldc,
                ta == Trans::kYes,
                tb == Trans::kYes,
                FloatBits(alpha),
                FloatBits(beta),
                omp_get_max_threads()};
  Entry& e = Lookup(s, key, alpha, beta);
  // oneDNN only reads A and B; its C API takes non-const handles.
  ST_CHECK(dnnl_memory_set_data_handle(e.a.get(), const_cast<uint16_t*>(A)) == dnnl_success);
  ST_CHECK(dnnl_memory_set_data_handle(e.b.get(), const_cast<uint16_t*>(B)) == dnnl_success);
  ST_CHECK(dnnl_memory_set_data_handle(e.c.get(), C) == dnnl_success);
  int nargs = 3;
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e.a.get()},
                             {DNNL_ARG_WEIGHTS, e.b.get()},
                             {DNNL_ARG_DST, e.c.get()},
                             {DNNL_ARG_SCRATCHPAD, e.scratch.get()}};
  if (e.scratch_bytes > 0) {
    constexpr size_t kAlign = 64;
    if (s.scratchpad.size() < e.scratch_bytes + kAlign)
      s.scratchpad.resize(e.scratch_bytes + kAlign);
    void* p = s.scratchpad.data();
    size_t space = s.scratchpad.size();
    std::align(kAlign, e.scratch_bytes, p, space);
    ST_CHECK(dnnl_memory_set_data_handle(e.scratch.get(), p) == dnnl_success);
    nargs = 4;
  }
  // The C API with arguments on the stack: the C++ execute() builds an unordered_map per call.
  const dnnl_status_t st = dnnl_primitive_execute(e.prim.get(), s.stream.get(), nargs, args);
  ST_CHECK(st == dnnl_success) << "oneDNN matmul failed with status " << static_cast<int>(st);
}

void Gemm(Precision p, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (p == Precision::kFp32) {
    cblas_sgemm(CblasRowMajor, ta == Trans::kYes ? CblasTrans : CblasNoTrans,
                tb == Trans::kYes ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta,
                C, ldc);
    return;
  }
  // Pack each operand as stored (rows x cols of its storage), rounding to bf16; the packed copy
  // keeps the transposition, which oneDNN reads through strides. An operand larger than
  // kBf16OperandCap elements is taken in blocks of rows of C (A) or columns of C (B), so the
  // scratch stays bounded (the tied head's cached [N, V] logits would otherwise need their own
  // bf16 copy).
  ThreadState& s = State();
  const int64_t mb = std::max<int64_t>(1, std::min(M, kBf16OperandCap / std::max<int64_t>(K, 1)));
  const int64_t nb = std::max<int64_t>(1, std::min(N, kBf16OperandCap / std::max<int64_t>(K, 1)));
  if (static_cast<int64_t>(s.a16.size()) < mb * K) s.a16.resize(mb * K);
  if (static_cast<int64_t>(s.b16.size()) < nb * K) s.b16.resize(nb * K);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t n = std::min(nb, N - n0);
    // op(B)[:, n0 : n0 + n]: stored [K, ldb] (columns n0..) or, transposed, [N, ldb] (rows n0..).
    if (tb == Trans::kYes)
      RoundToBf16(B + n0 * ldb, n, K, ldb, s.b16.data());
    else
      RoundToBf16(B + n0, K, n, ldb, s.b16.data());
    const int64_t ldb16 = tb == Trans::kYes ? K : n;
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
      const int64_t m = std::min(mb, M - m0);
      if (ta == Trans::kYes)
        RoundToBf16(A + m0, K, m, lda, s.a16.data());
      else
        RoundToBf16(A + m0 * lda, m, K, lda, s.a16.data());
      const int64_t lda16 = ta == Trans::kYes ? m : K;
      GemmBf16(ta, tb, m, n, K, alpha, s.a16.data(), lda16, s.b16.data(), ldb16, beta,
               C + m0 * ldc + n0, ldc);
    }
  }
}

bool GemmBf16Native() {
  return OneDnnHasBf16Matmul();
}

size_t GemmScratchBytes() {
  const ThreadState& s = State();
  return (s.a16.capacity() + s.b16.capacity()) * sizeof(uint16_t) + s.scratchpad.capacity();
}

int64_t GemmPrimitivesCreated() {
  return State().created;
}

}  // namespace st::cpu
