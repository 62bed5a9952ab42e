// LoRA adapters in the engine: target selection as PEFT names modules, the zero-B start, the
// merge identity (an adapted Linear equals the base model with W + s B A, in its outputs and,
// through the chain rule, in every adapter gradient), fast vs reference kernels, and dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "micro_model.h"
#include "model/frozen_weights.h"
#include "model/gemma4.h"
#include "model/lora.h"
#include "model/weights.h"
#include "test_util.h"

namespace st {
namespace {

using test::MakeBatch;
using test::MicroBatch;
using test::MicroConfig;
using test::RelError;

LoraSpec Spec(const Gemma4Config& c, const LoraTargets& targets, int64_t rank, double alpha,
              double dropout = 0) {
  const ParamRegistry base = BuildParamRegistry(c);
  StatusOr<std::vector<int>> sel = SelectLoraTargets(base, targets, "model.");
  EXPECT_TRUE(sel.ok()) << sel.status().ToString();
  LoraSpec s;
  s.targets = sel.value();
  s.rank = rank;
  s.scaling = LoraScaling(rank, alpha, false);
  s.dropout = dropout;
  return s;
}

// Parameters of a LoRA registry: the base from the preset initialisation, A from PEFT's init, B
// random (b_scale 0: PEFT's zero start).
std::vector<float> LoraParams(const Gemma4Config& c, const ParamRegistry& reg, float b_scale,
                              uint64_t seed) {
  const ParamRegistry base_reg = BuildParamRegistry(c);
  LoraWeights w(reg, std::make_unique<PresetWeights>(c, base_reg, seed), seed);
  std::vector<float> p(reg.layout.total());
  for (int i = 0; i < reg.layout.size(); ++i) w.ReadAll(i, p.data() + reg.layout.entry(i).offset);
  Rng rng(seed + 7);
  for (int i = reg.base_entries; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    if (i == reg.lora_b[reg.lora_base[i]])
      for (int64_t j = 0; j < e.numel; ++j)
        p[e.offset + j] = b_scale * static_cast<float>(rng.Normal());
  }
  return p;
}

// The base model's parameters with every adapted W replaced by W + s B A.
std::vector<float> Merged(const ParamRegistry& reg, const std::vector<float>& p,
                          const ParamRegistry& base) {
  std::vector<float> out(p.begin(), p.begin() + base.layout.total());
  const int64_t R = reg.lora_rank;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (reg.lora_a[e] < 0) continue;
    const ArenaEntry& w = reg.layout.entry(e);
    const float* A = p.data() + reg.layout.entry(reg.lora_a[e]).offset;  // [R, in]
    const float* B = p.data() + reg.layout.entry(reg.lora_b[e]).offset;  // [out, R]
    const int64_t rows = w.shape[0], cols = w.shape[1];
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < cols; ++i) {
        double acc = 0;
        for (int64_t r = 0; r < R; ++r) acc += double(B[o * R + r]) * A[r * cols + i];
        out[w.offset + o * cols + i] += static_cast<float>(reg.lora_scaling * acc);
      }
  }
  return out;
}

std::vector<bool> AdaptersOnly(const ParamRegistry& reg) {
  std::vector<bool> t(reg.layout.size(), false);
  for (int i = reg.base_entries; i < reg.layout.size(); ++i) t[i] = true;
  return t;
}

