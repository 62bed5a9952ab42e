// Fast CPU kernels against the naive reference on random shapes (odd sizes included), the fast
// math against libm, and finite differences for every reference backward.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>

#include "core/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/quant.h"
#include "kernels/gelu.h"
#include "kernels/ref/attention_probs.h"
#include "kernels/ref/ops_ref.h"
#include "test_util.h"

namespace st {
namespace {

using test::Dot;
using test::RandomVec;
using test::RelError;

constexpr double kParityTol = 2e-5;

TEST(FastMath, ExpMatchesLibm) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.01371f) {
    double ref = std::exp(double(x));
    worst = std::max(worst, std::fabs(cpu::FastExp(x) - ref) / ref);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(cpu::FastExp(0.0f), 1.0f);
}

TEST(FastMath, TanhMatchesLibm) {
  double worst = 0;
  for (float x = -12.0f; x < 12.0f; x += 0.000913f) {
    double ref = std::tanh(double(x));
    worst = std::max(worst, std::fabs(cpu::FastTanh(x) - ref) / std::max(std::fabs(ref), 1e-30));
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(cpu::FastTanh(0.0f), 0.0f);
  EXPECT_FLOAT_EQ(cpu::FastTanh(40.0f), 1.0f);
  EXPECT_FLOAT_EQ(cpu::FastTanh(-40.0f), -1.0f);
}

struct LinearShape {
  int64_t N, in, out;
};

class LinearParity : public ::testing::TestWithParam<LinearShape> {};

TEST_P(LinearParity, ForwardAndBackward) {
  const auto [N, in, out] = GetParam();
  auto x = RandomVec(N * in, 1), w = RandomVec(out * in, 2), dy = RandomVec(N * out, 3);
  for (bool acc : {false, true}) {
    auto y0 = RandomVec(N * out, 4), y1 = y0;
    ref::LinearForward(x.data(), w.data(), y0.data(), N, in, out, 0.75f, acc);
    cpu::LinearForward(x.data(), w.data(), y1.data(), N, in, out, 0.75f, acc);
    EXPECT_LT(RelError(y1, y0), kParityTol);
    auto dx0 = RandomVec(N * in, 5), dx1 = dx0, dw0 = RandomVec(out * in, 6), dw1 = dw0;
    ref::LinearBackward(x.data(), w.data(), dy.data(), dx0.data(), dw0.data(), N, in, out, 0.5f,
                        acc);
    cpu::LinearBackward(x.data(), w.data(), dy.data(), dx1.data(), dw1.data(), N, in, out, 0.5f,
                        acc);
    EXPECT_LT(RelError(dx1, dx0), kParityTol);
    EXPECT_LT(RelError(dw1, dw0), kParityTol);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearParity,
                         ::testing::Values(LinearShape{1, 1, 1}, LinearShape{1, 70, 300},
                                           LinearShape{7, 13, 5}, LinearShape{64, 33, 17},
                                           LinearShape{130, 64, 200}));

// bf16-stored weights (decoding): the product with the widened weights, for one row (the
// matrix-vector path, rows in blocks of four and a remainder) and for several rows, over more
// than one tile of widened weights.
TEST(LinearBf16, EqualsTheProductWithWidenedWeights) {
  for (const LinearShape s :
       {LinearShape{1, 70, 300}, LinearShape{1, 1, 1}, LinearShape{9, 33, 130},
        LinearShape{70, 64, 64}, LinearShape{3, 40000, 60}, LinearShape{1, 96, 11},
        LinearShape{1, 1536, 64}}) {
    SCOPED_TRACE(std::to_string(s.N) + "x" + std::to_string(s.in) + "x" + std::to_string(s.out));
    auto x = RandomVec(s.N * s.in, 1), w = RandomVec(s.out * s.in, 2);
    std::vector<uint16_t> half(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      half[i] = FloatToBF16(w[i]);
      w[i] = BF16ToFloat(half[i]);
    }
    std::vector<float> want(static_cast<size_t>(s.N * s.out)), got(want.size(), -7.0f);
    std::vector<float> scratch(static_cast<size_t>(cpu::Bf16ScratchFloats(s.in)));
    ref::LinearForward(x.data(), w.data(), want.data(), s.N, s.in, s.out, 1.0f, false);
    cpu::LinearForwardBf16(x.data(), half.data(), got.data(), s.N, s.in, s.out, scratch.data());
    EXPECT_LT(RelError(got, want), kParityTol);
  }
}

TEST(EmbeddingParity, RepeatedIdsAndPadding) {
  const int64_t V = 37, C = 19, N = 300;
  std::vector<int32_t> ids(N);
  Rng rng(7);
  for (auto& id : ids) id = static_cast<int32_t>(rng.Below(V));
  ids[0] = 0;
  auto table = RandomVec(V * C, 8), dout = RandomVec(N * C, 9);
  std::vector<float> o0(N * C), o1(N * C);
  ref::EmbeddingForward(ids.data(), table.data(), o0.data(), N, C, 3.5f);
  cpu::EmbeddingForward(ids.data(), table.data(), o1.data(), N, C, 3.5f);
  EXPECT_EQ(o0, o1);
  std::vector<float> g0(V * C, 0.f), g1(V * C, 0.f);
  ref::EmbeddingBackward(ids.data(), dout.data(), g0.data(), N, C, 3.5f, 0);
  cpu::EmbeddingBackward(ids.data(), dout.data(), g1.data(), N, C, 3.5f, 0);
  EXPECT_LT(RelError(g1, g0), kParityTol);
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(g0[c], 0.0f) << "padding row got a gradient";
}

TEST(RmsNormParity, WithAndWithoutWeight) {
  // C >= 3: with C = 1 the exact dx is 0 and only rounding noise is left to compare.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 3}, {5, 7}, {33, 64}, {257, 130}}) {
    auto x = RandomVec(N * C, 10), w = RandomVec(C, 11), dy = RandomVec(N * C, 12);
    for (bool use_w : {true, false}) {
      const float* wp = use_w ? w.data() : nullptr;
      std::vector<float> y0(N * C), y1(N * C), r0(N), r1(N);
      ref::RmsNormForward(x.data(), wp, y0.data(), r0.data(), N, C, 1e-6f);
      cpu::RmsNormForward(x.data(), wp, y1.data(), r1.data(), N, C, 1e-6f);
      EXPECT_LT(RelError(y1, y0), kParityTol);
      for (bool acc : {false, true}) {
        auto dx0 = RandomVec(N * C, 13), dx1 = dx0, dw0 = RandomVec(C, 14), dw1 = dw0;
        ref::RmsNormBackward(x.data(), wp, r0.data(), dy.data(), dx0.data(),
                             use_w ? dw0.data() : nullptr, N, C, acc);
        cpu::RmsNormBackward(x.data(), wp, r0.data(), dy.data(), dx1.data(),
                             use_w ? dw1.data() : nullptr, N, C, acc);
        EXPECT_LT(RelError(dx1, dx0), kParityTol);
        EXPECT_LT(RelError(dw1, dw0), kParityTol);
      }
    }
  }
}

TEST(RopeParity, ForwardInverseAndParity) {
  const int64_t B = 2, T = 9, Hh = 3, D = 10, half = D / 2;
  auto x = RandomVec(B * T * Hh * D, 15);
  std::vector<float> cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      cs[t * half + j] = std::cos(0.3f * t * (j + 1));
      sn[t * half + j] = std::sin(0.3f * t * (j + 1));
    }
  auto a = x, b = x;
  ref::Rope(a.data(), cs.data(), sn.data(), nullptr, B, T, Hh, D, false);
  cpu::Rope(b.data(), cs.data(), sn.data(), nullptr, B, T, Hh, D, false);
  EXPECT_LT(RelError(b, a), 1e-6);
  cpu::Rope(b.data(), cs.data(), sn.data(), nullptr, B, T, Hh, D, true);
  EXPECT_LT(RelError(b, x), 1e-6) << "inverse rope is not the inverse";
}

struct AttnCase {
  int64_t B, T, H, Hkv, D, window;
  // 0 none, 1 right padding, 2 left padding (rows with no visible key), 3 mixed (per batch row
  // b % 3: none, right, left), 4 long left padding (T/2 + b: whole query blocks without a visible
  // key), 5 batch row 1 all padding (the others left-padded), 6 long right padding (T/3 + b).
  int pad_kind;
  int threads = 0;  // OpenMP threads for the fast kernel; 0: the default
};

std::vector<uint8_t> MakePad(const AttnCase& c) {
  std::vector<uint8_t> pad(c.B * c.T, 1);
  for (int64_t b = 0; b < c.B; ++b) {
    const int kind = c.pad_kind == 3 ? static_cast<int>(b % 3) : c.pad_kind;
    const int64_t run = kind == 4 ? c.T / 2 + b : kind == 6 ? c.T / 3 + b : 3 + b;
    const int64_t n = kind == 5 && b == 1 ? c.T : std::min<int64_t>(c.T - 1, run);
    for (int64_t j = 0; j < n; ++j) {
      if (kind == 1 || kind == 6) pad[b * c.T + c.T - 1 - j] = 0;
      if (kind == 2 || kind == 4 || kind == 5) pad[b * c.T + j] = 0;
    }
  }
  return pad;
}

std::string Describe(const AttnCase& c) {
  std::ostringstream s;
  s << "B" << c.B << " T" << c.T << " H" << c.H << " Hkv" << c.Hkv << " D" << c.D << " W"
    << c.window << " pad" << c.pad_kind << " threads" << c.threads;
  return s.str();
}

void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << Describe(c);
}

