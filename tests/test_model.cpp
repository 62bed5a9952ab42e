// The model as a whole: fast vs reference engine, finite differences through the full decoder
// (every parameter tensor), configs, presets and the save/load round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/hf_model.h"
#include "micro_model.h"
#include "model/config.h"
#include "model/frozen_weights.h"
#include "model/gemma4.h"
#include "model/weights.h"
#include "test_util.h"

namespace st {
namespace {

using test::MakeBatch;
using test::MicroBatch;
using test::MicroConfig;
using test::RandomVec;
using test::RelError;

// One backward each of two engines on the same batch: every parameter's gradient within tol.
void ExpectSameGradients(Gemma4Engine& a, Gemma4Engine& b, const std::vector<float>& params,
                         const Batch& batch, const ForwardResult& ra, const ForwardResult& rb,
                         double tol, const std::string& what) {
  std::vector<float> ga(params.size(), 0.f), gb(params.size(), 0.f);
  a.Backward(params.data(), ga.data(), batch, 1.0f / ra.num_valid);
  b.Backward(params.data(), gb.data(), batch, 1.0f / rb.num_valid);
  const ParamRegistry& reg = a.registry();
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    EXPECT_LT(RelError(ga.data() + e.offset, gb.data() + e.offset, e.numel), tol)
        << e.name << " " << what;
  }
}

std::vector<float> InitedParams(const Gemma4Config& c, const ParamRegistry& reg, uint64_t seed) {
  std::vector<float> p(reg.layout.total());
  InitParams(c, reg, p.data(), seed);
  // Non-trivial norms and scalars so that their gradients are exercised.
  Rng rng(seed + 1);
  for (int i = 0; i < reg.layout.size(); ++i)
    if (reg.is_norm[i] || reg.is_buffer[i]) {
      const ArenaEntry& e = reg.layout.entry(i);
      for (int64_t j = 0; j < e.numel; ++j) p[e.offset + j] = 1.0f + 0.3f * float(rng.Normal());
    }
  return p;
}

TEST(Engine, FastMatchesReference) {
  const Gemma4Config c = MicroConfig();
  const int64_t B = 3, T = 11;
  Gemma4Engine fast(c, B, T, Backend::kCpu), ref(c, B, T, Backend::kRef);
  auto params = InitedParams(c, fast.registry(), 1);
  MicroBatch mb = MakeBatch(c, B, T, 2);
  const Batch batch = mb.Get(B, T);
  ForwardResult rf = fast.Forward(params.data(), batch);
  ForwardResult rr = ref.Forward(params.data(), batch);
  EXPECT_EQ(rf.num_valid, rr.num_valid);
  EXPECT_NEAR(rf.Loss(), rr.Loss(), 1e-5 * rr.Loss());
  std::vector<float> lf(B * T * c.vocab_size), lr(lf.size());
  fast.ComputeLogits(params.data(), lf.data());
  ref.ComputeLogits(params.data(), lr.data());
  EXPECT_LT(RelError(lf.data(), lr.data(), B * T * c.vocab_size), 1e-5);
  ExpectSameGradients(fast, ref, params, batch, rf, rr, 1e-4, "fast vs reference");
}

TEST(Engine, SmallerBatchThanPlanned) {
  const Gemma4Config c = MicroConfig();
  Gemma4Engine big(c, 4, 16), exact(c, 2, 7);
  auto params = InitedParams(c, big.registry(), 3);
  MicroBatch mb = MakeBatch(c, 2, 7, 4);
  ForwardResult a = big.Forward(params.data(), mb.Get(2, 7));
  ForwardResult b = exact.Forward(params.data(), mb.Get(2, 7));
  EXPECT_DOUBLE_EQ(a.loss_sum, b.loss_sum);
}

// Finite differences through the whole model, one random direction per parameter tensor.
TEST(Engine, FiniteDifferencePerTensor) {
  const Gemma4Config c = MicroConfig();
  const int64_t B = 3, T = 7;
  Gemma4Config c1 = c;
  c1.initializer_range = 0.1;  // a gentler model: finite differences need a smooth loss
  Gemma4Engine eng(c1, B, T, Backend::kRef);
  const ParamRegistry& reg = eng.registry();
  auto params = InitedParams(c1, reg, 5);
  // Scale 1.0 attention on unit-RMS q and k gives scores of size ~D: a near-argmax softmax, too
  // curved for finite differences. Small q_norm/k_norm weights (as trained Gemma 4 has) smooth it.
  for (const LayerParams& lp : reg.layers)
    for (int idx : {lp.q_norm, lp.k_norm}) {
      if (idx < 0) continue;
      const ArenaEntry& e = reg.layout.entry(idx);
      for (int64_t j = 0; j < e.numel; ++j) params[e.offset + j] *= 0.3f;
    }
  // Padding positions carry id 0, whose embedding rows are zero: the RMSNorm of a zero vector
  // (rstd = 1/sqrt(eps) = 1000) is far too curved for finite differences. Give row 0 values.
  for (int idx : {reg.embed_tokens, reg.embed_tokens_per_layer}) {
    const ArenaEntry& e = reg.layout.entry(idx);
    auto row = RandomVec(e.shape[1], 99, 0.1f);
    for (int64_t j = 0; j < e.shape[1]; ++j) params[e.offset + j] = row[j];
  }
  MicroBatch mb = MakeBatch(c, B, T, 6);
  // Right padding only (row 2 would be left-padded: its empty rows follow autograd, not calculus).
  for (int64_t t = 0; t < 2; ++t) {
    mb.mask[2 * T + t] = 1;
    mb.ids[2 * T + t] = 5;
    mb.labels[2 * T + t] = 5;
  }
  const Batch batch = mb.Get(B, T);
  ForwardResult r = eng.Forward(params.data(), batch);
  std::vector<float> grad(params.size(), 0.f);
  eng.Backward(params.data(), grad.data(), batch, 1.0f / r.num_valid);
  auto loss_at = [&](const std::vector<float>& p) { return eng.Forward(p.data(), batch).Loss(); };
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (reg.is_buffer[i]) continue;
    const ArenaEntry& e = reg.layout.entry(i);
    auto u = RandomVec(e.numel, 100 + i);
    // The model is sharply curved in places (v_norm has no weight, so a small V row is rescaled
    // hard): a small step, with float rounding (~1e-6 on the loss) as the error floor.
    const double eps = 1e-4;
    auto pp = params, pm = params;
    double analytic = 0;
    for (int64_t j = 0; j < e.numel; ++j) {
      pp[e.offset + j] += static_cast<float>(eps) * u[j];
      pm[e.offset + j] -= static_cast<float>(eps) * u[j];
      analytic += double(grad[e.offset + j]) * u[j];
    }
    const double numeric = (loss_at(pp) - loss_at(pm)) / (2 * eps);
    EXPECT_NEAR(numeric, analytic, 1e-2 * std::fabs(analytic) + 2e-3) << e.name;
  }
}