TEST(Lora, TargetsFollowPeftNaming) {
  const Gemma4Config c = MicroConfig(0.2);
  const ParamRegistry reg = BuildParamRegistry(c);
  // PEFT's default for Gemma: q_proj and v_proj; kv-shared layers have no v_proj.
  auto def = SelectLoraTargets(reg, DefaultLoraTargets(), "model.");
  ASSERT_TRUE(def.ok());
  int64_t q = 0, v = 0;
  for (int e : def.value()) {
    const std::string& n = reg.layout.entry(e).name;
    q += n.find("q_proj") != std::string::npos;
    v += n.find("v_proj") != std::string::npos;
  }
  EXPECT_EQ(q, c.num_hidden_layers);
  EXPECT_EQ(v, c.num_hidden_layers - c.num_kv_shared_layers);
  // all-linear: every projection, the per-layer ones included, not the embeddings/head.
  auto all = SelectLoraTargets(reg, ParseLoraTargets("all-linear"), "model.");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all.value(), LinearEntries(reg));
  EXPECT_EQ(all.value().size(), size_t(9 * 5 - 2 * 3 + 1));
  // PEFT's regex for gemma4 (Gemma4ForConditionalGeneration names) selects q/v there, and
  // nothing under the causal LM's prefix.
  LoraTargets re;
  re.regex = R"(.*language_model\..*\.(q_proj|v_proj))";
  auto mm = SelectLoraTargets(reg, re, "model.language_model.");
  ASSERT_TRUE(mm.ok());
  EXPECT_EQ(mm.value(), def.value());
  EXPECT_EQ(SelectLoraTargets(reg, re, "model.").status().code(), StatusCode::kInvalidArgument);
  // Mistakes are one clear line.
  auto bad = SelectLoraTargets(reg, ParseLoraTargets("q_proj,qkv_proj"), "model.");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("qkv_proj"), std::string::npos);
  re.regex = "(";
  EXPECT_EQ(SelectLoraTargets(reg, re, "model.").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(SelectLoraTargets(reg, ParseLoraTargets("all-linear,q_proj"), "model.").ok());
  // The adapters follow the base entries, named as PEFT names them (without its prefix).
  ParamRegistry with = reg;
  AddLoraAdapters(&with, Spec(c, DefaultLoraTargets(), 4, 8));
  EXPECT_EQ(with.base_entries, reg.layout.size());
  const int q0 = with.layers[0].q_proj;
  EXPECT_EQ(with.layout.entry(with.lora_a[q0]).name, "layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(with.layout.entry(with.lora_a[q0]).shape, (Shape{4, c.hidden_size}));
  EXPECT_EQ(with.layout.entry(with.lora_b[q0]).shape,
            (Shape{c.num_attention_heads * c.HeadDim(0), 4}));
  EXPECT_FLOAT_EQ(with.lora_scaling, 2.0f);
  EXPECT_DOUBLE_EQ(LoraScaling(16, 32, true), 8.0);  // rsLoRA: alpha / sqrt(R)
}

TEST(Lora, PeftInitialisation) {
  const Gemma4Config c = MicroConfig(0.2);
  const ParamRegistry base = BuildParamRegistry(c);
  const ParamRegistry reg = BuildParamRegistry(c, Spec(c, ParseLoraTargets("all-linear"), 8, 16));
  LoraWeights w(reg, std::make_unique<PresetWeights>(c, base, 1), 1);
  const int e = reg.layers[0].down_proj;
  const ArenaEntry& a = reg.layout.entry(reg.lora_a[e]);
  std::vector<float> A(a.numel), part(5);
  w.ReadAll(reg.lora_a[e], A.data());
  const double bound = 1.0 / std::sqrt(static_cast<double>(a.shape[1]));
  double mean = 0, var = 0;
  for (float x : A) {
    EXPECT_LE(std::fabs(x), bound);
    mean += x / a.numel;
    var += double(x) * x / a.numel;
  }
  EXPECT_NEAR(mean, 0.0, 0.2 * bound);
  EXPECT_NEAR(var, bound * bound / 3, 0.3 * bound * bound / 3);  // U(-b, b) has variance b^2/3
  w.Read(reg.lora_a[e], 17, 5, part.data());                     // any range reads the same values
  for (int j = 0; j < 5; ++j) EXPECT_EQ(part[j], A[17 + j]);
  std::vector<float> B(reg.layout.entry(reg.lora_b[e]).numel, 1.0f);
  w.ReadAll(reg.lora_b[e], B.data());
  for (float x : B) EXPECT_EQ(x, 0.0f);
}

TEST(Lora, ZeroBIsTheBaseModel) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 3, T = 9;
  EngineOptions o;
  o.lora = Spec(c, ParseLoraTargets("all-linear"), 4, 8);
  Gemma4Engine lora(c, B, T, o), plain(c, B, T);
  const ParamRegistry& reg = lora.registry();
  auto p = LoraParams(c, reg, 0.0f, 3);
  MicroBatch tk = MakeBatch(c, B, T, 4);
  const ForwardResult a = lora.Forward(p.data(), tk.Get(B, T));
  const ForwardResult b = plain.Forward(p.data(), tk.Get(B, T));  // base entries come first
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  // B = 0: A gets no gradient, B does.
  std::vector<float> g(p.size(), 0.f);
  const std::vector<bool> train = AdaptersOnly(reg);
  lora.Backward(p.data(), g.data(), tk.Get(B, T), 1.0f / a.num_valid, &train);
  const int e = reg.layers[1].o_proj;
  const ArenaEntry& ga = reg.layout.entry(reg.lora_a[e]);
  const ArenaEntry& gb = reg.layout.entry(reg.lora_b[e]);
  double na = 0, nb = 0;
  for (int64_t j = 0; j < ga.numel; ++j) na += std::fabs(g[ga.offset + j]);
  for (int64_t j = 0; j < gb.numel; ++j) nb += std::fabs(g[gb.offset + j]);
  EXPECT_EQ(na, 0.0);
  EXPECT_GT(nb, 0.0);
  for (int i = 0; i < reg.base_entries; ++i) {  // the frozen base gets nothing
    const ArenaEntry& x = reg.layout.entry(i);
    for (int64_t j = 0; j < x.numel; ++j) ASSERT_EQ(g[x.offset + j], 0.0f) << x.name;
  }
}

