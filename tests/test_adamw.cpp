// AdamW and gradient clipping against torch.optim.AdamW / clip_grad_norm_
// (tools/make_optim_fixtures.py writes the fixture).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "test_util.h"
#include "train/lr_schedule.h"

namespace st {
namespace {

TEST(AdamW, MatchesTorchOverSeveralStepsWithClipping) {
  auto f = SafeTensorsFile::Open(std::string(ST_FIXTURE_DIR) + "/adamw/golden.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const auto& meta = f->metadata();
  AdamWConfig cfg;
  cfg.lr = std::stod(meta.at("lr"));
  cfg.beta1 = std::stod(meta.at("beta1"));
  cfg.beta2 = std::stod(meta.at("beta2"));
  cfg.eps = std::stod(meta.at("eps"));
  cfg.weight_decay = std::stod(meta.at("weight_decay"));
  const double max_norm = std::stod(meta.at("max_norm"));
  const int steps = std::stoi(meta.at("steps"));
  const int64_t n = f->Find("param0")->shape[0];
  std::vector<float> p(n), m(n, 0.f), v(n, 0.f), g(n), expect(n);
  ASSERT_TRUE(f->ReadF32("param0", p.data(), {n}).ok());
  for (int k = 1; k <= steps; ++k) {
    ASSERT_TRUE(f->ReadF32("grad." + std::to_string(k), g.data(), {n}).ok());
    const double norm = std::sqrt(SumOfSquares(g.data(), n));
    float torch_norm = 0;
    ASSERT_TRUE(f->ReadF32("clipped_norm." + std::to_string(k), &torch_norm, {1}).ok());
    EXPECT_NEAR(norm, torch_norm, 1e-5 * torch_norm) << "step " << k;
    const float coef = ClipCoefficient(norm, max_norm);
    for (auto& x : g) x *= coef;
    ASSERT_TRUE(f->ReadF32("grad_clipped." + std::to_string(k), expect.data(), {n}).ok());
    EXPECT_LT(test::RelError(g, expect), 1e-6) << "clipped grads, step " << k;
    AdamWStep(cfg, k, p.data(), g.data(), m.data(), v.data(), n);
    ASSERT_TRUE(f->ReadF32("param." + std::to_string(k), expect.data(), {n}).ok());
    EXPECT_LT(test::RelError(p, expect), 1e-6) << "params after step " << k;
  }
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  AdamWConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.5;
  std::vector<float> p = {2.0f, -4.0f}, g = {0.f, 0.f}, m = {0.f, 0.f}, v = {0.f, 0.f};
  AdamWStep(cfg, 1, p.data(), g.data(), m.data(), v.data(), 2);
  EXPECT_FLOAT_EQ(p[0], 2.0f * 0.95f);
  EXPECT_FLOAT_EQ(p[1], -4.0f * 0.95f);
}

TEST(ClipCoefficient, NeverAboveOne) {
  EXPECT_FLOAT_EQ(ClipCoefficient(0.1, 1.0), 1.0f);
  EXPECT_NEAR(ClipCoefficient(4.0, 1.0), 0.25f, 1e-6);
}

// Every schedule, step by step, equals transformers' get_scheduler (tools/make_lr_fixtures.py):
// warm-ups of 0, 5 and 10 steps and longer than the run, minimum ratios, restarts, power, WSD
// decay, and steps past the end.
TEST(LrSchedule, MatchesTransformersGetScheduler) {
  std::ifstream f(std::string(ST_FIXTURE_DIR) + "/lr/schedules.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json g = nlohmann::json::parse(f);
  int checked = 0;
  for (const auto& c : g["cases"]) {
    auto type = ParseLrScheduler(c["name"].get<std::string>());
    ASSERT_TRUE(type.ok()) << type.status().message();
    LrSchedule s;
    s.type = *type;
    s.lr = c["lr"];
    s.warmup_steps = c["warmup_steps"];
    s.total_steps = c["total_steps"];
    s.min_lr_ratio = c["min_lr_ratio"];
    s.cycles = c["cycles"];
    s.power = c["power"];
    s.decay_steps = c["decay_steps"];
    const auto lrs = c["lrs"].get<std::vector<double>>();
    for (size_t k = 0; k < lrs.size(); ++k) {
      ASSERT_NEAR(s.At(static_cast<int64_t>(k)), lrs[k], 1e-12 + 1e-9 * lrs[k])
          << s.Describe() << " step " << k;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1500);
  EXPECT_FALSE(ParseLrScheduler("inverse_sqrt").ok());
  EXPECT_EQ(WarmupSteps(0, 0.1, 37), 4);  // ceil, as transformers
  EXPECT_EQ(WarmupSteps(7, 0.5, 37), 7);
}

}  // namespace
}  // namespace st
