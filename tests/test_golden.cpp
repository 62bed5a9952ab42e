// Golden tests: the engine against transformers' own forward and backward (tools/make_fixtures.py
// writes the fixtures: weights, inputs, logits, loss, every layer's output and every gradient).
#include <gtest/gtest.h>

#include <string>

#include "io/hf_model.h"
#include "io/safetensors.h"
#include "model/gemma4.h"
#include "test_util.h"

namespace st {
namespace {

using test::RelError;

constexpr double kTol = 1e-4;  // max error relative to the tensor's scale

struct GoldenCase {
  const char* fixture;
  Backend backend;
};

class Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Golden, LogitsLossHiddenStatesAndEveryGradient) {
  const std::string dir = std::string(ST_FIXTURE_DIR) + "/" + GetParam().fixture;
  auto cfg = LoadGemma4Config(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto golden_or = SafeTensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden_or.ok()) << golden_or.status().ToString();
  const SafeTensorsFile& golden = golden_or.value();
  const SafeTensorInfo* ids_info = golden.Find("input_ids");
  ASSERT_NE(ids_info, nullptr);
  const int64_t B = ids_info->shape[0], T = ids_info->shape[1], V = cfg->vocab_size;

  Gemma4Engine engine(*cfg, B, T, GetParam().backend);
  const ParamRegistry& reg = engine.registry();
  std::vector<float> params(reg.layout.total());
  auto report = LoadParams({dir + "/model.safetensors"}, *cfg, reg, params.data());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->scalars_defaulted, 0);

  std::vector<int32_t> ids(B * T), labels(B * T), mask_i(B * T);
  ASSERT_TRUE(golden.ReadI32("input_ids", ids.data(), {B, T}).ok());
  ASSERT_TRUE(golden.ReadI32("labels", labels.data(), {B, T}).ok());
  ASSERT_TRUE(golden.ReadI32("attention_mask", mask_i.data(), {B, T}).ok());
  std::vector<uint8_t> mask(mask_i.begin(), mask_i.end());
  const Batch batch{ids.data(), mask.data(), labels.data(), B, T};

  ForwardResult r = engine.Forward(params.data(), batch);
  float loss = 0;
  ASSERT_TRUE(golden.ReadF32("loss", &loss, {1}).ok());
  EXPECT_NEAR(r.Loss(), loss, kTol * loss);

  std::vector<float> expect(B * T * V);
  ASSERT_TRUE(golden.ReadF32("logits", expect.data(), {B, T, V}).ok());
  std::vector<float> logits(B * T * V);
  engine.ComputeLogits(params.data(), logits.data());
  EXPECT_LT(RelError(logits.data(), expect.data(), B * T * V), kTol) << "logits";

  const int64_t d = cfg->hidden_size;
  std::vector<float> h(B * T * d);
  ASSERT_TRUE(golden.ReadF32("embeds", h.data(), {B, T, d}).ok());
  EXPECT_LT(RelError(engine.hidden(-1), h.data(), B * T * d), kTol) << "embeddings";
  for (int64_t i = 0; i < cfg->num_hidden_layers; ++i) {
    ASSERT_TRUE(golden.ReadF32("hidden." + std::to_string(i), h.data(), {B, T, d}).ok());
    EXPECT_LT(RelError(engine.hidden(i), h.data(), B * T * d), kTol) << "hidden." << i;
  }
  ASSERT_TRUE(golden.ReadF32("final_hidden", h.data(), {B, T, d}).ok());
  EXPECT_LT(RelError(engine.final_hidden(), h.data(), B * T * d), kTol) << "final_hidden";

  std::vector<float> grads(params.size(), 0.0f);
  engine.Backward(params.data(), grads.data(), batch, 1.0f / static_cast<float>(r.num_valid));
  int checked = 0;
  for (int i = 0; i < reg.layout.size(); ++i) {
    const ArenaEntry& e = reg.layout.entry(i);
    const std::string name = "grad." + report->prefix + e.name;
    if (reg.is_buffer[i]) {
      EXPECT_EQ(golden.Find(name), nullptr) << name << ": buffers get no gradient";
      continue;
    }
    std::vector<float> g(e.numel);
    ASSERT_TRUE(golden.ReadF32(name, g.data(), e.shape).ok()) << name;
    EXPECT_LT(RelError(grads.data() + e.offset, g.data(), e.numel), kTol) << name;
    ++checked;
  }
  int golden_grads = 0;
  for (const auto& t : golden.tensors()) golden_grads += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(checked, golden_grads) << "every gradient in the fixture must be compared";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden,
                         ::testing::Values(GoldenCase{"tiny_text", Backend::kCpu},
                                           GoldenCase{"tiny_text", Backend::kRef},
                                           GoldenCase{"tiny_mm", Backend::kCpu},
                                           GoldenCase{"tiny_mm", Backend::kRef}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) +
                                  (info.param.backend == Backend::kCpu ? "_cpu" : "_ref");
                         });

}  // namespace
}  // namespace st