// y = x W^T + s x A^T B^T is the base model with W' = W + s B A; so are the gradients:
// dA = s B^T dW', dB = s dW' A^T, and every other tensor's gradient is the merged model's.
TEST(Lora, MergeIdentityForOutputsAndGradients) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 3, T = 9;
  const ParamRegistry base = BuildParamRegistry(c);
  for (const char* targets : {"all-linear", "q_proj,v_proj,down_proj"}) {
    SCOPED_TRACE(targets);
    EngineOptions o;
    o.lora = Spec(c, ParseLoraTargets(targets), 3, 5);
    Gemma4Engine lora(c, B, T, o), plain(c, B, T);
    const ParamRegistry& reg = lora.registry();
    auto p = LoraParams(c, reg, 0.2f, 5);
    auto merged = Merged(reg, p, base);
    MicroBatch tk = MakeBatch(c, B, T, 6);
    const Batch batch = tk.Get(B, T);
    const ForwardResult a = lora.Forward(p.data(), batch);
    const ForwardResult b = plain.Forward(merged.data(), batch);
    EXPECT_NEAR(a.Loss(), b.Loss(), 2e-5 * b.Loss());
    EXPECT_GT(std::fabs(a.Loss() - plain.Forward(p.data(), batch).Loss()), 1e-3);  // B matters
    std::vector<float> la(B * T * c.vocab_size), lb(la.size());
    lora.Forward(p.data(), batch);
    lora.ComputeLogits(p.data(), la.data());
    plain.Forward(merged.data(), batch);
    plain.ComputeLogits(merged.data(), lb.data());
    EXPECT_LT(RelError(la.data(), lb.data(), la.size()), 2e-5);

    // Gradients: everything trainable in both.
    std::vector<float> ga(p.size(), 0.f), gb(merged.size(), 0.f);
    lora.Forward(p.data(), batch);
    lora.Backward(p.data(), ga.data(), batch, 1.0f / a.num_valid);
    plain.Forward(merged.data(), batch);
    plain.Backward(merged.data(), gb.data(), batch, 1.0f / b.num_valid);
    const float s = reg.lora_scaling;
    const int64_t R = reg.lora_rank;
    for (int e = 0; e < reg.base_entries; ++e) {
      const ArenaEntry& w = reg.layout.entry(e);
      // fp32 rounding of two different association orders (k_norm's, through the left-padded
      // row: 1.3e-4).
      EXPECT_LT(RelError(ga.data() + w.offset, gb.data() + w.offset, w.numel), 3e-4) << w.name;
      if (reg.lora_a[e] < 0) continue;
      const int64_t rows = w.shape[0], cols = w.shape[1];
      const float* A = p.data() + reg.layout.entry(reg.lora_a[e]).offset;
      const float* Bm = p.data() + reg.layout.entry(reg.lora_b[e]).offset;
      const float* dW = gb.data() + w.offset;
      std::vector<float> dA(R * cols, 0.f), dB(rows * R, 0.f);
      for (int64_t o2 = 0; o2 < rows; ++o2)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < cols; ++i) {
            dA[r * cols + i] += s * Bm[o2 * R + r] * dW[o2 * cols + i];
            dB[o2 * R + r] += s * dW[o2 * cols + i] * A[r * cols + i];
          }
      EXPECT_LT(RelError(ga.data() + reg.layout.entry(reg.lora_a[e]).offset, dA.data(), dA.size()),
                1e-4)
          << w.name << " lora_A";
      EXPECT_LT(RelError(ga.data() + reg.layout.entry(reg.lora_b[e]).offset, dB.data(), dB.size()),
                1e-4)
          << w.name << " lora_B";
    }
  }
}