// Packing (Batch::position_ids): the loss and every gradient of a packed batch equal the sums
// over its examples run alone, on both backends. The micro model's window (3) is shorter than most
// examples, so sliding-window layers restart per example; row 0 is filled exactly to T (an
// example ends at the row boundary), row 1 ends in padding, and a one-token example has no
// target at all.
TEST(Engine, PackedExamplesEqualTheirSumAlone) {
  const Gemma4Config c = MicroConfig();
  const int64_t B = 2, T = 16;
  const std::vector<std::vector<int64_t>> rows = {{5, 1, 7, 3}, {9, 4}};
  Rng rng(11);
  std::vector<std::vector<int32_t>> examples;
  for (const auto& row : rows)
    for (int64_t n : row) {
      std::vector<int32_t> e(n);
      for (auto& id : e) id = 1 + static_cast<int32_t>(rng.Below(c.vocab_size - 1));
      examples.push_back(e);
    }
  std::vector<int32_t> ids(B * T, 0), labels(B * T, -100), pos(B * T, 0);
  std::vector<uint8_t> mask(B * T, 0);
  size_t next = 0;
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = r * T;
    int32_t p = 0;
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const std::vector<int32_t>& e = examples[next++];
      for (size_t j = 0; j < e.size(); ++j, ++t) {
        ids[t] = e[j];
        mask[t] = 1;
        labels[t] = j > 0 ? e[j] : -100;
        pos[t] = static_cast<int32_t>(j);
      }
      p = static_cast<int32_t>(e.size());
    }
    for (; t < (r + 1) * T; ++t) pos[t] = p++;
  }
  for (Backend backend : {Backend::kCpu, Backend::kRef}) {
    SCOPED_TRACE(backend == Backend::kCpu ? "cpu" : "ref");
    Gemma4Engine packed(c, B, T, backend), alone(c, 1, T, backend);
    auto params = InitedParams(c, packed.registry(), 12);
    const Batch pb{ids.data(), mask.data(), labels.data(), B, T, pos.data()};
    const ForwardResult rp = packed.Forward(params.data(), pb);
    std::vector<float> gp(params.size(), 0.f), ga(params.size(), 0.f);
    packed.Backward(params.data(), gp.data(), pb, 1.0f);
    double loss_sum = 0;
    int64_t valid = 0;
    for (const std::vector<int32_t>& e : examples) {
      const int64_t n = static_cast<int64_t>(e.size());
      std::vector<uint8_t> m(n, 1);
      const Batch ab{e.data(), m.data(), e.data(), 1, n};
      const ForwardResult ra = alone.Forward(params.data(), ab);
      alone.Backward(params.data(), ga.data(), ab, 1.0f);  // accumulates over the examples
      loss_sum += ra.loss_sum;
      valid += ra.num_valid;
    }
    EXPECT_EQ(rp.num_valid, valid);
    EXPECT_NEAR(rp.loss_sum, loss_sum, 1e-5 * loss_sum);
    const ParamRegistry& reg = packed.registry();
    for (int i = 0; i < reg.layout.size(); ++i) {
      const ArenaEntry& e = reg.layout.entry(i);
      EXPECT_LT(RelError(gp.data() + e.offset, ga.data() + e.offset, e.numel), 1e-4) << e.name;
    }
    // Without the position ids the rows are ordinary causal sequences: a different loss.
    const Batch plain{ids.data(), mask.data(), labels.data(), B, T};
    EXPECT_GT(std::fabs(packed.Forward(params.data(), plain).loss_sum - loss_sum), 1e-3 * loss_sum);
  }
}

