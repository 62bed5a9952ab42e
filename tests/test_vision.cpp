// The vision tower's forward and backward (src/model/vision) against transformers'
// Gemma4VisionModel and get_image_features on tests/fixtures/vision_tiny
// (tools/make_vision_fixtures.py): a tiny tower with clipped linears, standardization and grouped
// key/value heads, two images of different sizes (so different padding) through the processor; and
// the text model with those images' soft tokens in its sequence against
// Gemma4ForConditionalGeneration (golden_text.safetensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/hf_model.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/decode.h"
#include "model/gemma4.h"
#include "model/vision/vision_tower.h"
#include "model/weights.h"
#include "test_util.h"

namespace st {
namespace {

const std::string kModel = ST_FIXTURE_DIR "/vision_tiny";

// max |a - b| over max |b|, over the first n values.
double Rel(const float* a, const float* b, int64_t n) {
  return test::RelError(a, b, n);
}

// golden.safetensors' two processed images (280 patches of 48 values each, padding included).
struct GoldenImages {
  static constexpr int kImages = 2, kMaxPatches = 280, kPatchDim = 48;
  std::vector<float> pixels = std::vector<float>(size_t(kImages) * kMaxPatches * kPatchDim);
  std::vector<int32_t> pos = std::vector<int32_t>(size_t(kImages) * kMaxPatches * 2);
  explicit GoldenImages(const SafeTensorsFile& g) {
    EXPECT_TRUE(g.ReadF32("pixel_values", pixels.data(), {kImages, kMaxPatches, kPatchDim}).ok());
    EXPECT_TRUE(g.ReadI32("image_position_ids", pos.data(), {kImages, kMaxPatches, 2}).ok());
  }
  StatusOr<std::vector<float>> Forward(const vision::VisionTower& tower,
                                       vision::VisionTrace* trace = nullptr,
                                       vision::VisionSaved* saved = nullptr) const {
    return tower.Forward(pixels.data(), pos.data(), kImages, kMaxPatches, trace, saved);
  }
};

// Every non-empty tensor of `grads` against the golden file's "grad.<name>" within 1e-4 of its
// largest value; returns how many were compared.
int ExpectGradients(vision::VisionTensors& grads, const vision::VisionConfig& c,
                    const SafeTensorsFile& golden, const char* what) {
  int checked = 0;
  double worst = 0;
  grads.ForEach(c, [&](const std::string& name, const std::vector<int64_t>& shape,
                       std::vector<float>& got) {
    if (got.empty()) return;
    std::vector<float> want(got.size());
    ASSERT_TRUE(golden.ReadF32("grad." + name, want.data(), Shape(shape.begin(), shape.end())).ok())
        << name;
    const double err = Rel(got.data(), want.data(), static_cast<int64_t>(got.size()));
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << name;
    ++checked;
  });
  std::printf("%d %s gradients, worst relative error %.2e\n", checked, what, worst);
  return checked;
}

TEST(VisionTower, EqualsTransformersLayerByLayer) {
  auto tower = vision::VisionTower::Load(kModel);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const vision::VisionConfig& c = (*tower)->config();
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_TRUE(c.use_clipped_linears);
  EXPECT_TRUE(c.standardize);
  EXPECT_EQ(c.text_hidden_size, 48);
  auto g = SafeTensorsFile::Open(kModel + "/golden.safetensors");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const int images = 2, max_patches = 280, H = 16;
  vision::VisionTrace trace;
  auto soft = GoldenImages(*g).Forward(**tower, &trace);
  ASSERT_TRUE(soft.ok()) << soft.status().ToString();

  // Per image, the real patches of each intermediate value (transformers also computes the
  // padding rows, which never reach an output).
  std::vector<float> want(size_t(images) * max_patches * H);
  std::vector<std::string> names = {"patch_embeddings"};
  for (int l = 0; l < c.num_hidden_layers; ++l) names.push_back("layer." + std::to_string(l));
  for (size_t k = 0; k < names.size(); ++k) {
    ASSERT_TRUE(g->ReadF32(names[k], want.data(), {images, max_patches, H}).ok()) << names[k];
    for (int img = 0; img < images; ++img) {
      const std::vector<float>& got =
          k == 0 ? trace.patch_embeddings[img] : trace.layers[k - 1][img];
      const int64_t n = static_cast<int64_t>(got.size()) / H;
      EXPECT_GT(n, 0);
      const double err = Rel(got.data(), want.data() + int64_t(img) * max_patches * H, n * H);
      std::printf("%s, image %d (%lld patches): relative error %.2e\n", names[k].c_str(), img,
                  static_cast<long long>(n), err);
      EXPECT_LT(err, 2e-6) << names[k] << " image " << img;
    }
  }
  const SafeTensorInfo* t = g->Find("tower");
  ASSERT_NE(t, nullptr);
  const int64_t tokens = t->shape[0];
  EXPECT_EQ(tokens, 63 + 70);
  std::vector<float> tower_want(size_t(tokens) * H), soft_want(size_t(tokens) * c.text_hidden_size);
  ASSERT_TRUE(g->ReadF32("tower", tower_want.data(), {tokens, H}).ok());
  ASSERT_TRUE(g->ReadF32("soft_tokens", soft_want.data(), {tokens, c.text_hidden_size}).ok());
  ASSERT_EQ(trace.tower.size(), tower_want.size());
  EXPECT_LT(Rel(trace.tower.data(), tower_want.data(), tokens * H), 2e-6);
  ASSERT_EQ(soft->size(), soft_want.size());
  const double soft_err = Rel(soft->data(), soft_want.data(), tokens * c.text_hidden_size);
  std::printf("tower output: %.2e, soft tokens: %.2e\n",
              Rel(trace.tower.data(), tower_want.data(), tokens * H), soft_err);
  EXPECT_LT(soft_err, 2e-6);
}

// The tower trained: from the soft tokens' gradient of golden_text's loss (transformers'), every
// tower and projection parameter's gradient as transformers' autograd computes it through
// Gemma4ForConditionalGeneration (clipped linears whose bounds bind for some values, two images
// with padding, grouped key/value heads).
TEST(VisionTower, GradientsEqualTransformers) {
  auto tower = vision::VisionTower::Load(kModel);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  const vision::VisionConfig& c = (*tower)->config();
  auto g = SafeTensorsFile::Open(kModel + "/golden.safetensors");
  auto gt = SafeTensorsFile::Open(kModel + "/golden_text.safetensors");
  ASSERT_TRUE(g.ok() && gt.ok());
  vision::VisionSaved saved;
  auto soft = GoldenImages(*g).Forward(**tower, nullptr, &saved);
  ASSERT_TRUE(soft.ok()) << soft.status().ToString();
  const int64_t tokens = 63 + 70;
  ASSERT_EQ(static_cast<int64_t>(soft->size()), tokens * c.text_hidden_size);
  std::vector<float> d_soft(soft->size());
  ASSERT_TRUE(gt->ReadF32("grad.soft_tokens", d_soft.data(), {tokens, c.text_hidden_size}).ok());

  vision::VisionTensors grads = (*tower)->weights().ZerosLike();
  ASSERT_TRUE((*tower)->Backward(saved, d_soft.data(), &grads).ok());
  EXPECT_EQ(ExpectGradients(grads, c, *gt, "tower"), 2 + 13 * c.num_hidden_layers + 1);

  // Backward adds: a second pass doubles every gradient.
  vision::VisionTensors twice = grads;
  ASSERT_TRUE((*tower)->Backward(saved, d_soft.data(), &twice).ok());
  EXPECT_NEAR(twice.projection[0], 2 * grads.projection[0], 1e-6 * std::fabs(grads.projection[0]));
  EXPECT_NEAR(twice.layers[0].q[3], 2 * grads.layers[0].q[3],
              1e-5 * std::fabs(grads.layers[0].q[3]));
}

// LoRA on the tower as PEFT places it (golden_lora.safetensors: get_peft_model on
// Gemma4ForConditionalGeneration, adapters inside the clipped linears, on the patch embedder and on
// the projection, the other linears left alone): the soft tokens and every adapter's gradient.
TEST(VisionTower, LoraEqualsPeft) {
  auto loaded = vision::VisionTower::Load(kModel);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  vision::VisionTower& tower = **loaded;
  const vision::VisionConfig& c = tower.config();
  auto g = SafeTensorsFile::Open(kModel + "/golden.safetensors");
  auto gl = SafeTensorsFile::Open(kModel + "/golden_lora.safetensors");
  ASSERT_TRUE(g.ok() && gl.ok());

  // "q_proj" names the wrapper (PEFT refuses it); its Linear is "q_proj.linear".
  auto wrapper = tower.EnableLora(ParseLoraTargets("q_proj"), 2, 2.0, 1);
  ASSERT_FALSE(wrapper.ok());
  EXPECT_NE(wrapper.status().ToString().find("q_proj.linear"), std::string::npos)
      << wrapper.status().ToString();
  auto chosen = tower.EnableLora(
      ParseLoraTargets("q_proj.linear,down_proj.linear,input_proj,embedding_projection"), 2,
      LoraScaling(2, 4.0, false), 1);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(chosen->size(), 6u);
  int adapters = 0;
  tower.mutable_weights().ForEach(
      c, [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& t) {
        if (name.find(".lora_") == std::string::npos) return;
        ASSERT_TRUE(gl->ReadF32("lora." + name, t.data(), Shape(shape.begin(), shape.end())).ok())
            << name;
        ++adapters;
      });
  EXPECT_EQ(adapters, 12);

  vision::VisionSaved saved;
  auto soft = GoldenImages(*g).Forward(tower, nullptr, &saved);
  ASSERT_TRUE(soft.ok()) << soft.status().ToString();
  const int64_t tokens = 63 + 70, W = c.text_hidden_size;
  std::vector<float> want(size_t(tokens * W)), d_soft(size_t(tokens * W));
  ASSERT_TRUE(gl->ReadF32("soft_tokens", want.data(), {tokens, W}).ok());
  ASSERT_TRUE(gl->ReadF32("d_soft", d_soft.data(), {tokens, W}).ok());
  ASSERT_EQ(soft->size(), want.size());
  EXPECT_LT(Rel(soft->data(), want.data(), tokens * W), 2e-6);

  // The base frozen: gradients for the adapters only.
  vision::VisionTensors grads = tower.weights().ZerosLike(/*base=*/false);
  ASSERT_TRUE(tower.Backward(saved, d_soft.data(), &grads).ok());
  EXPECT_TRUE(grads.projection.empty() && grads.layers[0].q.empty());
  EXPECT_EQ(ExpectGradients(grads, c, *gl, "adapter"), 12);
}

// adapter_config.json's target_modules for a run whose adapters reach the tower: the regex selects
// exactly the adapted tower modules (by the same rule PEFT applies: a whole-name match), never the
// Gemma4ClippableLinear wrappers PEFT refuses, and still the text model's.
TEST(VisionTower, PeftTargetsSelectTheAdaptedTowerModules) {
  auto c = vision::ReadVisionConfig(kModel);
  ASSERT_TRUE(c.ok());
  const std::vector<std::string> modules = vision::VisionTower::LinearModules(*c);
  ASSERT_EQ(modules.size(), 16u);
  for (const auto& [flag, want] : {std::pair<std::string, size_t>{"all-linear", 16},
                                   std::pair<std::string, size_t>{"q_proj,down_proj.linear", 2}}) {
    const LoraTargets t = ParseLoraTargets(flag);
    auto slots = vision::VisionTower::SelectLoraSlots(*c, t);
    ASSERT_TRUE(slots.ok());
    ASSERT_EQ(slots->size(), want) << flag;
    std::vector<std::string> chosen;
    for (int s : *slots) chosen.push_back(modules[size_t(s)]);
    const LoraTargets written = PeftTargetsFor(t, "model.language_model.", chosen);
    ASSERT_FALSE(written.regex.empty()) << flag;
    auto again = vision::VisionTower::SelectLoraSlots(*c, written);
    ASSERT_TRUE(again.ok()) << written.regex;
    EXPECT_EQ(*again, *slots) << flag << ": " << written.regex;
    const std::regex re(written.regex);
    EXPECT_FALSE(std::regex_match("model.vision_tower.encoder.layers.0.self_attn.q_proj", re));
    EXPECT_TRUE(std::regex_match("model.language_model.layers.0.self_attn.q_proj", re)) << flag;
  }
}

TEST(VisionTower, RefusalsAreOneLine) {
  // A text-only model (tiny_mm's wrapper has vision_config null).
  auto none = vision::VisionTower::Load(ST_FIXTURE_DIR "/tiny_mm");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().ToString().find("has no vision tower"), std::string::npos)
      << none.status().ToString();
  auto tower = vision::VisionTower::Load(kModel);
  ASSERT_TRUE(tower.ok());
  // 36 patches in one row: column 36 is inside the 200 positions; 9 rows of 4 are too.
  const int P = 48, max_patches = 280;
  std::vector<float> pixels(size_t(max_patches) * P, 0.5f);
  std::vector<int32_t> pos(size_t(max_patches) * 2, -1);
  for (int i = 0; i < 36; ++i) pos[2 * i] = 190 + (i % 18), pos[2 * i + 1] = i / 18;
  auto far = (*tower)->Forward(pixels.data(), pos.data(), 1, max_patches);
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().ToString().find("outside the tower's 200 positions"), std::string::npos)
      << far.status().ToString();
  for (int i = 0; i < 36; ++i) pos[2 * i] = i % 6, pos[2 * i + 1] = i / 6;
  auto fine = (*tower)->Forward(pixels.data(), pos.data(), 1, max_patches);
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->size(), size_t(9) * 48);
  // A clipping bound that is not one value (a damaged or foreign checkpoint) is refused, not read
  // past: the same model with one bound of two values.
  const std::string dir = test::TempDir("vision_bad");
  ASSERT_FALSE(dir.empty());
  std::filesystem::copy_file(kModel + "/config.json", dir + "/config.json");
  auto src = SafeTensorsFile::Open(kModel + "/model.safetensors");
  ASSERT_TRUE(src.ok());
  const std::string bad = "model.vision_tower.encoder.layers.0.self_attn.q_proj.input_min";
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  values.reserve(src->tensors().size());
  for (const SafeTensorInfo& t : src->tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    values.emplace_back(static_cast<size_t>(t.name == bad ? 2 : n), -1.5f);
    if (t.name != bad) {
      ASSERT_TRUE(src->ReadF32(t.name, values.back().data(), t.shape).ok());
    }
    tensors.push_back(
        {t.name, DType::kF32, t.name == bad ? Shape{2} : t.shape, values.back().data()});
  }
  ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", tensors, {}).ok());
  auto damaged = vision::VisionTower::Load(dir);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().ToString().find(bad + " holds 2 values, not one"), std::string::npos)
      << damaged.status().ToString();
  pos[2 * 40] = 0;  // a real patch after the padding began
  pos[2 * 40 + 1] = 0;
  auto after = (*tower)->Forward(pixels.data(), pos.data(), 1, max_patches);
  ASSERT_FALSE(after.ok());
  EXPECT_NE(after.status().ToString().find("a real patch after padding"), std::string::npos);
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// `slicetrain images --model-id`: the model's processor config, each image through the tower; the
// soft tokens' RMS per image equals that of transformers' soft tokens for the same image.
// The soft tokens in the text sequence: each image position embeds as its soft token, reads the
// pad token's per-layer embedding, and passes its gradient to the soft token instead of the pad
// rows (which are not zero in this fixture, so a wrong row shows). Frozen tower: the soft tokens
// are the golden's (transformers' own tower output), then the engine's tower output.
class VisionText : public ::testing::TestWithParam<Backend> {};

