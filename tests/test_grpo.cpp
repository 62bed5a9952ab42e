// GRPO (--objective grpo):
// - the group advantages and reward metrics, and every loss type's loss, gradient (-weights) and
//   clip/KL metrics, against TRL 1.16's own GRPOTrainer code on fixed rewards and log-probs
//   (tests/fixtures/grpo/golden.json from tools/make_grpo_fixtures.py);
// - batched sampling: G completions per prompt, greedy ones equal to a sequence decoded alone,
//   stop tokens and truncation as TRL marks them;
// - a toy task learns end to end: the mean reward rises over a short run on gemma4-tiny;
// - multi-turn episodes with tool calls: Gemma 4's calls parsed as TRL's parse_response does and
//   the environment's results (and user turns after a call) rendered as the chat template does
//   (tests/fixtures/tool_turns from tools/make_tool_turn_fixtures.py).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/chat_template.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "data/tool_calls.h"
#include "model/decode.h"
#include "model/gemma4.h"
#include "model/weights.h"
#include "proc_util.h"
#include "test_util.h"
#include "train/environment.h"
#include "train/objectives/grpo.h"
#include "train/rollout.h"

namespace st {
namespace {

nlohmann::json Golden() {
  std::ifstream in(ST_FIXTURE_DIR "/grpo/golden.json");
  return nlohmann::json::parse(in);
}

double Num(const nlohmann::json& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

void ExpectNear(double got, const nlohmann::json& want, double tol, const std::string& what) {
  if (want.is_null()) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got << ", TRL NaN";
    return;
  }
  EXPECT_NEAR(got, want.get<double>(), tol) << what;
}

// Advantages and reward metrics: TRL computes in float32, here in double (2e-5 absolute on
// values of order 1, the float32 rounding of the group statistics).
TEST(GrpoGolden, AdvantagesAndRewardMetricsEqualTrl) {
  const nlohmann::json g = Golden();
  ASSERT_GE(g["advantages"].size(), 6u);
  for (const nlohmann::json& c : g["advantages"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<std::vector<double>> r;
    for (const nlohmann::json& row : c["rewards_per_func"]) {
      r.emplace_back();
      for (const nlohmann::json& v : row) r.back().push_back(Num(v));
    }
    const std::vector<double> w = c["reward_weights"].get<std::vector<double>>();
    const GroupAdvantagesResult a =
        GroupAdvantages(r, w, c["G"].get<int64_t>(), c["scale_rewards"].get<std::string>());
    ASSERT_EQ(a.advantages.size(), c["advantages"].size());
    for (size_t i = 0; i < a.advantages.size(); ++i)
      ExpectNear(a.advantages[i], c["advantages"][i],
                 2e-4 * std::max(1.0, std::abs(Num(c["advantages"][i]))),
                 "advantage " + std::to_string(i));
    const nlohmann::json& m = c["metrics"];
    ExpectNear(a.reward, m["reward"], 2e-5, "reward");
    ExpectNear(a.reward_std, m["reward_std"], 2e-5, "reward_std");
    ExpectNear(a.frac_reward_zero_std, m["frac_reward_zero_std"], 1e-7, "frac_reward_zero_std");
    for (size_t f = 0; f < w.size(); ++f) {
      const std::string n = c["reward_funcs"][f].get<std::string>();
      ExpectNear(a.func_mean[f], m["rewards/" + n + "/mean"], 2e-5, n + " mean");
      ExpectNear(a.func_std[f], m["rewards/" + n + "/std"], 2e-5, n + " std");
    }
  }
}

std::vector<float> Flat(const nlohmann::json& rows) {
  std::vector<float> out;
  for (const nlohmann::json& r : rows)
    for (const nlohmann::json& v : r) out.push_back(v.get<float>());
  return out;
}

// Loss, d loss / d logp and the metrics of every loss type, on- and off-policy, with and without
// the KL term and its bias correction: float32 in TRL, double here (1e-5 relative).
TEST(GrpoGolden, LossGradientAndMetricsOfEveryLossTypeEqualTrl) {
  const nlohmann::json g = Golden();
  ASSERT_GE(g["losses"].size(), 20u);
  for (const nlohmann::json& c : g["losses"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    GrpoOptions o;
    o.loss_type = c["loss_type"].get<std::string>();
    o.beta = c["beta"].get<double>();
    o.epsilon = c["epsilon"].get<double>();
    o.epsilon_high = c["epsilon_high"].is_null() ? -1 : c["epsilon_high"].get<double>();
    o.max_completion_length = c["max_completion_length"].get<int64_t>();
    o.kl_bias_correction = c["use_bias_correction_kl"].get<bool>();
    const std::vector<float> logp = Flat(c["per_token_logps"]);
    const std::vector<float> old =
        c["old_per_token_logps"].is_null() ? std::vector<float>{} : Flat(c["old_per_token_logps"]);
    const std::vector<float> ref =
        c["ref_per_token_logps"].is_null() ? std::vector<float>{} : Flat(c["ref_per_token_logps"]);
    std::vector<uint8_t> mask;
    for (float v : Flat(c["completion_mask"])) mask.push_back(v != 0);
    const std::vector<double> adv = c["advantages"].get<std::vector<double>>();
    GrpoTokens t;
    t.B = static_cast<int64_t>(adv.size());
    t.T = static_cast<int64_t>(logp.size()) / t.B;
    t.logp = logp.data();
    t.old_logp = old.empty() ? nullptr : old.data();
    t.ref_logp = ref.empty() ? nullptr : ref.data();
    t.mask = mask.data();
    t.advantages = adv.data();
    GrpoNorm norm;
    norm.global_tokens = c["num_items_in_batch"].get<double>();
    std::vector<double> sums(GrpoLossMetricNames().size(), 0.0);
    std::vector<float> weights(logp.size(), 7.0f);
    GrpoClipExtremes extremes;
    GrpoTokenLoss(o, t, norm, sums, weights.data(), &extremes);
    const double want = c["loss"].get<double>();
    EXPECT_NEAR(sums[0], want, 1e-5 * std::max(1.0, std::abs(want)));
    const std::vector<float> grad = Flat(c["grad"]);
    for (size_t i = 0; i < grad.size(); ++i)
      EXPECT_NEAR(-weights[i], grad[i], 1e-5 * std::max(1.0f, std::abs(grad[i]))) << "token " << i;
    // Every metric TRL logs from _compute_loss (entropy aside: its goldens inject none), the
    // clip extremes of the one micro-batch of one process included.
    int found = 0;
    for (const auto& [name, value] : FinishGrpoMetrics(o, sums, {extremes})) {
      ++found;
      ASSERT_TRUE(c["metrics"].contains(name)) << name;
      ExpectNear(value, c["metrics"][name], 1e-5, name);
    }
    EXPECT_EQ(found, static_cast<int>(c["metrics"].size())) << c["metrics"].dump();
  }
}

// gemma4-tiny's seeded initialisation, held for decoding (fp32).
struct TinyModel {
  Gemma4Config config = PresetConfig("gemma4-tiny").value();
  ParamRegistry registry = BuildParamRegistry(config);
  std::vector<float> params = Init(config, registry);
  ArenaWeights source{registry, params.data()};
  DecodeWeights weights{registry, source};
  static std::vector<float> Init(const Gemma4Config& c, const ParamRegistry& reg) {
    std::vector<float> p(static_cast<size_t>(reg.layout.total()));
    InitParams(c, reg, p.data(), 5);
    return p;
  }
};

// Greedy rollouts: each prompt's G completions are the sequence decoded alone (all equal, as
// greedy is deterministic), a stop token ends one (kept), the length limit truncates the others.
TEST(Rollout, GreedyGroupsEqualEachPromptDecodedAloneAndStopsAsTrlMarks) {
  const TinyModel m;
  const Gemma4Config& c = m.config;
  const ParamRegistry& reg = m.registry;
  const DecodeWeights& weights = m.weights;
  const std::vector<std::vector<int32_t>> prompts = {{2, 17, 99, 4}, {2, 5}, {2, 300, 301, 302, 9}};
  RolloutOptions o;
  o.num_generations = 3;
  o.max_completion_length = 12;
  // Three prompts of three in a decoder of 6: two waves.
  Gemma4Decoder dec(c, reg, weights, 32, 8, Precision::kFp32, 6);
  StatusOr<std::vector<Completion>> got = SampleCompletions(dec, prompts, o);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 9u);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    Gemma4Decoder one(c, reg, weights, 32, 8);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    ASSERT_TRUE(one.Append(p, logits.data()).ok());
    std::vector<int32_t> ids;
    for (int i = 0; i < 12; ++i) {
      ids.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 < 12) {
        ASSERT_TRUE(one.Append({&ids.back(), 1}, logits.data()).ok());
      }
    }
    alone.push_back(ids);
  }
  for (size_t i = 0; i < got->size(); ++i) {
    const Completion& k = (*got)[i];
    EXPECT_EQ(k.prompt, static_cast<int64_t>(i / 3));
    EXPECT_EQ(k.ids, alone[i / 3]) << "completion " << i;
    EXPECT_TRUE(k.truncated);
  }
  // The fifth token of prompt 1's greedy completion as a stop token: those completions end there.
  o.stops = {alone[1][4]};
  dec.Reset();
  got = SampleCompletions(dec, prompts, o);
  ASSERT_TRUE(got.ok());
  for (int g = 0; g < 3; ++g) {
    const Completion& k = (*got)[3 + static_cast<size_t>(g)];
    const auto first = std::find(alone[1].begin(), alone[1].end(), alone[1][4]);
    EXPECT_EQ(k.ids, std::vector<int32_t>(alone[1].begin(), first + 1));
    EXPECT_FALSE(k.truncated);
  }
}

// Multi-turn rollouts: a model turn that ends at a stop token is answered by the environment's
// tokens (fed to that sequence alone, marked as not sampled), then the model's next turn is what
// decoding the whole sequence alone gives; --max-turns bounds the turns, an episode the
// environment ends stops there, and a turn that does not fit truncates the completion.
TEST(Rollout, EnvironmentTurnsAreFedAndTheModelAnswersAgain) {
  const TinyModel m;
  const Gemma4Config& c = m.config;
  const ParamRegistry& reg = m.registry;
  const DecodeWeights& weights = m.weights;
  auto greedy_alone = [&](const std::vector<int32_t>& ids, int n) {
    Gemma4Decoder one(c, reg, weights, 64, 8);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    EXPECT_TRUE(one.Append(ids, logits.data()).ok());
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 < n) {
        EXPECT_TRUE(one.Append({&out.back(), 1}, logits.data()).ok());
      }
    }
    return out;
  };
  const std::vector<int32_t> prompt = {2, 17, 99, 4};
  const std::vector<int32_t> first = greedy_alone(prompt, 3);
  RolloutOptions o;
  o.num_generations = 2;
  o.max_completion_length = 20;
  o.max_turns = 3;
  o.stops = {first[2]};  // the first turn ends at its third token
  const std::vector<int32_t> env = {5, 6, 7};
  int calls = 0;
  const NextTurnFn next = [&](const std::vector<size_t>& ended, const std::vector<Completion>& all)
      -> StatusOr<std::vector<std::optional<std::vector<int32_t>>>> {
    ++calls;
    std::vector<std::optional<std::vector<int32_t>>> out;
    for (size_t i : ended) {
      // Completion 0 gets a turn after each of its model turns; completion 1 ends at once.
      if (i == 0)
        out.push_back(env);
      else
        out.emplace_back();
      EXPECT_EQ(all[i].ids.back(), first[2]);
    }
    return out;
  };
  Gemma4Decoder dec(c, reg, weights, 64, 8, Precision::kFp32, 2);
  StatusOr<std::vector<Completion>> got = SampleCompletions(dec, {prompt}, o, next);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const Completion& a = (*got)[0];
  const Completion& b = (*got)[1];
  EXPECT_GE(calls, 1);
  // Completion 1: one turn, ended by the environment.
  EXPECT_EQ(b.ids, first);
  EXPECT_EQ(b.turns, 1);
  EXPECT_FALSE(b.truncated);
  // Completion 0: turn 1, the environment's tokens, turn 2 (decoded as the whole sequence alone
  // would be), and so on up to 3 model turns or 20 tokens.
  ASSERT_GE(a.ids.size(), first.size() + env.size() + 1);
  EXPECT_EQ(std::vector<int32_t>(a.ids.begin(), a.ids.begin() + 3), first);
  EXPECT_EQ(std::vector<int32_t>(a.ids.begin() + 3, a.ids.begin() + 6), env);
  EXPECT_EQ(std::vector<uint8_t>(a.sampled.begin(), a.sampled.begin() + 6),
            (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.ids.begin(), a.ids.begin() + 6);
  const size_t rest = std::min<size_t>(a.ids.size() - 6, 4);
  const std::vector<int32_t> second = greedy_alone(seq, static_cast<int>(rest));
  EXPECT_EQ(std::vector<int32_t>(a.ids.begin() + 6, a.ids.begin() + 6 + static_cast<int64_t>(rest)),
            second);
  EXPECT_GE(a.turns, 2);
  EXPECT_LE(a.turns, 3);
  EXPECT_EQ(a.sampled.size(), a.ids.size());
  // One model turn allowed: the environment is never asked.
  calls = 0;
  o.max_turns = 1;
  got = SampleCompletions(dec, {prompt}, o, next);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ((*got)[0].ids, first);
  // A turn that does not fit: the completion is truncated after the model's turn.
  o.max_turns = 3;
  o.max_completion_length = 6;
  got = SampleCompletions(dec, {prompt}, o, next);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].ids, first);
  EXPECT_TRUE((*got)[0].truncated);
}