TEST(Engine, FrozenParametersGetNoGradient) {
  const Gemma4Config c = MicroConfig();
  Gemma4Engine eng(c, 2, 5);
  const ParamRegistry& reg = eng.registry();
  auto params = InitedParams(c, reg, 7);
  MicroBatch mb = MakeBatch(c, 2, 5, 8);
  ForwardResult r = eng.Forward(params.data(), mb.Get(2, 5));
  std::vector<bool> trainable(reg.layout.size(), true);
  trainable[reg.embed_tokens_per_layer] = false;
  for (int i = 0; i < reg.layout.size(); ++i)
    if (reg.is_buffer[i]) trainable[i] = false;
  std::vector<float> grad(params.size(), 0.f);
  eng.Backward(params.data(), grad.data(), mb.Get(2, 5), 1.0f / r.num_valid, &trainable);
  const ArenaEntry& e = reg.layout.entry(reg.embed_tokens_per_layer);
  for (int64_t j = 0; j < e.numel; ++j) ASSERT_EQ(grad[e.offset + j], 0.0f);
  const ArenaEntry& q = reg.layout.entry(reg.layers[0].q_proj);
  double norm = 0;
  for (int64_t j = 0; j < q.numel; ++j) norm += std::fabs(grad[q.offset + j]);
  EXPECT_GT(norm, 0.0);
}

