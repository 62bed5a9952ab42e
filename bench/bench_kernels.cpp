// Google Benchmark of every hot kernel at gemma4-small's shapes (N = 4 x 512 tokens), fast CPU
// path. Counters: items/s = elements (or tokens) per second, FLOP/s where the op has matmul FLOPs.
// Threads: set OMP_NUM_THREADS (1 or 2); the sgemm peak at that count is reported first.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "bench_util.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/quant.h"
#include "kernels/ref/attention_probs.h"

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

// Attention at H=8, D=64: T=512 with B=4, T=2048 with B=1; full causal or window 128; Hkv=2, and
// Hkv=1 (GQA 8:1, B*Hkv below the thread count: the two-pass backward) at T=2048.
// mode 0 forward, 1 backward, 2 forward + backward. items/s = tokens (B*T) per wall-clock second;
// FLOP/s counts the visible query-key pairs only. BM_Attention is the tiled kernel (out + lse),
// BM_AttentionProbs the previous one that keeps the probabilities [B,H,T,T] (ref::AttentionProbs*).
template <bool kProbs>
void BM_AttentionImpl(benchmark::State& s) {
  const int64_t T = s.range(0), window = s.range(1), mode = s.range(2), Hkv = s.range(3);
  const int64_t B = T >= 2048 ? 1 : 4, H = 8, D = 64;
  auto q = Rand(B * T * H * D, 6), k = Rand(B * T * Hkv * D, 7), v = Rand(B * T * Hkv * D, 8);
  auto go = Rand(B * T * H * D, 9);
  std::vector<float> o(B * T * H * D), saved(kProbs ? B * H * T * T : B * H * T), dq(q.size()),
      dk(k.size()), dv(v.size());
  AttnMask mask{nullptr, window};
  if (!kProbs) cpu::ReserveAttentionScratch(B, T, H, Hkv, D);
  auto forward = [&] {
    if (kProbs)
      ref::AttentionProbsForward(q.data(), k.data(), v.data(), o.data(), saved.data(), B, T, H, Hkv,
                                 D, mask);
    else
      cpu::AttentionForward(q.data(), k.data(), v.data(), o.data(), saved.data(), B, T, H, Hkv, D,
                            mask);
  };
  auto backward = [&] {
    if (kProbs)
      ref::AttentionProbsBackward(q.data(), k.data(), v.data(), saved.data(), go.data(), dq.data(),
                                  dk.data(), dv.data(), B, T, H, Hkv, D, mask);
    else
      cpu::AttentionBackward(q.data(), k.data(), v.data(), o.data(), saved.data(), go.data(),
                             dq.data(), dk.data(), dv.data(), B, T, H, Hkv, D, mask);
  };
  forward();
  double pairs = 0;
  for (int64_t i = 0; i < T; ++i) pairs += window ? std::min(i + 1, window) : i + 1;
  for (auto _ : s) {
    if (mode != 1) forward();
    if (mode != 0) backward();
  }
  const double flops = (mode == 0 ? 4.0 : mode == 1 ? 8.0 : 12.0) * B * H * D * pairs;
  s.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  s.SetItemsProcessed(s.iterations() * B * T);
}
void BM_Attention(benchmark::State& s) {
  BM_AttentionImpl<false>(s);
}
void BM_AttentionProbs(benchmark::State& s) {
  BM_AttentionImpl<true>(s);
}
void AttentionArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"T", "window", "mode", "Hkv"});
  for (int64_t T : {512, 2048})
    for (int64_t window : {0, 128})
      for (int64_t mode : {0, 1, 2}) b->Args({T, window, mode, 2});
  for (int64_t mode : {1, 2}) b->Args({2048, 0, mode, 1});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Attention)->Apply(AttentionArgs);
BENCHMARK(BM_AttentionProbs)->Apply(AttentionArgs);

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

// The decoder's products at E2B's widths: eight [6144, 1536] MLP matrices stacked (out 49152, in
// 1536: 75-300 MB, more than any L3, as a decoding step reads every layer's weights from memory),
// for `rows` tokens at once (1: one sequence; 8: a batch of sequences), with the weights held in
// fp32, bf16 or Q8_0 (format 0, 1, 2). bytes/s counts the matrix's bytes per call, so formats
// compare by time for the same matrix.
void BM_DecodeProduct(benchmark::State& s) {
  const int64_t in = s.range(2), out = 8 * 6144 * 1536 / in, rows = s.range(1);
  const int format = static_cast<int>(s.range(0));
  const std::vector<float> w = Rand(out * in, 6), x = Rand(rows * in, 7);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBF16(w[i]);
  // 2-5: Q8_0, Q4_0, Q4_K, Q6_K weights with x rounded to int8 blocks (the decoder's block
  // products).
  static const GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kQ8_0,
                                    GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K,
                                    GgmlType::kQ8_0, GgmlType::kQ8_0};
  const GgmlType qtype = kTypes[format];
  const size_t q_row = GgmlRowBytes(qtype, in);
  std::vector<uint8_t> q(out * q_row);
  for (int64_t o = 0; o < out; ++o) QuantizeRow(qtype, w.data() + o * in, in, q.data() + o * q_row);
  std::vector<float> y(rows * out), scratch(cpu::Bf16ScratchFloats(in));
  std::vector<uint16_t> x16(rows * in);
  double bytes = 0;
  for (auto _ : s) {
    if (format == 0) {
      if (rows == 1)
        cpu::LinearForward(x.data(), w.data(), y.data(), 1, in, out, 1.0f, false);
      else
        cpu::LinearForwardFew(x.data(), w.data(), y.data(), rows, in, out);
      bytes = 4.0 * in * out;
    } else if (format == 1) {
      if (rows == 1)
        cpu::LinearForwardBf16(x.data(), w16.data(), y.data(), 1, in, out, scratch.data());
      else
        cpu::LinearForwardFew(x.data(), w16.data(), y.data(), rows, in, out);
      bytes = 2.0 * in * out;
    } else if (format == 6) {
      cpu::RoundToBf16(x.data(), rows, in, in, x16.data());
      cpu::LinearForwardFewBf16(x16.data(), w16.data(), y.data(), rows, in, out);
      bytes = 2.0 * in * out;
    } else if (format == 7) {
      cpu::RoundToBf16(x.data(), rows, in, in, x16.data());
      cpu::GemmBf16(cpu::Trans::kNo, cpu::Trans::kYes, rows, out, in, 1.0f, x16.data(), in,
                    w16.data(), in, 0.0f, y.data(), out);
      bytes = 2.0 * in * out;
    } else {
      cpu::LinearForwardBlocksInt8(qtype, x.data(), q.data(), y.data(), rows, in, out);
      bytes = double(q.size());
    }
  }
  static const char* kLabels[] = {
      "fp32",        "bf16",        "q8_0 x int8", "q4_0 x int8",
      "q4_k x int8", "q6_k x int8", "bf16 x bf16", "bf16 x bf16 oneDNN"};
  s.SetLabel(kLabels[format]);
  s.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  s.counters["FLOP/s"] =
      benchmark::Counter(2.0 * rows * in * out, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeProduct)
    ->ArgNames({"format", "rows", "in"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7}, {1, 8}, {1536, 512}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace st

// As slicetrain does: OpenBLAS's kernels for this CPU (its own choice may be a fallback).
int main(int argc, char** argv) {
  st::cpu::ReexecWithBlasCore(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_core", st::cpu::BlasCoreName());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
