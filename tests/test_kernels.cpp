// Fast CPU kernels against the naive reference on random shapes (odd sizes included), the fast
// math against libm, and finite differences for every reference backward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/gelu.h"
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
                         ::testing::Values(LinearShape{1, 1, 1}, LinearShape{7, 13, 5},
                                           LinearShape{64, 33, 17}, LinearShape{130, 64, 200}));

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
  ref::Rope(a.data(), cs.data(), sn.data(), B, T, Hh, D, false);
  cpu::Rope(b.data(), cs.data(), sn.data(), B, T, Hh, D, false);
  EXPECT_LT(RelError(b, a), 1e-6);
  cpu::Rope(b.data(), cs.data(), sn.data(), B, T, Hh, D, true);
  EXPECT_LT(RelError(b, x), 1e-6) << "inverse rope is not the inverse";
}

struct AttnCase {
  int64_t B, T, H, Hkv, D, window;
  int pad_kind;  // 0 none, 1 right padding, 2 left padding (rows with no visible key), 3 mixed
};

std::vector<uint8_t> MakePad(const AttnCase& c) {
  std::vector<uint8_t> pad(c.B * c.T, 1);
  for (int64_t b = 0; b < c.B; ++b) {
    const int kind = c.pad_kind == 3 ? static_cast<int>(b % 3) : c.pad_kind;
    const int64_t n = std::min<int64_t>(c.T - 1, 3 + b);
    for (int64_t j = 0; j < n; ++j) {
      if (kind == 1) pad[b * c.T + c.T - 1 - j] = 0;
      if (kind == 2) pad[b * c.T + j] = 0;
    }
  }
  return pad;
}

class AttentionParity : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionParity, ForwardAndBackward) {
  const AttnCase c = GetParam();
  const int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.Hkv * c.D;
  auto q = RandomVec(nq, 20), k = RandomVec(nk, 21), v = RandomVec(nk, 22), go = RandomVec(nq, 23);
  auto pad = MakePad(c);
  AttnMask mask{c.pad_kind ? pad.data() : nullptr, c.window};
  std::vector<float> o0(nq), o1(nq), p0(c.B * c.H * c.T * c.T), p1(p0.size());
  ref::AttentionForward(q.data(), k.data(), v.data(), o0.data(), p0.data(), c.B, c.T, c.H, c.Hkv,
                        c.D, mask);
  cpu::AttentionForward(q.data(), k.data(), v.data(), o1.data(), p1.data(), c.B, c.T, c.H, c.Hkv,
                        c.D, mask);
  EXPECT_LT(RelError(o1, o0), kParityTol);
  auto dk0 = RandomVec(nk, 24), dk1 = dk0, dv0 = RandomVec(nk, 25), dv1 = dv0;
  std::vector<float> dq0(nq), dq1(nq);
  ref::AttentionBackward(q.data(), k.data(), v.data(), p0.data(), go.data(), dq0.data(), dk0.data(),
                         dv0.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
  cpu::AttentionBackward(q.data(), k.data(), v.data(), p1.data(), go.data(), dq1.data(), dk1.data(),
                         dv1.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
  EXPECT_LT(RelError(dq1, dq0), 5e-5);
  EXPECT_LT(RelError(dk1, dk0), 5e-5);
  EXPECT_LT(RelError(dv1, dv0), 5e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionParity,
    ::testing::Values(AttnCase{1, 1, 1, 1, 2, 0, 0}, AttnCase{2, 7, 4, 2, 6, 0, 0},
                      AttnCase{2, 70, 4, 1, 8, 0, 1}, AttnCase{3, 70, 2, 2, 4, 5, 2},
                      AttnCase{3, 131, 4, 2, 16, 64, 3}, AttnCase{1, 129, 8, 1, 5, 0, 2},
                      AttnCase{4, 65, 2, 1, 8, 1, 3}));

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
  ref::Rope(dx.data(), cs.data(), sn.data(), B, T, Hh, D, true);
  auto f = [&](const std::vector<float>& xx) {
    auto y = xx;
    ref::Rope(y.data(), cs.data(), sn.data(), B, T, Hh, D, false);
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
    std::vector<float> o(nq), p(c.B * c.H * c.T * c.T), dq(nq), dk(nk, 0.f), dv(nk, 0.f);
    ref::AttentionForward(q.data(), k.data(), v.data(), o.data(), p.data(), c.B, c.T, c.H, c.Hkv,
                          c.D, mask);
    ref::AttentionBackward(q.data(), k.data(), v.data(), p.data(), go.data(), dq.data(), dk.data(),
                           dv.data(), c.B, c.T, c.H, c.Hkv, c.D, mask);
    auto f = [&](const std::vector<float>& qq, const std::vector<float>& kk,
                 const std::vector<float>& vv) {
      std::vector<float> oo(nq), pp(p.size());
      ref::AttentionForward(qq.data(), kk.data(), vv.data(), oo.data(), pp.data(), c.B, c.T, c.H,
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

}  // namespace
}  // namespace st