TEST(Lora, FastMatchesReference) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 2, T = 10;
  for (double dropout : {0.0, 0.25}) {
    EngineOptions o;
    o.lora = Spec(c, ParseLoraTargets("all-linear"), 4, 4, dropout);
    EngineOptions r = o;
    r.backend = Backend::kRef;
    Gemma4Engine fast(c, B, T, o), ref(c, B, T, r);
    fast.SetDropoutSeed(11);
    ref.SetDropoutSeed(11);
    const ParamRegistry& reg = fast.registry();
    auto p = LoraParams(c, reg, 0.1f, 7);
    MicroBatch tk = MakeBatch(c, B, T, 8);
    const std::vector<bool> train = AdaptersOnly(reg);
    const ForwardResult a = fast.Forward(p.data(), tk.Get(B, T));
    const ForwardResult b = ref.Forward(p.data(), tk.Get(B, T));
    EXPECT_NEAR(a.Loss(), b.Loss(), 1e-5 * b.Loss()) << dropout;
    std::vector<float> ga(p.size(), 0.f), gb(p.size(), 0.f);
    fast.Backward(p.data(), ga.data(), tk.Get(B, T), 1.0f / a.num_valid, &train);
    ref.Backward(p.data(), gb.data(), tk.Get(B, T), 1.0f / b.num_valid, &train);
    for (int i = reg.base_entries; i < reg.layout.size(); ++i) {
      const ArenaEntry& e = reg.layout.entry(i);
      EXPECT_LT(RelError(ga.data() + e.offset, gb.data() + e.offset, e.numel), 1e-4)
          << e.name << " dropout " << dropout;
    }
  }
}

// The gradient with dropout against finite differences of the loss (masks fixed by the seed),
// along one random direction per adapter tensor: checks the masked input's gradient path.
TEST(Lora, DropoutGradientsMatchFiniteDifferences) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 2, T = 8;
  for (double dropout : {0.0, 0.4}) {
    SCOPED_TRACE(dropout);
    EngineOptions o;
    o.backend = Backend::kRef;
    o.lora = Spec(c, ParseLoraTargets("all-linear"), 3, 3, dropout);
    Gemma4Engine eng(c, B, T, o);
    eng.SetDropoutSeed(5);
    const ParamRegistry& reg = eng.registry();
    auto p = LoraParams(c, reg, 0.3f, 11);
    MicroBatch tk = MakeBatch(c, B, T, 12);
    const Batch batch = tk.Get(B, T);
    std::vector<bool> train = AdaptersOnly(reg);
    // Also the norms: their gradient flows through the masked input's gradient (dx) only.
    for (int i = 0; i < reg.base_entries; ++i) train[i] = reg.is_norm[i];
    const ForwardResult f = eng.Forward(p.data(), batch);
    std::vector<float> g(p.size(), 0.f);
    eng.Backward(p.data(), g.data(), batch, 1.0f / f.num_valid, &train);
    int checked = 0;
    for (int i = 0; i < reg.layout.size(); ++i) {
      if (!train[i]) continue;
      const ArenaEntry& e = reg.layout.entry(i);
      std::vector<float> u = test::RandomVec(e.numel, 200 + i);
      // Small: the masked, rescaled adapters make the loss curved (1e-2 fails with or without).
      const double eps = 3e-4;
      auto pp = p, pm = p;
      double analytic = 0;
      for (int64_t j = 0; j < e.numel; ++j) {
        pp[e.offset + j] += static_cast<float>(eps) * u[j];
        pm[e.offset + j] -= static_cast<float>(eps) * u[j];
        analytic += double(g[e.offset + j]) * u[j];
      }
      const double numeric =
          (eng.Forward(pp.data(), batch).Loss() - eng.Forward(pm.data(), batch).Loss()) / (2 * eps);
      EXPECT_NEAR(numeric, analytic, 2e-2 * std::fabs(analytic) + 2e-3) << e.name;
      ++checked;
    }
    EXPECT_GT(checked, 80);
  }
}