// Sets the OpenMP/BLAS thread count for a scope and restores the previous one.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(cpu::NumThreads()) {
    if (n > 0) cpu::SetNumThreads(n);
  }
  ~ScopedThreads() { cpu::SetNumThreads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// Random attention inputs of one case.
struct AttnInputs {
  explicit AttnInputs(const AttnCase& c)
      : nq(c.B * c.T * c.H * c.D),
        nk(c.B * c.T * c.Hkv * c.D),
        q(RandomVec(nq, 20)),
        k(RandomVec(nk, 21)),
        v(RandomVec(nk, 22)),
        go(RandomVec(nq, 23)),
        pad(MakePad(c)),
        mask{c.pad_kind ? pad.data() : nullptr, c.window} {}
  int64_t nq, nk;
  std::vector<float> q, k, v, go;
  std::vector<uint8_t> pad;
  AttnMask mask;
};

// lse within tol of the reference; +inf exactly where the reference has it.
void ExpectLseNear(const std::vector<float>& lse, const std::vector<float>& ref, double tol) {
  ASSERT_EQ(lse.size(), ref.size());
  int64_t bad = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    const bool ok = std::isinf(ref[i]) ? lse[i] == ref[i]
                                       : std::fabs(double(lse[i]) - ref[i]) <=
                                             tol * (1.0 + std::fabs(double(ref[i])));
    if (!ok && bad++ < 5) ADD_FAILURE() << "lse[" << i << "] " << lse[i] << " vs " << ref[i];
  }
  EXPECT_EQ(bad, 0);
}

// RelError, or the absolute error where the reference is exactly 0: with T = 1 the one key's
// dS = P (dP - Di) cancels exactly in the reference and only to rounding in the tiled kernel,
// whose Di = rowsum(dout * out) is summed in another order.
double GradError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

class AttentionParity : public ::testing::TestWithParam<AttnCase> {};

// The tiled kernel against the naive reference.
TEST_P(AttentionParity, ForwardAndBackward) {
  const AttnCase c = GetParam();
  const AttnInputs in(c);
  const int64_t nq = in.nq, nk = in.nk;
  std::vector<float> o0(nq), o1(nq), l0(c.B * c.H * c.T), l1(l0.size());
  ref::AttentionForward(in.q.data(), in.k.data(), in.v.data(), o0.data(), l0.data(), c.B, c.T, c.H,
                        c.Hkv, c.D, in.mask);
  ScopedThreads threads(c.threads);
  cpu::AttentionForward(in.q.data(), in.k.data(), in.v.data(), o1.data(), l1.data(), c.B, c.T, c.H,
                        c.Hkv, c.D, in.mask);
  EXPECT_LT(RelError(o1, o0), kParityTol);
  ExpectLseNear(l1, l0, 1e-5);
  auto dk0 = RandomVec(nk, 24), dk1 = dk0, dv0 = RandomVec(nk, 25), dv1 = dv0;
  std::vector<float> dq0(nq), dq1(nq);
  ref::AttentionBackward(in.q.data(), in.k.data(), in.v.data(), o0.data(), l0.data(), in.go.data(),
                         dq0.data(), dk0.data(), dv0.data(), c.B, c.T, c.H, c.Hkv, c.D, in.mask);
  cpu::AttentionBackward(in.q.data(), in.k.data(), in.v.data(), o1.data(), l1.data(), in.go.data(),
                         dq1.data(), dk1.data(), dv1.data(), c.B, c.T, c.H, c.Hkv, c.D, in.mask);
  EXPECT_LT(GradError(dq1, dq0), 5e-5);
  EXPECT_LT(GradError(dk1, dk0), 5e-5);
  EXPECT_LT(GradError(dv1, dv0), 5e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionParity,
    ::testing::Values(AttnCase{1, 1, 1, 1, 2, 0, 0}, AttnCase{2, 7, 4, 2, 6, 0, 0},
                      AttnCase{2, 70, 4, 1, 8, 0, 1}, AttnCase{3, 70, 2, 2, 4, 5, 2},
                      AttnCase{3, 131, 4, 2, 16, 64, 3}, AttnCase{1, 129, 8, 1, 5, 0, 2},
                      AttnCase{4, 65, 2, 1, 8, 1, 3}, AttnCase{2, 200, 2, 1, 8, 0, 4},
                      AttnCase{3, 150, 2, 1, 4, 20, 5}, AttnCase{1, 140, 2, 2, 8, 3, 6, 3},
                      // GQA groups that do not divide the 64-row tile, or exceed it
                      AttnCase{2, 100, 6, 2, 8, 30, 3}, AttnCase{1, 70, 80, 1, 4, 0, 2, 2}));

// The tiled kernel against the previous kernel (probabilities [B,H,T,T], AttentionProbs*): sizes
// that are not multiples of the 64-row or 128-key blocks, windows longer and much shorter than T,
// GQA 8:1, every padding kind, rows with no visible key, and both backward schedules (one task
// per (batch, kv head) when B*Hkv >= threads, the two-pass one otherwise).
class AttentionVsProbs : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionVsProbs, ForwardBackwardAndLse) {
  const AttnCase c = GetParam();
  SCOPED_TRACE(Describe(c));
  const AttnInputs in(c);
  const int64_t nq = in.nq, nk = in.nk, T = c.T;
  std::vector<float> o0(nq), probs(c.B * c.H * T * T), o1(nq), lse(c.B * c.H * T);
  ref::AttentionProbsForward(in.q.data(), in.k.data(), in.v.data(), o0.data(), probs.data(), c.B, T,
                             c.H, c.Hkv, c.D, in.mask);
  auto dk0 = RandomVec(nk, 24), dk1 = dk0, dv0 = RandomVec(nk, 25), dv1 = dv0;
  std::vector<float> dq0(nq), dq1(nq);
  ref::AttentionProbsBackward(in.q.data(), in.k.data(), in.v.data(), probs.data(), in.go.data(),
                              dq0.data(), dk0.data(), dv0.data(), c.B, T, c.H, c.Hkv, c.D, in.mask);
  {
    ScopedThreads threads(c.threads);
    cpu::AttentionForward(in.q.data(), in.k.data(), in.v.data(), o1.data(), lse.data(), c.B, T, c.H,
                          c.Hkv, c.D, in.mask);
    cpu::AttentionBackward(in.q.data(), in.k.data(), in.v.data(), o1.data(), lse.data(),
                           in.go.data(), dq1.data(), dk1.data(), dv1.data(), c.B, T, c.H, c.Hkv,
                           c.D, in.mask);
  }
  EXPECT_LT(RelError(o1, o0), 5e-5);
  EXPECT_LT(GradError(dq1, dq0), 5e-5);
  EXPECT_LT(GradError(dk1, dk0), 5e-5);
  EXPECT_LT(GradError(dv1, dv0), 5e-5);