TEST(Config, PresetsAreValidAndSized) {
  for (const auto& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
  }
  auto tiny = PresetConfig("gemma4-tiny").value();
  auto small = PresetConfig("gemma4-small").value();
  auto e2b = PresetConfig("gemma4-e2b").value();
  auto count = [](const Gemma4Config& c) { return BuildParamRegistry(c).layout.total(); };
  EXPECT_GT(count(tiny), 2'000'000);
  EXPECT_LT(count(tiny), 8'000'000);
  EXPECT_GT(count(small), 30'000'000);
  EXPECT_LT(count(small), 60'000'000);
  // E2B: 4.629 B text parameters (reference/gemma4.md section 2.1).
  EXPECT_NEAR(static_cast<double>(count(e2b)), 4.629e9, 0.01e9);
  EXPECT_EQ(e2b.KvSourceLayer(15), 13);
  EXPECT_EQ(e2b.KvSourceLayer(19), 14);
  EXPECT_EQ(e2b.KvSourceLayer(34), 14);
  EXPECT_EQ(e2b.MlpWidth(14), 6144);
  EXPECT_EQ(e2b.MlpWidth(15), 12288);
  EXPECT_EQ(e2b.HeadDim(4), 512);
  EXPECT_FALSE(PresetConfig("gemma4-huge").ok());
}

TEST(Config, ParsesWrapperTextAndPerLayerConfig) {
  const std::string text = R"({"model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "global_head_dim": 8, "hidden_size_per_layer_input": 2,
    "vocab_size_per_layer_input": 64, "num_kv_shared_layers": 1, "use_double_wide_mlp": true,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "final_logit_softcapping": 30.0, "sliding_window": 4})";
  auto c = ParseGemma4Config(text);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layer_types[2], LayerType::kFull) << "the last layer is forced to full attention";
  EXPECT_EQ(c->HeadDim(1), 8);
  EXPECT_EQ(c->MlpWidth(2), 32);
  const std::string wrapped = R"({"model_type": "gemma4", "tie_word_embeddings": true,
    "text_config": {"model_type": "gemma4_text", "vocab_size": 64, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "hidden_size_per_layer_input": 0,
    "layer_types": ["sliding_attention", "full_attention"],
    "per_layer_config": {"1": {"head_dim": 8}}}})";
  auto w = ParseGemma4Config(wrapped);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->model_type, "gemma4");
  EXPECT_EQ(w->HeadDim(0), 4);
  EXPECT_EQ(w->HeadDim(1), 8);
  EXPECT_EQ(TextPrefixFor(*w), "model.language_model.");
}

TEST(Config, RejectsBadConfigsWithAClearMessage) {
  struct Case {
    const char* json;
    const char* needle;
  };
  const Case cases[] = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"model_type": "llama"})", "not a Gemma 4 model"},
      {R"({"model_type": "gemma4"})", "text_config"},
      {R"({"model_type": "gemma4_text", "hidden_size": "big"})", "hidden_size"},
      {R"({"model_type": "gemma4_text", "hidden_size": -5})", "hidden_size"},
      {R"({"model_type": "gemma4_text", "num_hidden_layers": 0})", "num_hidden_layers"},
      {R"({"model_type": "gemma4_text", "num_attention_heads": 3})", "multiple"},
      {R"({"model_type": "gemma4_text", "num_kv_shared_layers": 30})", "num_kv_shared_layers"},
      {R"({"model_type": "gemma4_text", "hidden_activation": "relu"})", "relu"},
      {R"({"model_type": "gemma4_text", "layer_types": ["moe"]})", "layer type"},
      {R"({"model_type": "gemma4_text", "rms_norm_eps": 0})", "rms_norm_eps"},
  };
  for (const Case& k : cases) {
    auto c = ParseGemma4Config(k.json);
    EXPECT_FALSE(c.ok()) << k.json;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find(k.needle), std::string::npos)
          << k.json << " -> " << c.status().message();
    }
  }
}