// Sampled groups differ within a group (temperature 1), are reproduced by the same seed and
// changed by another.
TEST(Rollout, SampledGroupsFollowTheSeed) {
  const TinyModel m;
  const Gemma4Config& c = m.config;
  const ParamRegistry& reg = m.registry;
  const DecodeWeights& weights = m.weights;
  const std::vector<std::vector<int32_t>> prompts = {{2, 17, 99, 4}, {2, 5}};
  RolloutOptions o;
  o.num_generations = 4;
  o.max_completion_length = 10;
  o.sampling.temperature = 1.0;
  o.sampling.seed = 7;
  Gemma4Decoder dec(c, reg, weights, 32, 8, Precision::kFp32, 8);
  StatusOr<std::vector<Completion>> a = SampleCompletions(dec, prompts, o);
  StatusOr<std::vector<Completion>> b = SampleCompletions(dec, prompts, o);
  o.sampling.seed = 8;
  StatusOr<std::vector<Completion>> d = SampleCompletions(dec, prompts, o);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  int same_in_group = 0, same_other_seed = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].ids, (*b)[i].ids);
    same_other_seed += (*a)[i].ids == (*d)[i].ids;
    if (i % 4) same_in_group += (*a)[i].ids == (*a)[i - 1].ids;
  }
  EXPECT_LT(same_in_group, 6);
  EXPECT_LT(same_other_seed, 8);
}