  // lse against the log-sum-exp of the scores (in double), and exp(s - lse) against the oracle's
  // probabilities on every visible key; rows with no visible key: +inf and the oracle's 1/T.
  const int64_t group = c.H / c.Hkv;
  std::vector<double> s(T);
  std::vector<float> lse_ref(lse.size());
  double worst_p = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < c.D; ++d)
            s[j] += double(in.q[((b * T + i) * c.H + h) * c.D + d]) *
                    in.k[((b * T + j) * c.Hkv + h / group) * c.D + d];
          if (in.mask.Visible(b, T, i, j)) mx = std::max(mx, s[j]);
        }
        const float* p = probs.data() + ((b * c.H + h) * T + i) * T;
        const float l = lse[(b * c.H + h) * T + i];
        if (mx == -INFINITY) {
          lse_ref[(b * c.H + h) * T + i] = INFINITY;
          for (int64_t j = 0; j < T; ++j) worst_p = std::max(worst_p, std::fabs(p[j] - 1.0 / T));
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j)
          if (in.mask.Visible(b, T, i, j)) sum += std::exp(s[j] - mx);
        lse_ref[(b * c.H + h) * T + i] = static_cast<float>(mx + std::log(sum));
        for (int64_t j = 0; j < T; ++j)
          if (in.mask.Visible(b, T, i, j))
            worst_p = std::max(worst_p, std::fabs(std::exp(s[j] - l) - p[j]));
      }
  ExpectLseNear(lse, lse_ref, 5e-6);
  EXPECT_LT(worst_p, 1e-5) << "exp(s - lse) differs from the oracle's probabilities";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionVsProbs,
    ::testing::Values(
        // T not a multiple of the query (64) or key (128) block; full causal, one task per
        // (batch, kv head) and two-pass
        AttnCase{2, 200, 4, 2, 16, 0, 0, 2}, AttnCase{1, 333, 2, 1, 8, 0, 0, 2},
        AttnCase{1, 333, 4, 2, 8, 0, 3, 3},
        // GQA 8:1
        AttnCase{2, 333, 8, 1, 8, 0, 1, 2}, AttnCase{1, 200, 8, 1, 16, 64, 2, 2},
        // window longer than T, window much shorter than T (whole key blocks skipped)
        AttnCase{2, 50, 2, 1, 8, 128, 1, 2}, AttnCase{1, 700, 2, 1, 16, 64, 0, 2},
        AttnCase{2, 700, 2, 2, 8, 64, 3, 4}, AttnCase{3, 257, 2, 1, 8, 7, 6, 2},
        // rows with no visible key: left padding under a window, long left padding (whole
        // query blocks), a batch row entirely padding, right padding longer than the window
        AttnCase{2, 333, 2, 1, 8, 2, 2, 2}, AttnCase{2, 333, 4, 1, 8, 64, 4, 2},
        AttnCase{2, 333, 4, 1, 8, 64, 4, 1}, AttnCase{3, 200, 2, 1, 8, 0, 5, 2},
        AttnCase{3, 200, 2, 1, 8, 40, 5, 4}, AttnCase{2, 333, 2, 1, 8, 16, 6, 2},
        // B * Hkv >= threads
        AttnCase{4, 200, 4, 2, 16, 0, 3, 2}, AttnCase{4, 130, 4, 2, 16, 32, 4, 1},
        AttnCase{1, 129, 1, 1, 4, 0, 0, 1}),
    [](const ::testing::TestParamInfo<AttnCase>& info) {
      return "case" + std::to_string(info.index);
    });

// Document masking (packed examples): every query sees only the keys of its own document, and a
// window restarts with each document. The tiled kernel against the naive reference and the
// probabilities kernel, with documents shorter and longer than the query and key blocks, a
// window, padding after the last document (it continues the last document's positions, as packed
// batches lay it out), and both backward schedules. All three kernels read the same AttnMask, so
// parity alone cannot catch a wrong mask: the mask is also checked against one built here from
// the position ids alone, and keys of other documents are changed to show that no query sees them.
struct DocCase {
  int64_t B, T, H, Hkv, D, window, max_doc;
  int threads;
};

// Which keys each query may see, from position ids alone (not through AttnMask): a document
// starts where the position is 0; query i sees key j iff they are in the same document, j <= i,
// i - j < window (when there is one) and j is not padding. [B, T, T], 1 = visible.
std::vector<uint8_t> MaskFromPositions(const std::vector<int32_t>& pos,
                                       const std::vector<uint8_t>& pad, int64_t B, int64_t T,
                                       int64_t window) {
  std::vector<int64_t> doc(B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, d = -1; t < T; ++t) doc[b * T + t] = d += pos[b * T + t] == 0;
  std::vector<uint8_t> m(B * T * T, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j)
        m[(b * T + i) * T + j] = doc[b * T + i] == doc[b * T + j] &&
                                 (window == 0 || i - j < window) && pad[b * T + j] != 0;
  return m;
}

// Attention over the visible keys of `vis` in double; a query without a visible key averages
// every value of its row (the kernels' convention for fully padded rows). [B, T, H, D]
std::vector<float> NaiveMaskedAttention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const std::vector<uint8_t>& vis, int64_t B, int64_t T,
                                        int64_t H, int64_t Hkv, int64_t D) {
  std::vector<float> out(B * T * H * D);
  std::vector<double> w(T), acc(D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = &q[((b * T + i) * H + h) * D];
        const uint8_t* row = &vis[(b * T + i) * T];
        const bool any = std::any_of(row, row + T, [](uint8_t x) { return x != 0; });
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (any && !row[j]) continue;
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += double(qi[e]) * k[((b * T + j) * Hkv + g) * D + e];
          w[j] = any ? s : 0.0;
          mx = std::max(mx, w[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < T; ++j) {
          if (any && !row[j]) continue;
          const double p = std::exp(w[j] - mx);
          sum += p;
          for (int64_t e = 0; e < D; ++e) acc[e] += p * v[((b * T + j) * Hkv + g) * D + e];
        }
        for (int64_t e = 0; e < D; ++e)
          out[((b * T + i) * H + h) * D + e] = static_cast<float>(acc[e] / sum);
      }
    }
  return out;
}