TEST(HfModel, SaveLoadRoundTripBothPrefixes) {
  char tmpl[] = "/tmp/st_hfmodel_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const char* type : {"gemma4_text", "gemma4"}) {
    Gemma4Config c = MicroConfig();
    c.model_type = type;
    const ParamRegistry reg = BuildParamRegistry(c);
    auto params = InitedParams(c, reg, 9);
    const std::string out = dir + "/" + type;
    ASSERT_TRUE(SaveHfModel(out, c, reg, params.data(), DType::kF32).ok());
    auto cfg2 = LoadGemma4Config(out + "/config.json");
    ASSERT_TRUE(cfg2.ok()) << cfg2.status().ToString();
    const ParamRegistry reg2 = BuildParamRegistry(*cfg2);
    ASSERT_EQ(reg2.layout.total(), reg.layout.total());
    std::vector<float> loaded(params.size(), -1.f);
    auto files = ModelWeightFiles(out);
    ASSERT_TRUE(files.ok());
    auto rep = LoadParams(*files, *cfg2, reg2, loaded.data());
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_EQ(rep->prefix, TextPrefixFor(c));
    for (int i = 0; i < reg.layout.size(); ++i) {
      const ArenaEntry& e = reg.layout.entry(i);
      for (int64_t j = 0; j < e.numel; ++j) ASSERT_EQ(loaded[e.offset + j], params[e.offset + j]);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(HfModel, MissingTensorAndWrongShapeAreErrors) {
  char tmpl[] = "/tmp/st_hfmodel_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Gemma4Config c = MicroConfig();
  const ParamRegistry reg = BuildParamRegistry(c);
  auto params = InitedParams(c, reg, 10);
  ASSERT_TRUE(SaveHfModel(dir, c, reg, params.data(), DType::kBF16).ok());
  // A config with a wider MLP no longer matches the weights.
  Gemma4Config wider = c;
  wider.intermediate_size = 32;
  const ParamRegistry reg_w = BuildParamRegistry(wider);
  std::vector<float> buf(reg_w.layout.total());
  auto r = LoadParams({dir + "/model.safetensors"}, wider, reg_w, buf.data());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mlp.gate_proj"), std::string::npos) << r.status().message();
  // More layers than the file has (no PLE, whose table width would change first).
  c.hidden_size_per_layer_input = 0;
  const ParamRegistry reg_nople = BuildParamRegistry(c);
  auto params_nople = InitedParams(c, reg_nople, 11);
  ASSERT_TRUE(SaveHfModel(dir, c, reg_nople, params_nople.data(), DType::kF32).ok());
  Gemma4Config deeper = c;
  deeper.num_hidden_layers = 6;
  deeper.layer_types.insert(deeper.layer_types.end() - 1, LayerType::kSliding);
  ASSERT_TRUE(deeper.Validate().ok());
  const ParamRegistry reg_d = BuildParamRegistry(deeper);
  std::vector<float> buf2(reg_d.layout.total());
  auto r2 = LoadParams({dir + "/model.safetensors"}, deeper, reg_d, buf2.data());
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("is missing from the checkpoint"), std::string::npos)
      << r2.status().message();
  std::filesystem::remove_all(dir);
}

// Found by fuzz/fuzz_config.cpp: a non-string model_type threw nlohmann::type_error.
TEST(Config, WrongTypesAndAbsurdSizesAreErrors) {
  auto bad = ParseGemma4Config(R"({"model_type": 4})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'model_type' has the wrong type"), std::string::npos);
  auto huge = ParseGemma4Config(R"({"model_type": "gemma4_text", "vocab_size": 2147483648,
      "vocab_size_per_layer_input": 2147483648, "hidden_size": 65536})");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("billion parameters"), std::string::npos)
      << huge.status().message();
  EXPECT_TRUE(PresetConfig("gemma4-e2b").ok());
  // Found by fuzz_config: per_layer_config for a layer past a short layer_types list read out of
  // bounds (fuzz/corpus/fuzz_config/regress_per_layer_config_past_layer_types.json).
  auto short_types = ParseGemma4Config(R"({"model_type": "gemma4_text", "num_hidden_layers": 6,
      "layer_types": ["sliding_attention", "full_attention"],
      "per_layer_config": {"5": {"head_dim": 32}}})");
  ASSERT_FALSE(short_types.ok());
  EXPECT_NE(short_types.status().message().find("layer_types has 2 entries"), std::string::npos)
      << short_types.status().message();
}