// 32 text prompts with an "answer" column (what a reward may read).
std::string WritePrompts(const std::string& dir) {
  const std::string path = dir + "/prompts.jsonl";
  std::ofstream f(path);
  const char* words[] = {"one", "two", "three", "four", "five", "six", "seven", "eight"};
  for (int i = 0; i < 32; ++i) {
    nlohmann::json j;
    j["prompt"] = std::string("Count: ") + words[i % 8] + " " + words[(i * 3) % 8] + " " +
                  words[(i * 5 + 1) % 8];
    j["answer"] = std::to_string(i);
    f << j.dump() << "\n";
  }
  return path;
}

// A reward program in /bin/sh (no interpreter needed; it answers each line at once): the share
// of the completion's token ids below 1000, which a random model's sampling can be taught.
std::string WriteReward(const std::string& dir) {
  const std::string path = dir + "/reward.sh";
  std::ofstream f(path);
  f << "#!/bin/sh\n"
       "while IFS= read -r line; do\n"
       "  ids=${line#*\\\"completion_ids\\\":\\[}; ids=${ids%%]*}; n=0; c=0\n"
       "  IFS=,; for i in $ids; do n=$((n + 1)); [ \"$i\" -lt 1000 ] && c=$((c + 1)); done; unset "
       "IFS\n"
       "  echo \"$c $n\" | awk '{ printf \"%.6f\\n\", $1 / $2 }'\n"
       "done\n";
  f.close();
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

std::string Job(const std::string& dir, int batch = 8) {
  return std::string(ST_BINARY) + " finetune --data-dir " ST_SOURCE_DIR "/data --dataset " +
         WritePrompts(dir) + " --objective grpo --num-generations 4 --batch-size-per-device " +
         std::to_string(batch) + " " +
         "--max-completion-length 12 --max-seq-len 32 --storage-path " + dir +
         " --no-dashboard --progress lines";
}

// The issue's "done when": a learnable reward's mean rises over a short run on two workers, and
// the step records carry TRL's metric names.
TEST(Grpo, ToyTaskLearnsTheRewardOnTwoWorkers) {
  const std::string dir = test::TempDir("grpo");
  ASSERT_FALSE(dir.empty());
  const test::Ran r = test::RunCommand(Job(dir) + " --reward-command " + WriteReward(dir) +
                                       " --lr 1e-2 --num-epochs 4 --topology 2 --run-name learn"
                                       " --log-completions 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Starting slicetrain FSDP GRPO job"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Objective: grpo (dapo, beta 0, 4 completions"), std::string::npos) << r.out;
  const auto steps = test::MetricsRecords(dir + "/learn", "step");
  ASSERT_EQ(steps.size(), 32u);  // 32 prompts, 2 a micro-batch on each of 2 workers, 4 epochs
  for (const char* k : {"reward", "reward_std", "frac_reward_zero_std", "rewards/reward.sh/mean",
                        "completions/mean_length", "completions/clipped_ratio", "entropy",
                        "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max"})
    EXPECT_TRUE(steps[0].contains(k)) << k << " in " << steps[0].dump();
  // --log-completions 2: two of rank 0's completions with their rewards on every step (each
  // step starts a round here), printed too.
  ASSERT_TRUE(steps[0].contains("completions")) << steps[0].dump();
  ASSERT_EQ(steps[0]["completions"].size(), 2u);
  const nlohmann::json& c0 = steps[0]["completions"][0];
  EXPECT_TRUE(c0["prompt"].is_string() && c0["completion"].is_string()) << c0.dump();
  EXPECT_TRUE(c0["rewards"].contains("reward.sh")) << c0.dump();
  EXPECT_NE(r.out.find("  completion | reward "), std::string::npos) << r.out;
  double first = 0, last = 0;
  for (size_t i = 0; i < 4; ++i) {
    first += steps[i]["reward"].get<double>() / 4;
    last += steps[steps.size() - 1 - i]["reward"].get<double>() / 4;
  }
  EXPECT_GT(last, first + 0.3) << "mean reward of the first 4 steps " << first << ", last 4 "
                               << last;
}

// Rounds that serve two optimizer steps (--num-iterations 2: the ratio to the round's log-probs
// moves and clipping acts), a KL term to the base (LoRA, adapters off) and LoRA dropout; killed
// in the middle of a round after a step checkpoint in epoch 2 and resumed: the same adapter as
// the uninterrupted run (each round's sampler is seeded by the step it starts at, and
// checkpoints fall between rounds).
TEST(Grpo, KilledInTheMiddleOfARoundResumesExactly) {
  const std::string dir = test::TempDir("grpo_resume");
  ASSERT_FALSE(dir.empty());
  const std::vector<std::string> base = {ST_BINARY,
                                         "finetune",
                                         "--data-dir",
                                         ST_SOURCE_DIR "/data",
                                         "--dataset",
                                         WritePrompts(dir),
                                         "--dataset-split",
                                         "train[:16]",
                                         "--objective",
                                         "grpo",
                                         "--reward-command",
                                         WriteReward(dir),
                                         "--num-generations",
                                         "4",
                                         "--batch-size-per-device",
                                         "8",
                                         "--max-completion-length",
                                         "10",
                                         "--max-seq-len",
                                         "32",
                                         "--num-iterations",
                                         "2",
                                         "--beta",
                                         "0.04",
                                         "--epsilon-high",
                                         "0.28",
                                         "--lora-rank",
                                         "4",
                                         "--lora-dropout",
                                         "0.1",
                                         "--lr",
                                         "2e-2",
                                         "--no-dashboard",
                                         "--progress",
                                         "off",
                                         "--storage-path",
                                         dir,
                                         "--topology",
                                         "2",
                                         "--num-epochs",
                                         "2",
                                         "--save-steps",
                                         "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = base;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  testing::Proc full(with({"--run-name", "full"}));
  ASSERT_EQ(full.Wait(std::chrono::seconds(300)), 0) << full.output();
  // 16 prompts, 2 a worker: 4 rounds of 2 steps an epoch.
  const auto steps = test::MetricsRecords(dir + "/full", "step");
  ASSERT_EQ(steps.size(), 16u);
  double clipped = 0;
  for (const auto& s : steps) {
    EXPECT_TRUE(s.contains("kl")) << s.dump();
    clipped += s["clip_ratio/region_mean"].get<double>();
  }
  EXPECT_GT(clipped, 0.0) << "the second step of a round moves the ratio past the clip range";
  // The first step of a round is on-policy (ratio 1): nothing is clipped there.
  EXPECT_EQ(steps[0]["clip_ratio/region_mean"].get<double>(), 0.0);
  testing::Proc part(with({"--run-name", "part"}));
  ASSERT_TRUE(part.ReadUntil(
      [](const std::string& o) { return o.find("(epoch 2, step 4 of 8)") != std::string::npos; },
      std::chrono::seconds(300)))
      << part.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into the next round
  ASSERT_EQ(kill(part.pid(), SIGKILL), 0);
  part.Wait(std::chrono::seconds(30));
  testing::Proc rest(with({"--run-name", "part", "--resume"}));
  ASSERT_EQ(rest.Wait(std::chrono::seconds(300)), 0) << rest.output();
  const std::string a = test::NewestCheckpoint(dir + "/full"),
                    b = test::NewestCheckpoint(dir + "/part");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_TRUE(test::ReadFile(a + "/adapter_model.safetensors") ==
              test::ReadFile(b + "/adapter_model.safetensors"))
      << "the resumed run's adapter differs from the uninterrupted run's";
}

// Full fine-tuning with a KL term: the reference is the model the run started from, kept as a
// copy of each worker's shard. The first step is on-policy against it (KL 0 to the bit: the same
// weights, batch and kernels); later steps move away; a run stopped after epoch 1 and resumed
// has the same KL on every step of epoch 2 and the same final weights as the uninterrupted run,
// so the reference after a resume is the starting model, not the checkpoint it resumed from.
TEST(Grpo, FullFineTuningKlIsToTheStartingWeights) {
  const std::string dir = test::TempDir("grpo_full_kl");
  ASSERT_FALSE(dir.empty());
  const std::string job = Job(dir) + " --reward-command " + WriteReward(dir) +
                          " --dataset-split train[:16] --beta 0.04 --lr 1e-2 --topology 2";
  test::Ran r = test::RunCommand(job + " --num-epochs 2 --run-name whole");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("beta 0.04; reference: the initial weights"), std::string::npos) << r.out;
  const auto whole = test::MetricsRecords(dir + "/whole", "step");
  ASSERT_EQ(whole.size(), 8u);  // 16 prompts, 2 a worker a step on 2 workers, 2 epochs
  EXPECT_EQ(whole[0]["kl"].get<double>(), 0.0) << whole[0].dump();
  for (size_t i = 1; i < whole.size(); ++i)
    EXPECT_GT(whole[i]["kl"].get<double>(), 0.0) << "step " << i + 1 << ": " << whole[i].dump();
  r = test::RunCommand(job + " --num-epochs 1 --run-name part");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::RunCommand(job + " --num-epochs 2 --run-name part --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto part = test::MetricsRecords(dir + "/part", "step");
  ASSERT_EQ(part.size(), 8u) << "epoch 1's steps, then the resumed run's";
  for (size_t i = 4; i < 8; ++i)
    EXPECT_EQ(part[i]["kl"].get<double>(), whole[i]["kl"].get<double>()) << "step " << i + 1;
  const std::string a = test::NewestCheckpoint(dir + "/whole"),
                    b = test::NewestCheckpoint(dir + "/part");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_TRUE(test::ReadFile(a + "/model.safetensors") == test::ReadFile(b + "/model.safetensors"))
      << "the resumed run's weights differ from the uninterrupted run's";
}

// The value of a --dry-run plan row ("  <what>   <MiB> MiB"), -1 if absent.
double PlanRowMiB(const std::string& out, const std::string& what) {
  const size_t at = out.find("  " + what + " ");
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(out.find_first_of("0123456789", at + 2 + what.size())));
}

// The memory plan counts the reference shard where one is kept (full fine-tuning with a KL
// term), as many bytes as the parameters' shard, and not where the base is the reference.
TEST(Grpo, DryRunCountsTheReferenceShard) {
  const std::string dir = test::TempDir("grpo_plan");
  ASSERT_FALSE(dir.empty());
  const std::string job = Job(dir) + " --reward exact:answer --topology 2 --dry-run";
  const test::Ran full = test::RunCommand(job + " --beta 0.04");
  ASSERT_EQ(full.code, 0) << full.out;
  const double params = PlanRowMiB(full.out, "parameters (fp32 shard)"),
               reference = PlanRowMiB(full.out, "GRPO reference (fp32 shard)");
  EXPECT_GT(params, 0) << full.out;
  EXPECT_EQ(reference, params) << full.out;
  const test::Ran none = test::RunCommand(job + " --beta 0");
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_EQ(PlanRowMiB(none.out, "GRPO reference (fp32 shard)"), -1) << none.out;
  EXPECT_NEAR(PlanRowMiB(full.out, "total") - PlanRowMiB(none.out, "total"), reference, 0.2);
  const test::Ran lora = test::RunCommand(job + " --beta 0.04 --lora-rank 4");
  ASSERT_EQ(lora.code, 0) << lora.out;
  EXPECT_EQ(PlanRowMiB(lora.out, "GRPO reference (fp32 shard)"), -1) << lora.out;
}

// Multi-turn end to end: a tiny model fine-tuned (SFT, gemma-chat) until it ends its turns,
// then GRPO with an environment program that answers each first model turn with "Again?" and
// ends the episode after the second: the logged completions are episodes of
// assistant / user / assistant turns, and an environment that prints garbage stops the run with
// one line naming it.
TEST(Grpo, EnvironmentEpisodesAlternateTurns) {
  const std::string dir = test::TempDir("grpo_env");
  ASSERT_FALSE(dir.empty());
  test::Ran r = test::RunCommand(std::string(ST_BINARY) +
                                 " finetune --data-dir " ST_SOURCE_DIR
                                 "/data --template gemma-chat --num-epochs 4 --topology 1 "
                                 "--max-seq-len 64 --no-dashboard --progress off --storage-path " +
                                 dir + " --run-name sft");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string model = test::NewestCheckpoint(dir + "/sft");
  ASSERT_FALSE(model.empty());
  {
    std::ofstream f(dir + "/conv.jsonl");
    for (int i = 0; i < 8; ++i)
      f << nlohmann::json({{"prompt", nlohmann::json::array(
                                          {{{"role", "user"},
                                            {"content", "Name a color " + std::to_string(i)}}})}})
               .dump()
        << "\n";
    std::ofstream e(dir + "/env.sh");
    e << "#!/bin/sh\n"
         "while IFS= read -r line; do\n"
         "  case \"$line\" in\n"
         "    *'\"turn\":1,'*|*'\"turn\":1}'*) echo '{\"role\": \"user\", \"content\": "
         "\"Again?\"}' ;;\n"
         "    *) echo null ;;\n"
         "  esac\n"
         "done\n";
  }
  const std::string job = std::string(ST_BINARY) +
                          " finetune --data-dir " ST_SOURCE_DIR "/data --model-id " + model +
                          " --dataset " + dir +
                          "/conv.jsonl --objective grpo --reward overlong:40:20 "
                          "--num-generations 2 --batch-size-per-device 4 "
                          "--max-completion-length 40 --max-seq-len 48 --num-epochs 1 "
                          "--topology 1 --lr 1e-5 --log-completions 4 --no-dashboard "
                          "--progress off --storage-path " +
                          dir;
  r = test::RunCommand(job + " --environment-command 'sh " + dir + "/env.sh' --run-name env");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto steps = test::MetricsRecords(dir + "/env", "step");
  ASSERT_FALSE(steps.empty());
  int episodes = 0;
  for (const auto& s : steps)
    for (const auto& c : s["completions"]) {
      const nlohmann::json& turns = c["completion"];
      ASSERT_TRUE(turns.is_array()) << c.dump();
      ASSERT_FALSE(turns.empty());
      EXPECT_EQ(turns[0]["role"], "assistant") << c.dump();
      if (turns.size() >= 3) {
        EXPECT_EQ(turns[1]["role"], "user");
        EXPECT_EQ(turns[1]["content"], "Again?");
        EXPECT_EQ(turns[2]["role"], "assistant");
        EXPECT_LE(turns.size(), 3u) << "the environment ends the episode after turn 2";
        ++episodes;
      }
    }
  EXPECT_GT(episodes, 0) << "no completion ended its first turn within 40 tokens";
  r = test::RunCommand(job + " --environment-command 'echo maybe; cat >/dev/null' --run-name bad");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("environment command 'echo maybe; cat >/dev/null' answered line 1"),
            std::string::npos)
      << r.out;
}

// A reward program that writes something that is not a number stops the run with one line
// naming it; so does a flag combination GRPO cannot run.
TEST(Grpo, BadRewardsAndFlagsAreOneLine) {
  const std::string dir = test::TempDir("grpo_bad");
  ASSERT_FALSE(dir.empty());
  test::Ran r = test::RunCommand(Job(dir) +
                                 " --reward-command 'echo oops; cat >/dev/null' "
                                 "--num-epochs 1 --topology 1 --run-name bad");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("not a number"), std::string::npos) << r.out;
  r = test::RunCommand(Job(dir) + " --num-epochs 1 --topology 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("needs a reward"), std::string::npos) << r.out;
  r = test::RunCommand(Job(dir, 6) + " --reward exact:answer");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("not a multiple of --num-generations"), std::string::npos) << r.out;
}

// ------------------------------------------------------------------ tool calls in episodes

std::vector<int32_t> Ids(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

std::vector<ChatMessage> Turns(const nlohmann::json& messages) {
  std::vector<ChatMessage> out;
  for (const nlohmann::json& m : messages) out.push_back({m["role"], m["content"]});
  return out;
}

// The golden file, its tokenizer and the gemma-chat renderer over it.
struct ToolFixture {
  nlohmann::json golden;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ExampleRenderer> renderer;
};
ToolFixture LoadToolFixture() {
  ToolFixture f;
  std::ifstream in(ST_FIXTURE_DIR "/tool_turns/golden.json");
  f.golden = nlohmann::json::parse(in);
  StatusOr<Tokenizer> tok = Tokenizer::Load(ST_FIXTURE_DIR "/tool_turns");
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return f;
  f.tok = std::make_unique<Tokenizer>(*std::move(tok));
  StatusOr<ExampleRenderer> r =
      ExampleRenderer::Create(*f.tok, TemplateKind::kGemmaChat, TrainOn::kAll);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) f.renderer = std::make_unique<ExampleRenderer>(*std::move(r));
  return f;
}

TEST(ToolTurns, CallsParseAsTrlParsesThem) {
  const ToolFixture fx = LoadToolFixture();
  ASSERT_TRUE(fx.tok);
  const nlohmann::json& golden = fx.golden;
  const Tokenizer* tok = fx.tok.get();
  const std::optional<ToolCallFormat> f = ToolCallFormat::Of(*tok);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->response_open(), *tok->TokenToId("<|tool_response>"));
  for (const nlohmann::json& c : golden["cases"]) {
    const std::vector<int32_t> call = Ids(c["call_ids"]);
    EXPECT_EQ(f->AssistantMessage(call), c["parsed"]) << c["calls"].dump();
    // Text before the call stays the message's content; a malformed call makes the turn text.
    std::vector<int32_t> with_text = tok->Encode("Let me check.", false);
    with_text.insert(with_text.end(), call.begin(), call.end());
    nlohmann::json m = f->AssistantMessage(with_text);
    EXPECT_EQ(m["content"], "Let me check.");
    EXPECT_EQ(m["tool_calls"], c["parsed"]["tool_calls"]);
  }
  std::vector<int32_t> broken = {*tok->TokenToId("<|tool_call>")};
  for (int32_t id : tok->Encode("call:f{x:", false)) broken.push_back(id);
  broken.push_back(*tok->TokenToId("<tool_call|>"));
  const nlohmann::json m = f->AssistantMessage(broken);
  EXPECT_FALSE(m.contains("tool_calls")) << m.dump();
  EXPECT_EQ(m["content"], "call:f{x:");
  // The syntax itself: nesting, escaped keys, numbers as JSON reads them, and its errors.
  StatusOr<nlohmann::json> p =
      ParseToolCall("call:f{<|\"|>a b<|\"|>:[1,-2.5e3,{k:null}],c:<|\"|>x,y}<|\"|>}");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ((*p)["function"]["arguments"],
            nlohmann::json::parse(R"({"a b": [1, -2500.0, {"k": null}], "c": "x,y}"})"));
  for (const char* bad : {"f{}", "call:{}", "call:f", "call:f{a:1", "call:f{a:01x}",
                          "call:f{a:<|\"|>open}", "call:f{a:1}}", "call:f{:1}"}) {
    StatusOr<nlohmann::json> b = ParseToolCall(bad);
    EXPECT_FALSE(b.ok()) << bad << " parsed as " << (b.ok() ? b->dump() : "");
  }
}