TEST(AttentionDocuments, TiledMatchesReferenceAndProbs) {
  int64_t checked_after_other_docs = 0;
  for (const DocCase& c : {DocCase{2, 200, 4, 2, 8, 0, 40, 2}, DocCase{3, 333, 2, 1, 8, 16, 150, 2},
                           DocCase{1, 300, 4, 1, 8, 0, 300, 3}, DocCase{4, 130, 2, 2, 4, 5, 20, 1},
                           DocCase{2, 260, 8, 1, 8, 64, 90, 2}}) {
    SCOPED_TRACE(testing::Message() << "B" << c.B << " T" << c.T << " W" << c.window
                                    << " docs<=" << c.max_doc << " threads" << c.threads);
    // Position ids as packing lays them out: they restart at 0 with each document; padding
    // continues the last document's. The kernels' AttnMask::start is derived from them as the
    // engine does (start = t - pos); the reference mask below reads only pos and pad.
    std::vector<int32_t> pos(c.B * c.T), start(c.B * c.T);
    std::vector<uint8_t> pad(c.B * c.T, 1);
    std::vector<int64_t> doc(c.B * c.T);  // document index within the row
    Rng rng(7 + c.T);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t used = c.T - static_cast<int64_t>(rng.Below(c.T / 4));  // the rest is padding
      int64_t t = 0;
      while (t < used) {
        const int64_t n = std::min<int64_t>(used - t, 1 + rng.Below(c.max_doc));
        for (int64_t k = 0; k < n; ++k, ++t) pos[b * c.T + t] = static_cast<int32_t>(k);
      }
      for (; t < c.T; ++t) pos[b * c.T + t] = pos[b * c.T + t - 1] + 1, pad[b * c.T + t] = 0;
      for (int64_t u = 0, d = -1; u < c.T; ++u) {
        d += pos[b * c.T + u] == 0;
        doc[b * c.T + u] = d;
        start[b * c.T + u] = static_cast<int32_t>(u - pos[b * c.T + u]);
      }
    }
    const AttnMask mask{pad.data(), c.window, start.data()};
    const int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.Hkv * c.D;
    const auto q = RandomVec(nq, 30), k = RandomVec(nk, 31), v = RandomVec(nk, 32),
               go = RandomVec(nq, 33);
    std::vector<float> o0(nq), o1(nq), o2(nq), l0(c.B * c.H * c.T), l1(l0.size());
    std::vector<float> probs(c.B * c.H * c.T * c.T);
    ref::AttentionForward(q.data(), k.data(), v.data(), o0.data(), l0.data(), c.B, c.T, c.H, c.Hkv,
                          c.D, mask);
    ref::AttentionProbsForward(q.data(), k.data(), v.data(), o2.data(), probs.data(), c.B, c.T, c.H,
                               c.Hkv, c.D, mask);
    auto dk0 = RandomVec(nk, 34), dk1 = dk0, dk2 = dk0, dv0 = RandomVec(nk, 35), dv1 = dv0,
         dv2 = dv0;
    std::vector<float> dq0(nq), dq1(nq), dq2(nq);
    ref::AttentionBackward(q.data(), k.data(), v.data(), o0.data(), l0.data(), go.data(),
                           dq0.data(), dk0.data(), dv0.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
    ref::AttentionProbsBackward(q.data(), k.data(), v.data(), probs.data(), go.data(), dq2.data(),
                                dk2.data(), dv2.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
    {
      ScopedThreads threads(c.threads);
      cpu::AttentionForward(q.data(), k.data(), v.data(), o1.data(), l1.data(), c.B, c.T, c.H,
                            c.Hkv, c.D, mask);
      cpu::AttentionBackward(q.data(), k.data(), v.data(), o1.data(), l1.data(), go.data(),
                             dq1.data(), dk1.data(), dv1.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
    }
    EXPECT_LT(RelError(o1, o0), kParityTol);
    EXPECT_LT(RelError(o2, o0), kParityTol);
    ExpectLseNear(l1, l0, 1e-5);
    EXPECT_LT(GradError(dq1, dq0), 5e-5);
    EXPECT_LT(GradError(dk1, dk0), 5e-5);
    EXPECT_LT(GradError(dv1, dv0), 5e-5);
    EXPECT_LT(GradError(dq2, dq0), 5e-5);
    EXPECT_LT(GradError(dk2, dk0), 5e-5);
    EXPECT_LT(GradError(dv2, dv0), 5e-5);

    // The mask itself, against the one built from position ids: the probabilities kernel's
    // nonzero probabilities are exactly the visible keys (a row without any attends uniformly),
    // and every kernel's output equals attention over exactly those keys.
    const std::vector<uint8_t> vis = MaskFromPositions(pos, pad, c.B, c.T, c.window);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < c.T; ++i) {
        const uint8_t* row = &vis[(b * c.T + i) * c.T];
        const bool any = std::any_of(row, row + c.T, [](uint8_t x) { return x != 0; });
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t j = 0; j < c.T; ++j) {
            const float p = probs[((b * c.H + h) * c.T + i) * c.T + j];
            if (any) {
              ASSERT_EQ(p > 0.0f, row[j] != 0) << "b " << b << " query " << i << " key " << j;
            } else {
              ASSERT_EQ(p, 1.0f / static_cast<float>(c.T)) << "b " << b << " query " << i;
            }
          }
      }
    const std::vector<float> want = NaiveMaskedAttention(q, k, v, vis, c.B, c.T, c.H, c.Hkv, c.D);
    EXPECT_LT(RelError(o0, want), kParityTol);
    EXPECT_LT(RelError(o1, want), kParityTol);
    EXPECT_LT(RelError(o2, want), kParityTol);

    // No query sees a key of another document, earlier or later: change the keys and values of
    // the odd-numbered documents of every row, then of the even-numbered ones; the outputs of the
    // queries in the other documents stay bit-identical in every kernel (a query of document 2
    // would see document 1's keys without document masking), and those of the changed documents
    // change.
    for (int parity = 0; parity < 2; ++parity) {
      SCOPED_TRACE(parity ? "odd documents changed" : "even documents changed");
      auto k2 = k, v2 = v;
      for (int64_t n = 0; n < c.B * c.T; ++n)
        if (doc[n] % 2 == parity)
          for (int64_t j = 0; j < c.Hkv * c.D; ++j) {
            k2[n * c.Hkv * c.D + j] += 1.0f;
            v2[n * c.Hkv * c.D + j] -= 2.0f;
          }
      std::vector<float> r0(nq), r1(nq), r2(nq), lse(l0.size());
      ref::AttentionForward(q.data(), k2.data(), v2.data(), r0.data(), lse.data(), c.B, c.T, c.H,
                            c.Hkv, c.D, mask);
      ref::AttentionProbsForward(q.data(), k2.data(), v2.data(), r2.data(), probs.data(), c.B, c.T,
                                 c.H, c.Hkv, c.D, mask);
      {
        ScopedThreads threads(c.threads);
        cpu::AttentionForward(q.data(), k2.data(), v2.data(), r1.data(), lse.data(), c.B, c.T, c.H,
                              c.Hkv, c.D, mask);
      }
      int64_t changed = 0, in_changed_docs = 0;
      for (int64_t n = 0; n < c.B * c.T; ++n) {
        const int64_t lo = n * c.H * c.D, hi = lo + c.H * c.D;
        if (doc[n] % 2 == parity) {
          ++in_changed_docs;
          changed += !std::equal(r1.begin() + lo, r1.begin() + hi, o1.begin() + lo);
          continue;
        }
        // A query without a visible key (padding past the window) attends to every key.
        const uint8_t* row = &vis[n * c.T];
        if (std::none_of(row, row + c.T, [](uint8_t x) { return x != 0; })) continue;
        checked_after_other_docs += doc[n] > 0;
        for (int64_t j = lo; j < hi; ++j) {
          ASSERT_EQ(r0[j], o0[j]) << "ref, token " << n;
          ASSERT_EQ(r1[j], o1[j]) << "tiled, token " << n;
          ASSERT_EQ(r2[j], o2[j]) << "probs, token " << n;
        }
      }
      if (in_changed_docs > 0) {
        EXPECT_GT(changed, in_changed_docs / 2);
      }
    }
  }
  // Queries with an earlier document in their row were checked (the test is not only causal).
  EXPECT_GT(checked_after_other_docs, 1000);
}