TEST(Lora, DropoutMaskStatistics) {
  for (float p : {0.1f, 0.5f}) {
    const LoraDropoutMask m = LoraDropoutMask::For(42, 7, p),
                          other = LoraDropoutMask::For(43, 7, p);
    const int64_t n = 1 << 20;
    int64_t kept = 0, both = 0, runs = 0;
    for (int64_t j = 0; j < n; ++j) {
      const bool k = m.Keep(j);
      kept += k;
      both += k && other.Keep(j);
      runs += j > 0 && k == m.Keep(j - 1);
    }
    const double q = 1.0 - p;  // keep probability; 4 sigma of a binomial
    const double sigma = std::sqrt(q * (1 - q) / n);
    EXPECT_NEAR(double(kept) / n, q, 4 * sigma) << p;
    EXPECT_NEAR(double(both) / n, q * q, 4 * std::sqrt(q * q * (1 - q * q) / n)) << p;
    EXPECT_NEAR(double(runs) / (n - 1), q * q + p * p, 0.005) << p;  // neighbours independent
    EXPECT_FLOAT_EQ(m.scale, 1.0f / q);
  }
}

// With dropout the loss depends on the seed, is reproducible for one seed, and the checkpointed
// recompute regenerates the forward's masks: bit-identical gradients.
TEST(Lora, DropoutIsReproducibleAndSurvivesCheckpointing) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 2, T = 10;
  auto run = [&](double dropout, uint64_t seed, ActivationCheckpointing ckpt) {
    EngineOptions o;
    o.lora = Spec(c, ParseLoraTargets("all-linear"), 4, 4, dropout);
    o.checkpointing = ckpt;
    Gemma4Engine eng(c, B, T, o);
    eng.SetDropoutSeed(seed);
    const ParamRegistry& reg = eng.registry();
    auto p = LoraParams(c, reg, 0.1f, 9);
    MicroBatch tk = MakeBatch(c, B, T, 10);
    const std::vector<bool> train = AdaptersOnly(reg);
    const ForwardResult f = eng.Forward(p.data(), tk.Get(B, T));
    std::vector<float> g(p.size(), 0.f);
    eng.Backward(p.data(), g.data(), tk.Get(B, T), 1.0f / f.num_valid, &train);
    return std::make_pair(f.loss_sum, g);
  };
  const auto none = run(0.3, 1, ActivationCheckpointing::kNone);
  EXPECT_EQ(run(0.3, 1, ActivationCheckpointing::kNone), none);
  EXPECT_EQ(run(0.3, 1, ActivationCheckpointing::kLayer), none);
  EXPECT_EQ(run(0.3, 1, ActivationCheckpointing::kMlp), none);
  EXPECT_NE(run(0.3, 2, ActivationCheckpointing::kNone).first, none.first);
  EXPECT_NE(run(0.0, 1, ActivationCheckpointing::kNone).first, none.first);
}