// The head and loss in tiles of kHeadRows x kHeadBlock against the whole [N, V] logits and the
// plain cross-entropy kernels (the same engine otherwise): a vocabulary that is not a multiple of
// the block, more target rows than one tile, padding and ignored targets. Loss and every gradient
// (the tied head's included).
TEST(Engine, TiledHeadLossMatchesTheWholeLogits) {
  Gemma4Config c = MicroConfig();
  c.vocab_size = c.vocab_size_per_layer_input = 2 * kHeadBlock + 123;
  ASSERT_TRUE(c.Validate().ok());
  // 3 x 1061 rows: two tiles of rows (the logits would take 105 MB, so they are recomputed); and
  // 2 x 60 rows, whose logits the engine keeps from the forward (kHeadCacheBytes).
  for (auto [B, T] : {std::pair<int64_t, int64_t>{3, kHeadRows / 2 + 37}, {2, 60}}) {
    EngineOptions whole;
    whole.whole_logits = true;
    Gemma4Engine fast(c, B, T), ref(c, B, T, whole);
    auto params = InitedParams(c, fast.registry(), 7);
    MicroBatch mb = MakeBatch(c, B, T, 8);
    for (int64_t i = 0; i < B * T; i += 5) mb.labels[i] = -100;  // ignored targets inside rows
    const Batch batch = mb.Get(B, T);
    const ForwardResult rf = fast.Forward(params.data(), batch);
    const ForwardResult rr = ref.Forward(params.data(), batch);
    EXPECT_EQ(rf.num_valid, rr.num_valid);
    EXPECT_NEAR(rf.Loss(), rr.Loss(), 1e-6 * rr.Loss()) << B << "x" << T;
    ExpectSameGradients(fast, ref, params, batch, rf, rr, 1e-5, StrCat(B, "x", T));
    // The forward-only engine (evaluate's) gives the same loss.
    EngineOptions eval;
    eval.training = false;
    Gemma4Engine forward_only(c, B, T, eval);
    const ForwardResult re = forward_only.Forward(params.data(), batch);
    EXPECT_EQ(re.num_valid, rf.num_valid);
    EXPECT_NEAR(re.loss_sum, rf.loss_sum, 1e-6 * rf.loss_sum);
    EXPECT_LT(forward_only.ActivationBytes(), fast.ActivationBytes());
  }
}

// Per-token log-probs (what DPO sums) and a backward with per-token loss weights (what an
// objective's gradient becomes), tiled head against the whole logits: equal log-probs summing to
// the loss, equal weighted gradients, and weights of 1 / targets equal to the plain mean loss.
TEST(Engine, TargetLogProbsAndWeightedBackwardMatchTheWholeLogits) {
  Gemma4Config c = MicroConfig();
  c.vocab_size = c.vocab_size_per_layer_input = kHeadBlock + 77;
  ASSERT_TRUE(c.Validate().ok());
  const int64_t B = 2, T = 40;
  EngineOptions whole;
  whole.whole_logits = true;
  Gemma4Engine fast(c, B, T), ref(c, B, T, whole);
  auto params = InitedParams(c, fast.registry(), 11);
  MicroBatch mb = MakeBatch(c, B, T, 12);
  for (int64_t i = 0; i < B * T; i += 7) mb.labels[i] = -100;
  Batch batch = mb.Get(B, T);
  const ForwardResult rf = fast.Forward(params.data(), batch);
  ref.Forward(params.data(), batch);
  std::vector<float> lf(B * T), lr(B * T);
  fast.TargetLogProbs(lf.data());
  ref.TargetLogProbs(lr.data());
  double sum = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    EXPECT_NEAR(lf[i], lr[i], 1e-4) << i;
    const bool target = i % T > 0 && batch.labels[i] != -100;
    if (!target) {
      EXPECT_EQ(lf[i], 0.0f) << i;
    }
    sum -= lf[i];
  }
  EXPECT_NEAR(sum, rf.loss_sum, 1e-5 * rf.loss_sum);
  // Weights of 1 / targets everywhere: the plain mean loss's gradients.
  std::vector<float> mean_w(B * T, 1.0f / static_cast<float>(rf.num_valid));
  std::vector<float> plain(params.size(), 0.f), weighted(params.size(), 0.f);
  fast.Backward(params.data(), plain.data(), batch, 1.0f / rf.num_valid);
  fast.Forward(params.data(), batch);
  Batch wb = batch;
  wb.loss_weights = mean_w.data();
  fast.Backward(params.data(), weighted.data(), wb, 1.0f);
  EXPECT_LT(RelError(plain.data(), weighted.data(), static_cast<int64_t>(plain.size())), 1e-6);
  // Arbitrary signed weights: tiled and whole agree.
  Rng rng(5);
  std::vector<float> w(B * T);
  for (float& x : w) x = static_cast<float>(rng.Normal()) * 0.1f;
  wb.loss_weights = w.data();
  std::vector<float> gf(params.size(), 0.f), gr(params.size(), 0.f);
  fast.Forward(params.data(), batch);
  fast.Backward(params.data(), gf.data(), wb, 1.0f);
  ref.Forward(params.data(), batch);
  ref.Backward(params.data(), gr.data(), wb, 1.0f);
  const ParamRegistry& reg = fast.registry();
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    EXPECT_LT(RelError(gf.data() + e.offset, gr.data() + e.offset, e.numel), 1e-5) << e.name;
  }
}