// Positions per token: RoPE at pos[b, t] equals RoPE of the same vector placed at t = pos.
TEST(RopeParity, PositionIds) {
  const int64_t B = 2, T = 9, Hh = 3, D = 8, half = D / 2;
  std::vector<float> cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      cs[t * half + j] = std::cos(0.3f * t * (j + 1));
      sn[t * half + j] = std::sin(0.3f * t * (j + 1));
    }
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 0, 1};
  const auto x = RandomVec(B * T * Hh * D, 40);
  auto a = x, b = x;
  ref::Rope(a.data(), cs.data(), sn.data(), pos.data(), B, T, Hh, D, false);
  cpu::Rope(b.data(), cs.data(), sn.data(), pos.data(), B, T, Hh, D, false);
  EXPECT_LT(RelError(b, a), 1e-6);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) {
      // The token alone in a row of pos + 1 positions, at the last one.
      const int64_t p = pos[r * T + t];
      std::vector<float> one((p + 1) * Hh * D, 0.f);
      std::copy_n(x.begin() + (r * T + t) * Hh * D, Hh * D, one.begin() + p * Hh * D);
      cpu::Rope(one.data(), cs.data(), sn.data(), nullptr, 1, p + 1, Hh, D, false);
      for (int64_t j = 0; j < Hh * D; ++j)
        ASSERT_EQ(one[p * Hh * D + j], b[(r * T + t) * Hh * D + j]);
    }
  cpu::Rope(b.data(), cs.data(), sn.data(), pos.data(), B, T, Hh, D, true);
  EXPECT_LT(RelError(b, x), 1e-6);
}

// Two calls with the same inputs and thread count give the same bytes, in both backward schedules.
TEST(AttentionDeterminism, RepeatedCallsAreBitIdentical) {
  for (const AttnCase& c :
       {AttnCase{4, 333, 4, 2, 16, 64, 3, 2}, AttnCase{1, 700, 4, 1, 16, 0, 4, 2},
        AttnCase{1, 300, 4, 2, 8, 0, 0, 4}}) {
    SCOPED_TRACE(Describe(c));
    const AttnInputs in(c);
    ScopedThreads threads(c.threads);
    std::vector<float> out[2], lse[2], dq[2], dk[2], dv[2];
    for (int run = 0; run < 2; ++run) {
      out[run].assign(in.nq, 0.f);
      lse[run].assign(c.B * c.H * c.T, 0.f);
      dq[run].assign(in.nq, 0.f);
      dk[run] = RandomVec(in.nk, 26);
      dv[run] = RandomVec(in.nk, 27);
      cpu::AttentionForward(in.q.data(), in.k.data(), in.v.data(), out[run].data(), lse[run].data(),
                            c.B, c.T, c.H, c.Hkv, c.D, in.mask);
      cpu::AttentionBackward(in.q.data(), in.k.data(), in.v.data(), out[run].data(),
                             lse[run].data(), in.go.data(), dq[run].data(), dk[run].data(),
                             dv[run].data(), c.B, c.T, c.H, c.Hkv, c.D, in.mask);
    }
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(out[0], out[1]));
    EXPECT_TRUE(same(lse[0], lse[1]));
    EXPECT_TRUE(same(dq[0], dq[1]));
    EXPECT_TRUE(same(dk[0], dk[1]));
    EXPECT_TRUE(same(dv[0], dv[1]));
  }
}

// The workspace estimate grows linearly in T (no [T, T] buffer) and covers what the kernels use.
TEST(AttentionWorkspace, LinearInT) {
  const double a = cpu::AttentionWorkspaceBytes(1, 4096, 8, 2, 256, 4);
  const double b = cpu::AttentionWorkspaceBytes(1, 8192, 8, 2, 256, 4);
  const double c = cpu::AttentionWorkspaceBytes(1, 16384, 8, 2, 256, 4);
  EXPECT_GT(b, a);
  EXPECT_NEAR(c - b, 2 * (b - a), 1e3);
  EXPECT_LT(c, 16384.0 * 256 * 4) << "more than a [T, 256] float buffer";
}

TEST(ElementwiseParity, GeluMulSoftcapCrossEntropy) {
  const int64_t n = 10007;
  auto a = RandomVec(n, 30, 3.0f), b = RandomVec(n, 31), go = RandomVec(n, 32);
  std::vector<float> o0(n), o1(n), da0(n), da1(n), db0(n), db1(n);
  ref::GeluMulForward(a.data(), b.data(), o0.data(), n);
  cpu::GeluMulForward(a.data(), b.data(), o1.data(), n);
  EXPECT_LT(RelError(o1, o0), kParityTol);
  ref::GeluMulBackward(a.data(), b.data(), go.data(), da0.data(), db0.data(), n);
  cpu::GeluMulBackward(a.data(), b.data(), go.data(), da1.data(), db1.data(), n);
  EXPECT_LT(RelError(da1, da0), kParityTol);
  EXPECT_LT(RelError(db1, db0), kParityTol);

  const int64_t N = 37, V = 1001;
  auto z = RandomVec(N * V, 33, 20.0f), z1 = z;
  ref::SoftcapForward(z.data(), N * V, 30.0f);
  cpu::SoftcapForward(z1.data(), N * V, 30.0f);
  EXPECT_LT(RelError(z1, z), kParityTol);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i)
    targets[i] = i % 5 == 0 ? -100 : static_cast<int32_t>((i * 131) % V);
  int64_t c0 = 0, c1 = 0;
  double l0 = ref::CrossEntropyForward(z.data(), targets.data(), N, V, &c0);
  double l1 = cpu::CrossEntropyForward(z.data(), targets.data(), N, V, &c1);
  EXPECT_EQ(c0, c1);
  EXPECT_NEAR(l1, l0, 1e-5 * std::fabs(l0));
  auto g0 = z, g1 = z;
  ref::CrossEntropySoftcapBackward(g0.data(), targets.data(), N, V, 30.0f, 1.0f / c0);
  cpu::CrossEntropySoftcapBackward(g1.data(), targets.data(), N, V, 30.0f, 1.0f / c0);
  EXPECT_LT(RelError(g1, g0), kParityTol);
}