// A preset base (generated on every read) under LoRA: FrozenWeights converts each frozen layer
// once and keeps it, instead of regenerating it whenever the engine enters the layer; the results
// are those of the base's values in an arena.
TEST(Lora, AGeneratedBaseIsConvertedOnce) {
  const Gemma4Config c = MicroConfig(0.2);
  const int64_t B = 2, T = 9;
  const ParamRegistry base = BuildParamRegistry(c);
  struct Counting : PresetWeights {
    using PresetWeights::PresetWeights;
    void Read(int entry, int64_t begin, int64_t count, float* dst) const override {
      ++reads[entry];
      PresetWeights::Read(entry, begin, count, dst);
    }
    mutable std::vector<int> reads = std::vector<int>(1000, 0);
  };
  EngineOptions o;
  o.lora = Spec(c, DefaultLoraTargets(), 2, 4);
  Gemma4Engine eng(c, B, T, o);
  const ParamRegistry& reg = eng.registry();
  auto counting = std::make_unique<Counting>(c, base, 5);
  const Counting* reads = counting.get();
  LoraWeights w(reg, std::move(counting), 5);
  std::vector<bool> frozen(reg.layout.size());
  for (int i = 0; i < reg.layout.size(); ++i) frozen[i] = i < reg.base_entries;
  FrozenWeights fw(reg, w, frozen);
  // Every frozen layer kept: more than two layers' worth.
  double layers = 0;
  for (int i = 0; i < reg.base_entries; ++i)
    if (LayerOfName(reg.layout.entry(i).name) >= 0) layers += reg.layout.entry(i).numel;
  EXPECT_GE(static_cast<double>(fw.ResidentBytes()), 4 * layers);
  auto p = LoraParams(c, reg, 0.1f, 5);
  std::vector<float> g(p.size(), 0.f), g_arena(p.size(), 0.f);
  ParamTable table = ParamTable::FromArenas(reg, p.data(), g.data(), nullptr);
  for (int i = 0; i < reg.base_entries; ++i) table.grad[i] = nullptr;
  fw.Bind(&table);
  MicroBatch tk = MakeBatch(c, B, T, 6);
  double loss = 0;
  for (int step = 0; step < 2; ++step) {
    const ForwardResult f = eng.Forward(table, tk.Get(B, T), &fw);
    eng.Backward(table, tk.Get(B, T), 1.0f / f.num_valid, &fw);
    loss = f.loss_sum;
  }
  for (int i = 0; i < reg.base_entries; ++i)
    if (LayerOfName(reg.layout.entry(i).name) >= 0 && !reg.is_buffer[i]) {
      EXPECT_EQ(reads->reads[i], 1) << reg.layout.entry(i).name;
    }
  const std::vector<bool> train = AdaptersOnly(reg);
  const ForwardResult f = eng.Forward(p.data(), tk.Get(B, T));
  EXPECT_EQ(f.loss_sum, loss);
  eng.Backward(p.data(), g_arena.data(), tk.Get(B, T), 1.0f / f.num_valid, &train);
  for (int i = reg.base_entries; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    for (int64_t j = 0; j < e.numel; ++j)
      ASSERT_EQ(2 * g_arena[e.offset + j], g[e.offset + j]) << e.name;  // two steps accumulated
  }
  // A file-backed base of the same size keeps two slots (KeepsAllFrozenLayers).
  EXPECT_FALSE(KeepsAllFrozenLayers(false, 4 * layers));
  EXPECT_FALSE(KeepsAllFrozenLayers(true, 2 * kKeepGeneratedLayersBytes));
}

// adapter_config.json: what slicetrain writes reads back; a multimodal model's names become
// PEFT's language-model regex, selecting the same layers; PEFT options slicetrain cannot run are
// refused by name.
TEST(LoraPeftFiles, ConfigRoundTripTargetsAndRefusals) {
  const std::string dir = test::TempDir("peft_config");
  PeftAdapterConfig c;
  c.r = 16;
  c.lora_alpha = 32;
  c.lora_dropout = 0.05;
  c.use_rslora = true;
  c.targets = ParseLoraTargets("v_proj,q_proj");
  c.modules_to_save = {"norm", "embed_tokens"};
  c.base_model_name_or_path = "google/gemma-4-E2B-it";
  { std::ofstream(dir + "/adapter_config.json") << PeftAdapterConfigJson(c); }
  auto back = ReadPeftAdapterConfig(dir);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->r, 16);
  EXPECT_EQ(back->lora_alpha, 32);
  EXPECT_EQ(back->lora_dropout, 0.05);
  EXPECT_TRUE(back->use_rslora);
  EXPECT_EQ(back->targets.names, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(back->base_model_name_or_path, c.base_model_name_or_path);
  EXPECT_EQ(back->modules_to_save, c.modules_to_save);

  const Gemma4Config cfg = MicroConfig(0.2);
  const ParamRegistry reg = BuildParamRegistry(cfg);
  for (const char* t : {"q_proj,v_proj", "all-linear", "down_proj,per_layer_model_projection"}) {
    const LoraTargets names = ParseLoraTargets(t);
    const LoraTargets re = PeftTargetsFor(names, "model.language_model.");
    EXPECT_FALSE(re.regex.empty()) << t;
    EXPECT_EQ(SelectLoraTargets(reg, re, "model.language_model.").value(),
              SelectLoraTargets(reg, names, "model.").value())
        << t << " as " << re.regex;
    EXPECT_EQ(PeftTargetsFor(names, "model.").names, names.names) << t;
  }

  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"use_dora", "true"},
                                                        {"bias", "\"all\""},
                                                        {"rank_pattern", "{\"q_proj\": 8}"},
                                                        {"exclude_modules", "[\"q_proj\"]"},
                                                        {"layers_to_transform", "[0, 1]"},
                                                        {"init_lora_weights", "\"pissa_niter_4\""},
                                                        {"peft_type", "\"IA3\""}}) {
    auto j = nlohmann::json::parse(PeftAdapterConfigJson(c));
    j[field] = nlohmann::json::parse(value);
    { std::ofstream(dir + "/adapter_config.json") << j.dump(); }
    auto r = ReadPeftAdapterConfig(dir);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
  std::filesystem::remove_all(dir);
}