// A logit temperature (GRPO's log-probs at the sampling temperature): TargetLogProbs are the
// log-softmax of the softcapped logits / t, and the weighted backward is their gradient, checked
// by central differences on the final norm's weights (the largest gradients; 2e-2 relative, the
// fp32 forward's noise over a step of 1e-2).
TEST(Engine, LogitTemperatureScalesTheLogProbsAndTheirGradient) {
  Gemma4Config c = MicroConfig();
  const int64_t B = 2, T = 16, V = c.vocab_size;
  const float t = 0.6f;
  Gemma4Engine engine(c, B, T);
  auto params = InitedParams(c, engine.registry(), 21);
  MicroBatch mb = MakeBatch(c, B, T, 22);
  Batch batch = mb.Get(B, T);
  engine.SetLogitTemperature(t);
  engine.SetComputeEntropy(true);
  engine.Forward(params.data(), batch);
  std::vector<float> lp(B * T), ent(B * T), logits(B * T * V);
  engine.TargetLogProbs(lp.data());
  engine.TargetEntropies(ent.data());
  engine.ComputeLogits(params.data(), logits.data());
  int checked = 0;
  for (int64_t n = 0; n + 1 < B * T; ++n) {
    if ((n + 1) % T == 0 || batch.labels[n + 1] == -100) continue;
    const float* z = logits.data() + n * V;
    double m = -1e300, s = 0, e = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]) / t);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(static_cast<double>(z[v]) / t - m);
      s += p;
      e += p * (static_cast<double>(z[v]) / t);
    }
    EXPECT_NEAR(lp[n + 1], z[batch.labels[n + 1]] / t - m - std::log(s), 2e-4) << n;
    // The entropy -sum p log p = lse - E_p[z / t] (GRPO's `entropy` metric).
    EXPECT_NEAR(ent[n + 1], m + std::log(s) - e / s, 2e-4) << n;
    ++checked;
  }
  EXPECT_GT(checked, 10);
  engine.SetComputeEntropy(false);
  Rng rng(9);
  std::vector<float> w(B * T);
  for (float& x : w) x = static_cast<float>(rng.Normal());
  auto objective = [&](const std::vector<float>& p) {  // sum of w x token loss, in double
    engine.Forward(p.data(), batch);
    engine.TargetLogProbs(lp.data());
    double v = 0;
    for (int64_t i = 0; i < B * T; ++i) v -= static_cast<double>(w[i]) * lp[i];
    return v;
  };
  std::vector<float> grad(params.size(), 0.0f);
  objective(params);
  Batch wb = batch;
  wb.loss_weights = w.data();
  engine.Backward(params.data(), grad.data(), wb, 1.0f);
  const ArenaEntry& e = engine.registry().layout.entry(engine.registry().norm);
  std::vector<int64_t> idx(static_cast<size_t>(e.numel));
  for (int64_t i = 0; i < e.numel; ++i) idx[static_cast<size_t>(i)] = i;
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return std::abs(grad[e.offset + a]) > std::abs(grad[e.offset + b]);
  });
  for (int k = 0; k < 3; ++k) {
    const int64_t j = e.offset + idx[static_cast<size_t>(k)];
    const float h = 1e-2f;
    std::vector<float> p = params;
    p[j] += h;
    const double up = objective(p);
    p[j] -= 2 * h;
    const double down = objective(p);
    const double fd = (up - down) / (2.0 * h);
    EXPECT_NEAR(grad[j], fd, 2e-2 * std::abs(fd))
        << "final norm weight " << idx[static_cast<size_t>(k)];
  }
  engine.SetLogitTemperature(1.0f);
}