// ---------------------------------------------------------------------------------------------
// Finite differences on the reference backward: for a random direction u,
// (f(x + eps u) - f(x - eps u)) / 2 eps must equal <grad f, u>, with f = <dout, op(x)>.

void ExpectDirectionalDerivative(const std::function<double(const std::vector<float>&)>& f,
                                 std::vector<float> x, const std::vector<float>& grad,
                                 uint64_t seed, double eps = 1e-2, double tol = 2e-3) {
  auto u = RandomVec(static_cast<int64_t>(x.size()), seed);
  auto xp = x, xm = x;
  for (size_t i = 0; i < x.size(); ++i) {
    xp[i] += static_cast<float>(eps) * u[i];
    xm[i] -= static_cast<float>(eps) * u[i];
  }
  const double numeric = (f(xp) - f(xm)) / (2 * eps);
  SCOPED_TRACE(testing::Message() << "direction seed " << seed);
  const double analytic = Dot(grad, u);
  EXPECT_NEAR(numeric, analytic, tol * (std::fabs(analytic) + std::fabs(numeric) + 1e-3))
      << "numeric " << numeric << " analytic " << analytic;
}

TEST(FiniteDifference, Linear) {
  const int64_t N = 5, in = 7, out = 3;
  auto x = RandomVec(N * in, 40), w = RandomVec(out * in, 41), dy = RandomVec(N * out, 42);
  std::vector<float> dx(N * in), dw(out * in, 0.f);
  ref::LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), N, in, out, 0.7f, false);
  auto fx = [&](const std::vector<float>& xx) {
    std::vector<float> y(N * out);
    ref::LinearForward(xx.data(), w.data(), y.data(), N, in, out, 0.7f, false);
    return Dot(y, dy);
  };
  auto fw = [&](const std::vector<float>& ww) {
    std::vector<float> y(N * out);
    ref::LinearForward(x.data(), ww.data(), y.data(), N, in, out, 0.7f, false);
    return Dot(y, dy);
  };
  ExpectDirectionalDerivative(fx, x, dx, 43);
  ExpectDirectionalDerivative(fw, w, dw, 44);
}

TEST(FiniteDifference, RmsNorm) {
  const int64_t N = 4, C = 9;
  auto x = RandomVec(N * C, 50), w = RandomVec(C, 51), dy = RandomVec(N * C, 52);
  std::vector<float> y(N * C), r(N), dx(N * C), dw(C, 0.f);
  ref::RmsNormForward(x.data(), w.data(), y.data(), r.data(), N, C, 1e-6f);
  ref::RmsNormBackward(x.data(), w.data(), r.data(), dy.data(), dx.data(), dw.data(), N, C, false);
  auto f = [&](const std::vector<float>& xx, const std::vector<float>& ww) {
    std::vector<float> yy(N * C), rr(N);
    ref::RmsNormForward(xx.data(), ww.data(), yy.data(), rr.data(), N, C, 1e-6f);
    return Dot(yy, dy);
  };
  ExpectDirectionalDerivative([&](const std::vector<float>& xx) { return f(xx, w); }, x, dx, 53,
                              1e-3);
  ExpectDirectionalDerivative([&](const std::vector<float>& ww) { return f(x, ww); }, w, dw, 54);
}

TEST(FiniteDifference, Rope) {
  const int64_t B = 1, T = 3, Hh = 2, D = 6, half = 3;
  auto x = RandomVec(B * T * Hh * D, 55), dy = RandomVec(B * T * Hh * D, 56);
  std::vector<float> cs(T * half), sn(T * half);
  for (int64_t i = 0; i < T * half; ++i) {
    cs[i] = std::cos(0.7f * i);
    sn[i] = std::sin(0.7f * i);
  }
  auto dx = dy;
  ref::Rope(dx.data(), cs.data(), sn.data(), nullptr, B, T, Hh, D, true);
  auto f = [&](const std::vector<float>& xx) {
    auto y = xx;
    ref::Rope(y.data(), cs.data(), sn.data(), nullptr, B, T, Hh, D, false);
    return Dot(y, dy);
  };
  ExpectDirectionalDerivative(f, x, dx, 57);
}