TEST_P(VisionText, SoftTokensInTheSequenceEqualTransformers) {
  constexpr double kTol = 1e-4;  // as the text goldens (tests/test_golden.cpp)
  auto cfg = LoadGemma4Config(kModel + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto g = SafeTensorsFile::Open(kModel + "/golden_text.safetensors");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const int64_t B = 2, T = 80, V = cfg->vocab_size, d = cfg->hidden_size, S = 133;
  std::vector<int32_t> ids(B * T), labels(B * T), mask_i(B * T);
  ASSERT_TRUE(g->ReadI32("input_ids", ids.data(), {B, T}).ok());
  ASSERT_TRUE(g->ReadI32("labels", labels.data(), {B, T}).ok());
  ASSERT_TRUE(g->ReadI32("attention_mask", mask_i.data(), {B, T}).ok());
  std::vector<uint8_t> mask(mask_i.begin(), mask_i.end());
  std::vector<float> soft(S * d), soft_grad_expect(S * d);
  ASSERT_TRUE(g->ReadF32("soft_tokens", soft.data(), {S, d}).ok());
  ASSERT_TRUE(g->ReadF32("grad.soft_tokens", soft_grad_expect.data(), {S, d}).ok());
  const int32_t image_token = 258880;  // config.json's image_token_id: outside the tiny vocabulary
  ASSERT_EQ(std::count(ids.begin(), ids.end(), image_token), S);

  Gemma4Engine engine(*cfg, B, T, GetParam());
  const ParamRegistry& reg = engine.registry();
  std::vector<float> params(reg.layout.total());
  auto report = LoadParams({kModel + "/model.safetensors"}, *cfg, reg, params.data());
  ASSERT_TRUE(report.ok()) << report.status().ToString();

  std::vector<float> soft_grad(S * d, 0.0f);
  Batch batch{ids.data(), mask.data(), labels.data(), B, T};
  batch.soft_tokens = soft.data();
  batch.num_soft_tokens = S;
  batch.soft_token_id = image_token;
  batch.soft_tokens_grad = soft_grad.data();
  const ForwardResult r = engine.Forward(params.data(), batch);
  float loss = 0;
  ASSERT_TRUE(g->ReadF32("loss", &loss, {1}).ok());
  EXPECT_NEAR(r.Loss(), loss, kTol * loss);
  std::vector<float> expect(B * T * V), logits(B * T * V);
  ASSERT_TRUE(g->ReadF32("logits", expect.data(), {B, T, V}).ok());
  engine.ComputeLogits(params.data(), logits.data());
  EXPECT_LT(Rel(logits.data(), expect.data(), B * T * V), kTol) << "logits";
  std::vector<float> h(B * T * d);
  ASSERT_TRUE(g->ReadF32("embeds", h.data(), {B, T, d}).ok());
  EXPECT_LT(Rel(engine.hidden(-1), h.data(), B * T * d), 1e-6) << "embeddings";
  for (int64_t i = 0; i < cfg->num_hidden_layers; ++i) {
    ASSERT_TRUE(g->ReadF32("hidden." + std::to_string(i), h.data(), {B, T, d}).ok());
    EXPECT_LT(Rel(engine.hidden(i), h.data(), B * T * d), kTol) << "hidden." << i;
  }

  std::vector<float> grads(params.size(), 0.0f);
  engine.Backward(params.data(), grads.data(), batch, 1.0f / static_cast<float>(r.num_valid));
  EXPECT_LT(Rel(soft_grad.data(), soft_grad_expect.data(), S * d), kTol) << "soft tokens' gradient";
  int checked = 0;
  for (int i = 0; i < reg.layout.size(); ++i) {
    if (reg.is_buffer[i]) continue;
    const ArenaEntry& e = reg.layout.entry(i);
    std::vector<float> want(e.numel);
    ASSERT_TRUE(g->ReadF32("grad." + report->prefix + e.name, want.data(), e.shape).ok()) << e.name;
    EXPECT_LT(Rel(grads.data() + e.offset, want.data(), e.numel), kTol) << e.name;
    ++checked;
  }
  EXPECT_GT(checked, 40);

  // End to end: the engine's own tower output in place of transformers'.
  auto tower = vision::VisionTower::Load(kModel);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  auto gv = SafeTensorsFile::Open(kModel + "/golden.safetensors");
  ASSERT_TRUE(gv.ok());
  auto ours = GoldenImages(*gv).Forward(**tower);
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  ASSERT_EQ(static_cast<int64_t>(ours->size()), S * d);
  batch.soft_tokens = ours->data();
  batch.soft_tokens_grad = nullptr;
  EXPECT_NEAR(engine.Forward(params.data(), batch).Loss(), loss, kTol * loss);

  // The KV-cached decoder (generate, chat) places them alike: each row fed in chunks of 16 (the
  // images cross chunks), the logits after its last real token as transformers'.
  const ArenaWeights source(reg, params.data());
  const DecodeWeights weights(reg, source);
  const int64_t real[2] = {T, 77}, first_soft[2] = {0, 63};
  for (int64_t row = 0; row < B; ++row) {
    Gemma4Decoder dec(*cfg, reg, weights, T, 16);
    const std::span<const int32_t> row_ids(ids.data() + row * T, static_cast<size_t>(real[row]));
    const int64_t n = std::count(row_ids.begin(), row_ids.end(), image_token);
    std::vector<float> last(static_cast<size_t>(V));
    const SoftTokens st{soft.data() + first_soft[row] * d, n, image_token};
    ASSERT_TRUE(dec.Append(0, row_ids, last.data(), st).ok());
    const float* want = expect.data() + (row * T + real[row] - 1) * V;
    EXPECT_LT(Rel(last.data(), want, V), kTol) << "decoder, row " << row;
    // Without its soft tokens the row is refused, not read past.
    Gemma4Decoder again(*cfg, reg, weights, T, 16);
    EXPECT_FALSE(
        again.Append(0, row_ids, last.data(), SoftTokens{soft.data(), n - 1, image_token}).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, VisionText, ::testing::Values(Backend::kCpu, Backend::kRef),
                         [](const auto& info) {
                           return std::string(info.param == Backend::kCpu ? "cpu" : "ref");
                         });

TEST(VisionCli, ImagesRunThroughTheTower) {
  const test::Ran r = test::RunCommand(std::string(ST_BINARY) + " images --json --model-id " +
                                       kModel + " " + ST_FIXTURE_DIR "/images/rgb420_61x43.jpg " +
                                       ST_FIXTURE_DIR "/images/tall_5x500.png");
  ASSERT_EQ(r.code, 0) << r.out;
  auto g = SafeTensorsFile::Open(kModel + "/golden.safetensors");
  ASSERT_TRUE(g.ok());
  std::vector<float> soft(size_t(133) * 48);
  ASSERT_TRUE(g->ReadF32("soft_tokens", soft.data(), {133, 48}).ok());
  std::istringstream lines(r.out);
  int64_t first = 0;
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t tokens = j["soft_tokens"].get<int64_t>();
    EXPECT_EQ(tokens, n == 0 ? 63 : 70) << line;
    double ss = 0;
    for (int64_t i = first * 48; i < (first + tokens) * 48; ++i) ss += double(soft[i]) * soft[i];
    EXPECT_NEAR(j["soft_token_rms"].get<double>(), std::sqrt(ss / double(tokens * 48)), 1e-5)
        << line;
    EXPECT_GT(j["tower_seconds"].get<double>(), 0.0);
    first += tokens;
  }
  EXPECT_EQ(n, 2);
}

}  // namespace
}  // namespace st