// Activation checkpointing recomputes with the same kernels on the same inputs: loss and every
// gradient bit for bit those of keeping everything, with padding, KV sharing and PLE, and with the
// embedding tables frozen and served from a source (FrozenWeights' per-layer hooks).
TEST(Engine, CheckpointingIsBitIdenticalToKeepingEverything) {
  const Gemma4Config c = MicroConfig();
  const int64_t B = 3, T = 11;
  const ParamRegistry reg = BuildParamRegistry(c);
  auto params = InitedParams(c, reg, 3);
  MicroBatch mb = MakeBatch(c, B, T, 4);
  const Batch batch = mb.Get(B, T);
  std::vector<bool> trainable(reg.layout.size());
  for (int i = 0; i < reg.layout.size(); ++i) trainable[i] = !reg.is_buffer[i];
  trainable[reg.embed_tokens] = trainable[reg.embed_tokens_per_layer] = false;
  std::vector<bool> frozen(trainable.size());
  for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = !trainable[i];
  const ArenaWeights source(reg, params.data());
  struct Run {
    double loss_sum;
    std::vector<float> grads, grads_frozen;
    size_t bytes;
  };
  auto run = [&](ActivationCheckpointing ckpt) {
    EngineOptions o;
    o.checkpointing = ckpt;
    Gemma4Engine eng(c, B, T, o);
    Run r;
    r.grads.assign(params.size(), 0.f);
    const ForwardResult f = eng.Forward(params.data(), batch);
    eng.Backward(params.data(), r.grads.data(), batch, 1.0f / f.num_valid);
    r.loss_sum = f.loss_sum;
    r.bytes = eng.ActivationBytes();
    // Frozen embeddings from the source, the rest through a table with hooks.
    r.grads_frozen.assign(params.size(), 0.f);
    FrozenWeights fw(reg, source, frozen);
    ParamTable table =
        ParamTable::FromArenas(reg, params.data(), r.grads_frozen.data(), &trainable);
    fw.Bind(&table);
    const ForwardResult g = eng.Forward(table, batch, &fw);
    eng.Backward(table, batch, 1.0f / g.num_valid, &fw);
    EXPECT_EQ(g.loss_sum, f.loss_sum);
    return r;
  };
  const Run none = run(ActivationCheckpointing::kNone);
  for (ActivationCheckpointing ckpt :
       {ActivationCheckpointing::kMlp, ActivationCheckpointing::kLayer}) {
    const Run got = run(ckpt);
    const char* name = ActivationCheckpointingName(ckpt);
    EXPECT_EQ(got.loss_sum, none.loss_sum) << name;
    EXPECT_EQ(got.grads, none.grads) << name;
    EXPECT_EQ(got.grads_frozen, none.grads_frozen) << name;
    EXPECT_LT(got.bytes, none.bytes) << name;
  }
  EXPECT_TRUE(ParseActivationCheckpointing("layer").ok());
  EXPECT_EQ(ParseActivationCheckpointing("full").status().code(), StatusCode::kInvalidArgument);
}

// The estimate that turns an impossible --batch-size/--max-seq-len into a message stays close to
// what the engine really plans, so that it never refuses a batch that would fit.
TEST(Config, ActivationEstimateTracksTheEngine) {
  for (const char* preset : {"gemma4-tiny", "gemma4-small"}) {
    auto c = PresetConfig(preset);
    ASSERT_TRUE(c.ok());
    for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 7}, {4, 48}, {2, 200}}) {
      Gemma4Engine engine(*c, B, T);
      const double real = static_cast<double>(engine.ActivationBytes());
      const double est = EstimateActivationBytes(*c, B, T);
      EXPECT_GT(est, 0.5 * real) << preset << " " << B << "x" << T;
      EXPECT_LT(est, 1.5 * real) << preset << " " << B << "x" << T;
    }
  }
  auto tiny = PresetConfig("gemma4-tiny");
  EXPECT_TRUE(CheckActivationMemory(*tiny, 4, 48).ok());
  EXPECT_EQ(CheckActivationMemory(*tiny, 8, 2000000000).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace st