TEST(FiniteDifference, Attention) {
  // Right padding only: a row with no visible key (left padding) attends uniformly whatever q and
  // k are, yet autograd (and so our backward) still passes the softmax gradient to q and k, as
  // transformers' eager attention does; the golden tests check that case against torch.
  for (int pad_kind : {0, 1}) {
    const AttnCase c{3, 9, 4, 2, 4, 6, pad_kind};  // window > padding run: every row sees a key
    const int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.Hkv * c.D;
    auto q = RandomVec(nq, 60), k = RandomVec(nk, 61), v = RandomVec(nk, 62),
         go = RandomVec(nq, 63);
    auto pad = MakePad(c);
    AttnMask mask{pad_kind ? pad.data() : nullptr, c.window};
    std::vector<float> o(nq), lse(c.B * c.H * c.T), dq(nq), dk(nk, 0.f), dv(nk, 0.f);
    ref::AttentionForward(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.T, c.H, c.Hkv,
                          c.D, mask);
    ref::AttentionBackward(q.data(), k.data(), v.data(), o.data(), lse.data(), go.data(), dq.data(),
                           dk.data(), dv.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
    auto f = [&](const std::vector<float>& qq, const std::vector<float>& kk,
                 const std::vector<float>& vv) {
      std::vector<float> oo(nq), ll(lse.size());
      ref::AttentionForward(qq.data(), kk.data(), vv.data(), oo.data(), ll.data(), c.B, c.T, c.H,
                            c.Hkv, c.D, mask);
      return Dot(oo, go);
    };
    SCOPED_TRACE(testing::Message() << "pad_kind " << pad_kind);
    ExpectDirectionalDerivative([&](const std::vector<float>& x) { return f(x, k, v); }, q, dq, 64,
                                1e-3);
    ExpectDirectionalDerivative([&](const std::vector<float>& x) { return f(q, x, v); }, k, dk, 65,
                                1e-3);
    ExpectDirectionalDerivative([&](const std::vector<float>& x) { return f(q, k, x); }, v, dv, 66,
                                1e-3);
  }
}

TEST(FiniteDifference, GeluMul) {
  const int64_t n = 50;
  auto a = RandomVec(n, 70, 2.0f), b = RandomVec(n, 71), go = RandomVec(n, 72);
  std::vector<float> da(n), db(n);
  ref::GeluMulBackward(a.data(), b.data(), go.data(), da.data(), db.data(), n);
  auto f = [&](const std::vector<float>& aa, const std::vector<float>& bb) {
    std::vector<float> o(n);
    ref::GeluMulForward(aa.data(), bb.data(), o.data(), n);
    return Dot(o, go);
  };
  ExpectDirectionalDerivative([&](const std::vector<float>& x) { return f(x, b); }, a, da, 73,
                              1e-3);
  ExpectDirectionalDerivative([&](const std::vector<float>& x) { return f(a, x); }, b, db, 74,
                              1e-3);
}

TEST(FiniteDifference, SoftcapCrossEntropy) {
  const int64_t N = 6, V = 11;
  auto z = RandomVec(N * V, 75, 40.0f);
  std::vector<int32_t> t = {3, -100, 0, 10, 7, 7};
  auto loss = [&](const std::vector<float>& zz) {
    auto c = zz;
    ref::SoftcapForward(c.data(), N * V, 30.0f);
    int64_t valid = 0;
    return ref::CrossEntropyForward(c.data(), t.data(), N, V, &valid) / valid;
  };
  auto g = z;
  ref::SoftcapForward(g.data(), N * V, 30.0f);
  ref::CrossEntropySoftcapBackward(g.data(), t.data(), N, V, 30.0f, 1.0f / 5);
  ExpectDirectionalDerivative(loss, z, g, 76, 1e-2);
}

TEST(FiniteDifference, Embedding) {
  const int64_t V = 6, C = 4, N = 5;
  std::vector<int32_t> ids = {1, 0, 5, 1, 2};
  auto table = RandomVec(V * C, 77), dout = RandomVec(N * C, 78);
  std::vector<float> g(V * C, 0.f);
  ref::EmbeddingBackward(ids.data(), dout.data(), g.data(), N, C, 2.0f, /*padding_id=*/-1);
  auto f = [&](const std::vector<float>& tt) {
    std::vector<float> o(N * C);
    ref::EmbeddingForward(ids.data(), tt.data(), o.data(), N, C, 2.0f);
    return Dot(o, dout);
  };
  ExpectDirectionalDerivative(f, table, g, 79);
}

// The batched decoder's few-row product (cpu::LinearForwardFew): every row count from 2 to
// kFewRows, widths that are and are not multiples of 16 (the AVX-512 path and the plain one),
// an odd number of output rows, fp32 and bf16 weights, against double-precision dot products
// (tolerance 1e-5 relative to the sum of |terms|: fp32 accumulation over `in` terms). The same for
// the bf16 x bf16 product (cpu::LinearForwardFewBf16: VDPBF16PS where the CPU has AVX512-BF16,
// with a masked tail when `in` is not a multiple of 32) from one row up, against the dot products
// of the bf16 values (a product of two bf16 values is exact in fp32).
TEST(Kernels, FewRowProductEqualsTheDotProducts) {
  for (const int64_t in : {48, 37, 512, 1040}) {  // 1040: chunks of 512 and a partial one
    const int64_t out = in > 512 ? 41 : 23;       // 41 x 1040: threaded (an odd count too)
    const std::vector<float> w = RandomVec(out * in, 3);
    std::vector<uint16_t> w16(w.size());
    std::vector<float> w_rounded(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = FloatToBF16(w[i]);
      w_rounded[i] = BF16ToFloat(w16[i]);
    }
    for (int64_t N = 1; N <= cpu::kFewRows; ++N) {
      const std::vector<float> x = RandomVec(N * in, 4 + N);
      std::vector<uint16_t> x16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16[i] = FloatToBF16(x[i]);
      std::vector<float> y(N * out), y16(N * out), ybb(N * out);
      if (N > 1) {
        cpu::LinearForwardFew(x.data(), w.data(), y.data(), N, in, out);
        cpu::LinearForwardFew(x.data(), w16.data(), y16.data(), N, in, out);
      }
      cpu::LinearForwardFewBf16(x16.data(), w16.data(), ybb.data(), N, in, out);
      for (int64_t t = 0; t < N; ++t)
        for (int64_t o = 0; o < out; ++o) {
          double want = 0, want16 = 0, want_bb = 0, mag = 0;
          for (int64_t j = 0; j < in; ++j) {
            want += static_cast<double>(x[t * in + j]) * w[o * in + j];
            want16 += static_cast<double>(x[t * in + j]) * w_rounded[o * in + j];
            want_bb += static_cast<double>(BF16ToFloat(x16[t * in + j])) * w_rounded[o * in + j];
            mag += std::abs(static_cast<double>(x[t * in + j]) * w[o * in + j]);
          }
          EXPECT_NEAR(ybb[t * out + o], want_bb, 1e-5 * mag)
              << in << " " << N << " " << t << " " << o;
          if (N == 1) continue;
          EXPECT_NEAR(y[t * out + o], want, 1e-5 * mag) << in << " " << N << " " << t << " " << o;
          EXPECT_NEAR(y16[t * out + o], want16, 1e-5 * mag)
              << in << " " << N << " " << t << " " << o;
        }
    }
  }
}

// The decoder's attention (cpu::DecodeAttention): rows at different positions, each over its own
// ring of keys and values, with and without a sliding window (the window's keys wrapping around
// the ring's end), two query heads per kv head, head widths on the AVX-512 path (64) and off it
// (24): against the softmax-weighted sums in double precision.
TEST(Kernels, DecodeAttentionEqualsTheSoftmaxOverEachRowsRing) {
  const int64_t H = 4, Hkv = 2, G = H / Hkv;
  struct Case {
    int64_t slots, window;
    std::vector<int32_t> pos;
  };
  for (const int64_t D : {64, 24})
    for (const Case& c : {Case{12, 0, {0, 5, 11}}, Case{5, 4, {3, 10, 13}}}) {
      const int64_t n = static_cast<int64_t>(c.pos.size()), row = Hkv * D;
      const int64_t span = c.window > 0 ? c.window : c.slots;
      std::vector<std::vector<float>> K, V;
      std::vector<const float*> kp, vp;
      for (int64_t t = 0; t < n; ++t) {
        K.push_back(RandomVec(c.slots * row, 50 + t));
        V.push_back(RandomVec(c.slots * row, 60 + t));
      }
      for (int64_t t = 0; t < n; ++t) {
        kp.push_back(K[t].data());
        vp.push_back(V[t].data());
      }
      const std::vector<float> q = RandomVec(n * H * D, 70, 0.5f);
      std::vector<float> out(n * H * D, -1.0f);
      std::vector<float> scratch(omp_get_max_threads() * G * span);
      cpu::DecodeAttention(q.data(), out.data(), n, H, Hkv, D, kp.data(), vp.data(), c.pos.data(),
                           c.slots, c.window, span, scratch.data());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t p = c.pos[t],
                        lo = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
          std::vector<double> w;
          double m = -1e300, sum = 0;
          for (int64_t k = lo; k <= p; ++k) {
            const float* kr = K[t].data() + (k % c.slots) * row + (h / G) * D;
            double dot = 0;
            for (int64_t j = 0; j < D; ++j) dot += double(q[(t * H + h) * D + j]) * kr[j];
            w.push_back(dot);
            m = std::max(m, dot);
          }
          for (double& x : w) sum += (x = std::exp(x - m));
          for (int64_t j = 0; j < D; ++j) {
            double want = 0;
            for (int64_t k = lo; k <= p; ++k)
              want += w[k - lo] / sum * V[t][(k % c.slots) * row + (h / G) * D + j];
            EXPECT_NEAR(out[(t * H + h) * D + j], want, 1e-5)
                << "D " << D << " window " << c.window << " row " << t << " head " << h;
          }
        }
    }
}