TEST(ToolTurns, ResultsAndUserTurnsRenderAsTheTemplate) {
  const ToolFixture fx = LoadToolFixture();
  ASSERT_TRUE(fx.renderer);
  const nlohmann::json& golden = fx.golden;
  const Tokenizer* tok = fx.tok.get();
  const ExampleRenderer* renderer = fx.renderer.get();
  const std::string dir = test::TempDir("tool_turns");
  ASSERT_FALSE(dir.empty());
  // An environment that records what it is given and answers the lines of answers.txt in turn.
  const std::string seen = dir + "/seen.jsonl", answers = dir + "/answers.txt";
  const std::string command = "exec 3<" + answers +
                              "; while IFS= read -r line; do printf '%s\\n' \"$line\" >> " + seen +
                              "; IFS= read -r a <&3; printf '%s\\n' \"$a\"; done";
  int k = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    SCOPED_TRACE("case " + std::to_string(k++));
    const std::vector<ChatMessage> prompt = Turns(c["messages"]);
    std::vector<int32_t> prompt_ids;
    ASSERT_TRUE(renderer->RenderPrompt(prompt, true, &prompt_ids).ok());
    EXPECT_EQ(prompt_ids, Ids(c["prompt_ids"]));
    // The results as the golden gives them, without their names (each takes its call's), and as
    // JSON values where the golden's text is a value's compact JSON; then a user turn.
    nlohmann::json results = c["results"], nameless = nlohmann::json::array();
    for (nlohmann::json& r : results) {
      r.erase("tool_call_id");
      nlohmann::json n = r;
      n.erase("name");
      if (n["content"].is_string()) {
        const nlohmann::json v =
            nlohmann::json::parse(n["content"].get<std::string>(), nullptr, false);
        if (v.is_object()) n["content"] = v;
      }
      nameless.push_back(n);
    }
    {
      std::ofstream a(answers);
      a << results.dump() << "\n"
        << (nameless.size() == 1 ? nameless[0] : nameless).dump() << "\n"
        << R"({"role": "user", "content": "Never mind, thanks."})"
        << "\n";
    }
    std::filesystem::remove(seen);
    StatusOr<std::unique_ptr<Environment>> env =
        MakeCommandEnvironment(command, 30, *renderer, *tok);
    ASSERT_TRUE(env.ok()) << env.status().message();
    const std::vector<int32_t> call = Ids(c["call_ids"]);
    const nlohmann::json row = {{"prompt", c["messages"]}, {"answer", c["answer"]}};
    for (int round = 0; round < 3; ++round) {
      nlohmann::json episode = nlohmann::json::array();
      StatusOr<std::vector<std::optional<std::vector<int32_t>>>> next =
          (*env)->Next({{call, row, 1, &episode}});
      ASSERT_TRUE(next.ok()) << next.status().message();
      ASSERT_EQ(next->size(), 1u);
      ASSERT_TRUE((*next)[0].has_value());
      EXPECT_EQ(*(*next)[0], Ids(round < 2 ? c["result_ids"] : c["user_ids"])) << round;
      ASSERT_GE(episode.size(), 2u);
      EXPECT_EQ(episode[0], c["parsed"]);
      if (round < 2)
        for (size_t i = 0; i < results.size(); ++i) {
          EXPECT_EQ(episode[i + 1]["role"], "tool");
          EXPECT_EQ(episode[i + 1]["name"], c["results"][i]["name"]);
        }
    }
    // The program saw the row's columns, the parsed call and the turn number.
    const std::vector<nlohmann::json> states = [&] {
      std::vector<nlohmann::json> v;
      std::ifstream s(seen);
      for (std::string line; std::getline(s, line);) v.push_back(nlohmann::json::parse(line));
      return v;
    }();
    ASSERT_EQ(states.size(), 3u);
    EXPECT_EQ(states[0]["answer"], c["answer"]);
    EXPECT_EQ(states[0]["turn"], 1);
    EXPECT_EQ(states[0]["messages"], nlohmann::json::array({c["parsed"]}));
    EXPECT_EQ(states[0]["completion"], "");
    // The model's answer after the results closes its turn as the whole conversation renders.
    std::vector<int32_t> whole = prompt_ids;
    for (const auto* part : {"call_ids", "result_ids", "answer_ids"})
      for (int32_t id : Ids(c[part])) whole.push_back(id);
    std::vector<int32_t> answer = tok->Encode(c["answer"].get<std::string>(), false);
    answer.push_back(*tok->TokenToId("<turn|>"));
    EXPECT_EQ(std::vector<int32_t>(whole.end() - static_cast<int64_t>(answer.size()) - 1,
                                   whole.end() - 1),
              answer);
  }
  // Tool results to a turn that ended at <turn|> (no call): one line naming the program.
  {
    std::ofstream a(answers);
    a << R"({"role": "tool", "name": "f", "content": "1"})"
      << "\n";
  }
  StatusOr<std::unique_ptr<Environment>> env = MakeCommandEnvironment(command, 30, *renderer, *tok);
  ASSERT_TRUE(env.ok());
  std::vector<int32_t> plain = tok->Encode("Blue.", false);
  plain.push_back(*tok->TokenToId("<turn|>"));
  nlohmann::json episode = nlohmann::json::array();
  auto next = (*env)->Next({{plain, nlohmann::json::object(), 1, &episode}});
  ASSERT_FALSE(next.ok());
  EXPECT_NE(next.status().message().find("environment command 'exec 3<"), std::string::npos);
  EXPECT_NE(next.status().message().find("called no tool"), std::string::npos)
      << next.status().message();
  // Malformed tool results are refused as the line arrives.
  for (const char* bad :
       {R"([])", R"([{"role": "user", "content": "x"}])",
        R"({"role": "tool", "name": 3, "content": "1"})", R"({"role": "tool", "name": "f"})",
        R"({"role": "system", "content": "x"})"}) {
    {
      std::ofstream a(answers);
      a << bad << "\n";
    }
    env = MakeCommandEnvironment(command, 30, *renderer, *tok);
    ASSERT_TRUE(env.ok());
    episode = nlohmann::json::array();
    next = (*env)->Next(
        {{Ids(golden["cases"][0]["call_ids"]), nlohmann::json::object(), 1, &episode}});
    ASSERT_FALSE(next.ok()) << bad;
    EXPECT_NE(next.status().message().find("answered line 1 (completion 0)"), std::string::npos)
        << next.status().message();
  }
}

