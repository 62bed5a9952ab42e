// Google Benchmark of every hot kernel at gemma4-small's shapes (N = 4 x 512 tokens), fast CPU
// path. Counters: items/s = elements (or tokens) per second, FLOP/s where the op has matmul FLOPs.
// Threads: set OMP_NUM_THREADS (1 or 2); the sgemm peak at that count is reported first.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "kernels/cpu/ops_cpu.h"

namespace st {
namespace {

std::vector<float> Rand(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.Normal());
  return v;
}

constexpr int64_t kN = 2048, kD = 512;

void BM_Sgemm2048(benchmark::State& s) {
  const int n = 2048;
  auto a = Rand(n * n, 1), b = Rand(n * n, 2);
  std::vector<float> c(n * n);
  for (auto _ : s) cpu::LinearForward(a.data(), b.data(), c.data(), n, n, n, 1.0f, false);
  s.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Sgemm2048)->Unit(benchmark::kMillisecond);

// Linear forward / backward (dx + dW) at [N, in] x [out, in]^T.
void BM_Linear(benchmark::State& s) {
  const int64_t in = s.range(0), out = s.range(1);
  const bool backward = s.range(2);
  auto x = Rand(kN * in, 3), w = Rand(out * in, 4), dy = Rand(kN * out, 5);
  std::vector<float> y(kN * out), dx(kN * in), dw(out * in);
  for (auto _ : s) {
    if (backward)
      cpu::LinearBackward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), kN, in, out, 1.0f,
                          false);
    else
      cpu::LinearForward(x.data(), w.data(), y.data(), kN, in, out, 1.0f, false);
  }
  s.counters["FLOP/s"] = benchmark::Counter((backward ? 4.0 : 2.0) * kN * in * out,
                                            benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Linear)
    ->ArgNames({"in", "out", "bwd"})
    ->Args({kD, 512, 0})
    ->Args({kD, 512, 1})  // q_proj / o_proj
    ->Args({kD, 2048, 0})
    ->Args({kD, 2048, 1})  // gate/up
    ->Args({2048, kD, 0})
    ->Args({2048, kD, 1})  // down
    ->Args({kD, 8192, 0})
    ->Args({kD, 8192, 1})  // LM head
    ->Unit(benchmark::kMillisecond);

// Attention forward/backward: B=4, T=512, H=8, Hkv=2, D=64, full causal or window 128.
void BM_Attention(benchmark::State& s) {
  const int64_t B = 4, T = 512, H = 8, Hkv = 2, D = 64, window = s.range(0);
  const bool backward = s.range(1);
  auto q = Rand(B * T * H * D, 6), k = Rand(B * T * Hkv * D, 7), v = Rand(B * T * Hkv * D, 8);
  auto go = Rand(B * T * H * D, 9);
  std::vector<float> o(B * T * H * D), p(B * H * T * T), dq(q.size()), dk(k.size()), dv(v.size());
  AttnMask mask{nullptr, window};
  cpu::AttentionForward(q.data(), k.data(), v.data(), o.data(), p.data(), B, T, H, Hkv, D, mask);
  double pairs = 0;
  for (int64_t i = 0; i < T; ++i) pairs += window ? std::min(i + 1, window) : i + 1;
  for (auto _ : s) {
    if (backward)
      cpu::AttentionBackward(q.data(), k.data(), v.data(), p.data(), go.data(), dq.data(),
                             dk.data(), dv.data(), B, T, H, Hkv, D, mask);
    else
      cpu::AttentionForward(q.data(), k.data(), v.data(), o.data(), p.data(), B, T, H, Hkv, D,
                            mask);
  }
  s.counters["FLOP/s"] = benchmark::Counter((backward ? 8.0 : 4.0) * B * H * D * pairs,
                                            benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)
    ->ArgNames({"window", "bwd"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({128, 0})
    ->Args({128, 1})
    ->Unit(benchmark::kMillisecond);

void BM_RmsNorm(benchmark::State& s) {
  const bool backward = s.range(0);
  auto x = Rand(kN * kD, 10), w = Rand(kD, 11), dy = Rand(kN * kD, 12);
  std::vector<float> y(kN * kD), r(kN), dx(kN * kD), dw(kD);
  cpu::RmsNormForward(x.data(), w.data(), y.data(), r.data(), kN, kD, 1e-6f);
  for (auto _ : s) {
    if (backward)
      cpu::RmsNormBackward(x.data(), w.data(), r.data(), dy.data(), dx.data(), dw.data(), kN, kD,
                           false);
    else
      cpu::RmsNormForward(x.data(), w.data(), y.data(), r.data(), kN, kD, 1e-6f);
  }
  s.SetItemsProcessed(s.iterations() * kN * kD);
}
BENCHMARK(BM_RmsNorm)->ArgName("bwd")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_GeluMul(benchmark::State& s) {
  const bool backward = s.range(0);
  const int64_t n = kN * 2048;
  auto a = Rand(n, 13), b = Rand(n, 14), g = Rand(n, 15);
  std::vector<float> o(n), da(n), db(n);
  for (auto _ : s) {
    if (backward)
      cpu::GeluMulBackward(a.data(), b.data(), g.data(), da.data(), db.data(), n);
    else
      cpu::GeluMulForward(a.data(), b.data(), o.data(), n);
  }
  s.SetItemsProcessed(s.iterations() * n);
}
BENCHMARK(BM_GeluMul)->ArgName("bwd")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_SoftcapCrossEntropy(benchmark::State& s) {
  const int64_t V = 8192;
  auto z = Rand(kN * V, 16);
  std::vector<int32_t> t(kN);
  for (int64_t i = 0; i < kN; ++i) t[i] = static_cast<int32_t>((i * 7919) % V);
  std::vector<float> work(z.size());
  for (auto _ : s) {
    work = z;
    cpu::SoftcapForward(work.data(), kN * V, 30.0f);
    int64_t valid = 0;
    benchmark::DoNotOptimize(cpu::CrossEntropyForward(work.data(), t.data(), kN, V, &valid));
    cpu::CrossEntropySoftcapBackward(work.data(), t.data(), kN, V, 30.0f, 1.0f / kN);
  }
  s.SetItemsProcessed(s.iterations() * kN);  // tokens
}
BENCHMARK(BM_SoftcapCrossEntropy)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace st

BENCHMARK_MAIN();