// modules_to_save as PEFT matches them: a plain suffix of any module containing the tensor.
TEST(LoraPeftFiles, ModulesToSaveSelection) {
  const Gemma4Config cfg = MicroConfig(0.2);
  const ParamRegistry reg = BuildParamRegistry(cfg);
  auto q = SelectLoraTargets(reg, ParseLoraTargets("q_proj"), "model.");
  ASSERT_TRUE(q.ok());
  // "norm" ends input_layernorm, q_norm, ... and the final norm: every RMSNorm weight.
  auto norms = SelectModulesToSave(reg, {"norm"}, "model.", q.value());
  ASSERT_TRUE(norms.ok()) << norms.status().ToString();
  int64_t n = 0;
  for (int i = 0; i < reg.layout.size(); ++i) n += reg.is_norm[i];
  EXPECT_EQ(static_cast<int64_t>(norms->size()), n);
  // A whole module: every parameter under it, not its buffer (layer_scalar).
  auto layer = SelectModulesToSave(reg, {"layers.1"}, "model.", {});
  ASSERT_TRUE(layer.ok());
  for (int e : layer.value()) {
    EXPECT_EQ(reg.layout.entry(e).name.rfind("layers.1.", 0), 0u) << reg.layout.entry(e).name;
    EXPECT_FALSE(reg.is_buffer[e]);
  }
  EXPECT_FALSE(SelectModulesToSave(reg, {"layers.1"}, "model.", q.value()).ok());  // overlap
  EXPECT_FALSE(SelectModulesToSave(reg, {"lm_head_x"}, "model.", {}).ok());
  EXPECT_FALSE(SelectModulesToSave(reg, {"embed_tokens"}, "model.", {}).ok());  // tied head
  // For a multimodal model the saved names are the language model's modules, not a suffix that
  // would also match the vision tower's.
  ParamRegistry with = reg;
  LoraSpec spec;
  spec.targets = q.value();
  spec.full = SelectModulesToSave(reg, {"input_layernorm"}, "model.language_model.", {}).value();
  spec.rank = 2;
  spec.scaling = 1;
  AddLoraAdapters(&with, spec);
  const auto names = PeftModulesToSaveFor({"input_layernorm"}, with, "model.language_model.");
  ASSERT_EQ(names.size(), static_cast<size_t>(cfg.num_hidden_layers));
  EXPECT_EQ(names[0], "language_model.layers.0.input_layernorm");
  EXPECT_EQ(PeftModulesToSaveFor({"input_layernorm"}, with, "model."),
            std::vector<std::string>{"input_layernorm"});
}