TEST(ToolTurns, DeclarationsRenderAsTheTemplate) {
  const ToolFixture fx = LoadToolFixture();
  ASSERT_TRUE(fx.renderer);
  const nlohmann::json& golden = fx.golden;
  const Tokenizer* tok = fx.tok.get();
  const ExampleRenderer* renderer = fx.renderer.get();
  ASSERT_FALSE(golden["declarations"].empty());
  for (const nlohmann::json& c : golden["declarations"]) {
    const std::vector<ChatMessage> messages = Turns(c["messages"]);
    StatusOr<std::string> text = ToolDeclarations(c["tools"]);
    ASSERT_TRUE(text.ok()) << text.status().message();
    std::vector<int32_t> ids;
    ASSERT_TRUE(renderer->RenderConversation(messages, true, &ids, *text).ok());
    EXPECT_EQ(ids, Ids(c["ids"])) << c["tools"].dump() << "\n" << tok->Decode(ids);
    // Through the prompt set: the row's `tools` column (a list, or its JSON text as datasets
    // keeps it), else the run's --tools.
    for (int how = 0; how < 3; ++how) {
      PromptSet set(4096);
      InstructionRecord r;
      r.conversational = true;
      r.prompt_turns = messages;
      r.columns = {{"prompt", c["messages"]}};
      if (how == 0) r.columns["tools"] = c["tools"];
      if (how == 1) r.columns["tools"] = c["tools"].dump();
      if (how == 2) set.tools = c["tools"];
      ASSERT_TRUE(set.Add(r, *tok, renderer).ok());
      ASSERT_EQ(set.size(), 1);
      const int32_t* p = set.prompts.ids.data() + set.prompts.offsets[0];
      EXPECT_EQ(std::vector<int32_t>(p, p + set.prompts.length(0)), Ids(c["ids"])) << how;
    }
  }
  // Errors: not a list, a tool without a name, tools on a text prompt.
  EXPECT_FALSE(ToolDeclarations(nlohmann::json::object()).ok());
  StatusOr<std::string> nameless =
      ToolDeclarations(nlohmann::json::parse(R"([{"type": "function", "function": {}}])"));
  ASSERT_FALSE(nameless.ok());
  EXPECT_NE(nameless.status().message().find("tool 1 has no 'function' with a string 'name'"),
            std::string::npos);
  PromptSet set(4096);
  InstructionRecord r;
  r.prompt = "Hello";
  r.columns = {{"prompt", "Hello"}, {"tools", golden["declarations"][0]["tools"]}};
  const Status s = set.Add(r, *tok, renderer);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a text prompt cannot declare tools"), std::string::npos);
  r.columns["tools"] = "not json";
  EXPECT_NE(set.Add(r, *tok, renderer).message().find("'tools' column"), std::string::npos);
}