// Runtime ISA dispatch (kernels/cpu/isa_kernels.h): a cap picks that level's kernels, every level
// this CPU runs agrees with the best one on the ops with hand-written or vectorised paths (within
// fp32 summation-order error: 1e-5 of the sum of |terms| for products, 1e-5 relative elsewhere),
// and the level names parse. The whole file also runs under each cap as its own ctest entries
// (tests/CMakeLists.txt: x86-64-v3.*, x86-64-v2.*), each op against the reference there.
TEST(KernelIsa, EveryLevelThisCpuRunsAgreesWithTheBest) {
  const cpu::KernelIsa best = cpu::ActiveKernelIsa();
  const int64_t in = 512, out = 37, N = 5, n = 4099;
  const std::vector<float> w = RandomVec(out * in, 31), x = RandomVec(N * in, 32);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBF16(w[i]);
  const std::vector<float> a = RandomVec(n, 33, 3.0f), b = RandomVec(n, 34);
  struct Outputs {
    std::vector<float> few, few16, few_bb, gemv16, gelu;
  };
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = FloatToBF16(x[i]);
  auto run = [&] {
    Outputs o;
    o.few.resize(N * out);
    o.few16.resize(N * out);
    o.few_bb.resize(N * out);
    o.gemv16.resize(out);
    o.gelu.resize(n);
    std::vector<float> scratch(cpu::Bf16ScratchFloats(in));
    cpu::LinearForwardFew(x.data(), w.data(), o.few.data(), N, in, out);
    cpu::LinearForwardFew(x.data(), w16.data(), o.few16.data(), N, in, out);
    cpu::LinearForwardFewBf16(x16.data(), w16.data(), o.few_bb.data(), N, in, out);
    cpu::LinearForwardBf16(x.data(), w16.data(), o.gemv16.data(), 1, in, out, scratch.data());
    cpu::GeluMulForward(a.data(), b.data(), o.gelu.data(), n);
    return o;
  };
  const Outputs want = run();
  for (int level = 2; level <= static_cast<int>(best); ++level) {
    const auto isa = static_cast<cpu::KernelIsa>(level);
    cpu::LimitKernelIsa(isa);
    ASSERT_EQ(cpu::ActiveKernelIsa(), isa);
    const Outputs got = run();
    cpu::LimitKernelIsa(std::nullopt);
    const double tol = 1e-5 * double(in);  // N(0,1) inputs: the sum of |terms| is about 0.64 in
    for (size_t i = 0; i < want.few.size(); ++i) {
      EXPECT_NEAR(got.few[i], want.few[i], tol) << cpu::KernelIsaName(isa) << " " << i;
      EXPECT_NEAR(got.few16[i], want.few16[i], tol) << cpu::KernelIsaName(isa);
      EXPECT_NEAR(got.few_bb[i], want.few_bb[i], tol) << cpu::KernelIsaName(isa);
    }
    for (size_t i = 0; i < want.gemv16.size(); ++i)
      EXPECT_NEAR(got.gemv16[i], want.gemv16[i], tol) << cpu::KernelIsaName(isa);
    EXPECT_LT(RelError(got.gelu, want.gelu), 1e-5) << cpu::KernelIsaName(isa);
  }
  EXPECT_EQ(cpu::ActiveKernelIsa(), best);
  EXPECT_EQ(*cpu::ParseKernelIsa("avx2"), cpu::KernelIsa::kX86_64_v3);
  EXPECT_EQ(*cpu::ParseKernelIsa("X86-64-V4"), cpu::KernelIsa::kX86_64_v4);
  EXPECT_EQ(*cpu::ParseKernelIsa("sse4.2"), cpu::KernelIsa::kX86_64_v2);
  const StatusOr<cpu::KernelIsa> bad = cpu::ParseKernelIsa("avx9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("is not one of x86-64-v4"), std::string::npos);
}

// Rows of `in` values of w quantized to `type` blocks (q) and their dequantized values (wd).
bool QuantizeRows(GgmlType type, const std::vector<float>& w, int64_t in, std::vector<uint8_t>* q,
                  std::vector<float>* wd) {
  const int64_t rows = static_cast<int64_t>(w.size()) / in;
  const size_t row_bytes = GgmlRowBytes(type, in);
  q->assign(rows * row_bytes, 0);
  wd->assign(w.size(), 0.0f);
  for (int64_t o = 0; o < rows; ++o) {
    if (!QuantizeRow(type, w.data() + o * in, in, q->data() + o * row_bytes)) return false;
    DequantizeRow(type, q->data() + o * row_bytes, in, wd->data() + o * in);
  }
  return true;
}

// The decoder's block products (cpu::LinearForwardBlocksInt8): x rounded to int8 blocks as ggml's
// Q8_0 (d = max|x| / 127, round half away from zero), then per block the integer dot product with
// the weight codes and both scales: against the same in double precision, with the rounding done
// here, for every type with a product (the K-quants' super-blocks of 256 included: one row of one
// super-block, and rows of six). Each dispatch level runs its own code (AVX512-VNNI at v4 where
// the CPU has it, AVX2 under the x86-64-v3 cap, the plain loops under v2), with the same integers;
// the fp32 sums may differ in their last bits.
TEST(Kernels, Int8BlockProductsEqualTheIntegerDotProducts) {
  for (const GgmlType type :
       {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K})
    for (const int64_t in : {GgmlTypeOf(type).block_elems, int64_t{1536}}) {
      SCOPED_TRACE(std::string(GgmlTypeOf(type).name) + " on " + cpu::BlockProductPath());
      ASSERT_TRUE(cpu::HasInt8BlockProduct(type));
      const int64_t out = 29;
      std::vector<float> w = RandomVec(out * in, 51);
      w[5] = 0;  // a zero code (Q8_0's sign trick)
      for (int64_t j = 0; j < in; ++j) w[3 * in + j] = std::abs(w[3 * in + j]);  // min 0 (Q4_K)
      std::vector<uint8_t> q;
      std::vector<float> wd;
      ASSERT_TRUE(QuantizeRows(type, w, in, &q, &wd));
      for (const int64_t N : {1, 2, 3, 4, 5, 8, 9, 17}) {
        std::vector<float> x = RandomVec(N * in, 52 + N);
        for (int64_t j = 0; j < 32; ++j) x[j] = 0;  // a block of zeros: d = 0
        x[x.size() - 3] = 30.0f;                    // an outlier sets its block's scale
        std::vector<float> y(N * out);
        cpu::LinearForwardBlocksInt8(type, x.data(), q.data(), y.data(), N, in, out);
        // x as the kernel rounds it.
        std::vector<double> xr(x.size());
        for (int64_t b = 0; b < N * in / 32; ++b) {
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
          const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
          for (int j = 0; j < 32; ++j)
            xr[b * 32 + j] = static_cast<double>(d) * std::round(x[b * 32 + j] * id);
        }
        for (int64_t t = 0; t < N; ++t)
          for (int64_t o = 0; o < out; ++o) {
            // The kernel sums unsigned codes and takes the offsets or minimums off afterwards
            // (through x's block sums), so its fp32 rounding scales with |x| times the row's
            // largest weight too, not only with the terms' own magnitudes: a term of zero value
            // (Q4_0's code 8) still enters as 8 * d * x.
            double want = 0, mag = 0, exact = 0, wmax = 0, xsum = 0;
            for (int64_t j = 0; j < in; ++j) {
              want += xr[t * in + j] * wd[o * in + j];
              mag += std::abs(xr[t * in + j] * wd[o * in + j]);
              exact += static_cast<double>(x[t * in + j]) * wd[o * in + j];
              wmax = std::max(wmax, std::abs(static_cast<double>(wd[o * in + j])));
              xsum += std::abs(xr[t * in + j]);
            }
            const double fp32 = 1e-5 * (mag + wmax * xsum);
            EXPECT_NEAR(y[t * out + o], want, fp32) << in << " " << N << " " << t << " " << o;
            // Rounding x moves each term by at most half its block's step.
            EXPECT_NEAR(y[t * out + o], exact, 0.5 / 127 * 30 * mag + fp32);
          }
      }
    }
}

}  // namespace
}  // namespace st