// Adapters made by PEFT (tools/make_lora_fixtures.py): slicetrain reads the directory, and its
// loss, logits and every adapter gradient equal PEFT's on the fixture's batch.
TEST(LoraGolden, PeftAdapterLossLogitsAndGradients) {
  for (const char* name : {"lora_tiny_text", "lora_tiny_mm", "lora_tiny_text_mts"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(ST_FIXTURE_DIR) + "/" + name;
    auto adapter = ReadPeftAdapterConfig(dir);
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    auto m = LoadModel(std::string(ST_FIXTURE_DIR) + "/" + adapter->base_model_name_or_path, 0);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE(AttachPeftAdapter(&m.value(), dir).ok());
    const ParamRegistry& reg = m->registry;
    ASSERT_TRUE(reg.HasAdapters());
    auto golden = SafeTensorsFile::Open(dir + "/golden.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status().ToString();
    const SafeTensorInfo* ids_info = golden->Find("input_ids");
    ASSERT_NE(ids_info, nullptr);
    const int64_t B = ids_info->shape[0], T = ids_info->shape[1], V = m->config.vocab_size;
    std::vector<int32_t> ids(B * T), labels(B * T), mask_i(B * T);
    ASSERT_TRUE(golden->ReadI32("input_ids", ids.data(), {B, T}).ok());
    ASSERT_TRUE(golden->ReadI32("labels", labels.data(), {B, T}).ok());
    ASSERT_TRUE(golden->ReadI32("attention_mask", mask_i.data(), {B, T}).ok());
    std::vector<uint8_t> mask(mask_i.begin(), mask_i.end());
    const Batch batch{ids.data(), mask.data(), labels.data(), B, T};

    EngineOptions o;
    o.lora = m->lora;
    Gemma4Engine eng(m->config, B, T, o);
    ASSERT_EQ(eng.registry().layout.total(), reg.layout.total());
    AlignedBuffer params = MaterializeParams(m.value());
    const ForwardResult r = eng.Forward(params.data(), batch);
    float loss = 0;
    ASSERT_TRUE(golden->ReadF32("loss", &loss, {}).ok());
    EXPECT_NEAR(r.Loss(), loss, 1e-5 * loss);
    std::vector<float> logits(B * T * V), expect(logits.size());
    eng.ComputeLogits(params.data(), logits.data());
    ASSERT_TRUE(golden->ReadF32("logits", expect.data(), {B, T, V}).ok());
    EXPECT_LT(RelError(logits.data(), expect.data(), logits.size()), 1e-4);
    std::vector<float> grads(reg.layout.total(), 0.f);
    // The adapters and the modules_to_save train.
    std::vector<bool> train = AdaptersOnly(reg);
    int trained = 0;
    for (int i = 0; i < reg.layout.size(); ++i) {
      train[i] = train[i] || reg.lora_full[i];
      trained += train[i];
    }
    eng.Backward(params.data(), grads.data(), batch, 1.0f / r.num_valid, &train);
    int compared = 0;
    for (int i = 0; i < reg.layout.size(); ++i) {
      if (!train[i]) continue;
      const ArenaEntry& e = reg.layout.entry(i);
      const std::string key = "grad." + PeftTensorName(e.name, TextPrefixFor(m->config));
      std::vector<float> g(e.numel);
      ASSERT_TRUE(golden->ReadF32(key, g.data(), e.shape).ok()) << key;
      // fp32 through every layer on both sides (layer 0's q_proj A of tiny_mm: 1.3e-4).
      EXPECT_LT(RelError(grads.data() + e.offset, g.data(), e.numel), 3e-4) << e.name;
      ++compared;
    }
    // The merged export equals PEFT's merge_and_unload.
    const std::string out = test::TempDir("lora_merged");
    ASSERT_TRUE(WriteMergedModel(m.value(), out, DType::kF32, kDefaultMaxShardBytes).ok());
    auto merged = SafeTensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(merged.ok()) << merged.status().ToString();
    int merged_tensors = 0;
    for (const SafeTensorInfo& t : golden->tensors()) {
      if (t.name.rfind("merged.", 0) != 0) continue;
      const std::string hf = t.name.substr(7);
      std::vector<float> want(static_cast<size_t>(Numel(t.shape))), got(want.size());
      ASSERT_TRUE(golden->ReadF32(t.name, want.data(), t.shape).ok());
      ASSERT_TRUE(merged->ReadF32(hf, got.data(), t.shape).ok()) << hf;
      EXPECT_LT(RelError(got.data(), want.data(), got.size()), 1e-6) << hf;
      ++merged_tensors;
    }
    const int full = static_cast<int>(m->lora.full.size());
    EXPECT_EQ(merged_tensors, static_cast<int>(m->lora.targets.size()) + full);
    std::filesystem::remove_all(out);
    EXPECT_EQ(compared, trained);
    // Every golden gradient was compared: 5 inputs and outputs, logits_merged, merged.*, grad.*.
    EXPECT_EQ(compared + merged_tensors + 6, static_cast<int>(golden->tensors().size()));
    EXPECT_EQ(full, std::string(name) == "lora_tiny_text_mts" ? 7 : 0);
  }
}

}  // namespace
}  // namespace st