// End to end: a tiny model fine-tuned to call a tool (the fixture tokenizer has Gemma 4's tool
// tokens), prompts declaring the tool through --tools, an environment answering the call: the
// episodes are assistant (tool_calls) / tool / assistant, the result named after the call.
TEST(Grpo, EnvironmentAnswersToolCalls) {
  const std::string dir = test::TempDir("grpo_tools");
  ASSERT_FALSE(dir.empty());
  {
    std::ofstream sft(dir + "/sft.jsonl"), prompts(dir + "/prompts.jsonl");
    for (int i = 0; i < 16; ++i) {
      const std::string q = "What time is it in city " + std::to_string(i) + "?";
      sft << nlohmann::json(
                 {{"messages",
                   {{{"role", "user"}, {"content", q}},
                    {{"role", "assistant"},
                     {"content", "<|tool_call>call:get_time{}<tool_call|><|tool_response>"}}}}})
                 .dump()
          << "\n";
      if (i < 8)
        prompts << nlohmann::json({{"prompt", {{{"role", "user"}, {"content", q}}}}}).dump()
                << "\n";
    }
    std::ofstream(dir + "/tools.json")
        << R"([{"type": "function", "function": {"name": "get_time", "description": "Tells the time."}}])";
    // Results to a first turn that called a tool; every other turn ends the episode.
    std::ofstream(dir + "/env.sh") << "while IFS= read -r line; do\n"
                                      "  case \"$line\" in\n"
                                      "    *'\"tool_calls\"'*'\"turn\":1}'*) echo '{\"role\": "
                                      "\"tool\", \"content\": \"12:00\"}' ;;\n"
                                      "    *) echo null ;;\n"
                                      "  esac\n"
                                      "done\n";
  }
  test::Ran r = test::RunCommand(
      std::string(ST_BINARY) +
      " finetune --data-dir " ST_SOURCE_DIR "/data --tokenizer " ST_FIXTURE_DIR
      "/tool_turns --dataset " +
      dir +
      "/sft.jsonl --template gemma-chat --num-epochs 30 --lr 3e-3 --topology 1 --max-seq-len 64 "
      "--no-dashboard --progress off --storage-path " +
      dir + " --run-name sft");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string model = test::NewestCheckpoint(dir + "/sft");
  ASSERT_FALSE(model.empty());
  r = test::RunCommand(std::string(ST_BINARY) +
                       " finetune --data-dir " ST_SOURCE_DIR "/data --model-id " + model +
                       " --dataset " + dir +
                       "/prompts.jsonl --objective grpo --reward overlong:40:20 "
                       "--num-generations 2 --batch-size-per-device 4 --max-completion-length 40 "
                       "--max-seq-len 128 --num-epochs 1 --topology 1 --lr 1e-5 "
                       "--log-completions 8 --no-dashboard --progress off --storage-path " +
                       dir + " --run-name grpo --tools " + dir +
                       "/tools.json --environment-command 'sh " + dir + "/env.sh'");
  ASSERT_EQ(r.code, 0) << r.out;
  int calls = 0;
  for (const auto& s : test::MetricsRecords(dir + "/grpo", "step"))
    for (const auto& c : s["completions"]) {
      const nlohmann::json& turns = c["completion"];
      ASSERT_TRUE(turns.is_array() && !turns.empty()) << c.dump();
      if (!turns[0].contains("tool_calls")) continue;
      ASSERT_EQ(turns.size(), 3u) << c.dump();
      const std::string name = turns[0]["tool_calls"][0]["function"]["name"];
      EXPECT_EQ(turns[1], nlohmann::json({{"role", "tool"}, {"name", name}, {"content", "12:00"}}));
      EXPECT_EQ(turns[2]["role"], "assistant");
      calls += name == "get_time";
    }
  EXPECT_GT(calls, 0) << "no completion called get_time";
}

}  // namespace
}  // namespace st
