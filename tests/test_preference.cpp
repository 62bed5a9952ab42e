// Preference fine-tuning (--objective dpo | orpo): TRL's tokenization and loss goldens
// (tools/make_dpo_fixtures.py, tests/fixtures/dpo/), and the whole job through the binary on the
// bundled tiny model: ln 2 at step 0, learning, workers agreeing, exact resume, bad records.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/preference.h"
#include "data/tokenizer.h"
#include "io/hf_model.h"
#include "io/model_loader.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/gemma4.h"
#include "proc_util.h"
#include "test_util.h"
#include "train/objectives/objective.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using test::NewestCheckpoint;
using test::Ran;
using test::ReadFile;
using test::RelError;
using test::RunCommand;

// Pairs from the bundled instruction set: prompt = the instruction, chosen = its response,
// rejected = another record's response (what a preference set of right and wrong answers is).
std::string WritePairs(const std::string& dir, int n) {
  std::ifstream in(ST_SOURCE_DIR "/data/tiny_instruct/train.jsonl");
  std::vector<nlohmann::json> recs;
  std::string line;
  while (std::getline(in, line) && static_cast<int>(recs.size()) < n + 7)
    recs.push_back(nlohmann::json::parse(line));
  const std::string path = dir + "/pairs.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const nlohmann::json& x = recs[static_cast<size_t>(i)];
    const nlohmann::json& y = recs[static_cast<size_t>((i + 7) % static_cast<int>(recs.size()))];
    out << nlohmann::json{{"prompt",
                           "Instruction: " + x["instruction"].get<std::string>() + "\nResponse: "},
                          {"chosen", x["response"].get<std::string>().substr(0, 160)},
                          {"rejected", y["response"].get<std::string>().substr(0, 160)}}
               .dump()
        << "\n";
  }
  return path;
}

std::string Job(const std::string& dir, const std::string& pairs) {
  return std::string(ST_BINARY) + " finetune --data-dir " ST_SOURCE_DIR "/data --dataset " + pairs +
         " --dataset-split train --max-seq-len 64 --no-dashboard --progress off --storage-path " +
         dir;
}

const std::string kDpoFixture = std::string(ST_FIXTURE_DIR) + "/dpo";

// Every record of the four layouts tokenized as TRL's DPOTrainer did it (tokenized.jsonl), and
// dropped at max_length 64 exactly where TRL drops it.
TEST(PreferenceGolden, TokenizationEqualsTrl) {
  auto tok = Tokenizer::Load(kDpoFixture + "/model");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto chat = ExampleRenderer::Create(*tok, TemplateKind::kGemmaChat, TrainOn::kAll);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  std::map<std::string, std::vector<nlohmann::json>> want;
  {
    std::ifstream in(kDpoFixture + "/tokenized.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      want[j["file"].get<std::string>()].push_back(j);
    }
  }
  ASSERT_EQ(want.size(), 4u);
  // A hub set's Parquet layout (ultrafeedback_binarized's columns: a text prompt beside the
  // conversations, which TRL ignores and re-extracts; score columns) reads as its JSON twin.
  want["implicit_conv.parquet"] = want["implicit_conv.jsonl"];
  int compared = 0, dropped = 0;
  for (const auto& [file, lines] : want) {
    SCOPED_TRACE(file);
    DatasetOptions d;
    d.path = kDpoFixture + "/" + file;
    d.preference = true;
    auto ds = InstructionDataset::Open(d);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    size_t i = 0;
    PreferenceSet set(64);
    DatasetReport report;
    ASSERT_TRUE(ds->ForEach(
                      [&](const InstructionRecord& r) -> Status {
                        PreferenceTokens t;
                        ST_RETURN_IF_ERROR(TokenizePreference(r, *tok, &*chat, &t));
                        const nlohmann::json& w = lines.at(i++);
                        EXPECT_EQ(t.prompt, w["prompt_ids"].get<std::vector<int32_t>>()) << i;
                        EXPECT_EQ(t.chosen, w["chosen_ids"].get<std::vector<int32_t>>()) << i;
                        EXPECT_EQ(t.rejected, w["rejected_ids"].get<std::vector<int32_t>>()) << i;
                        EXPECT_EQ(!set.Add(t, r.line), w["dropped_at_64"].get<bool>()) << i;
                        ++compared;
                        return Status::Ok();
                      },
                      &report)
                    .ok());
    EXPECT_EQ(i, lines.size());
    EXPECT_EQ(report.skipped, 0);
    dropped += static_cast<int>(set.dropped);
  }
  EXPECT_EQ(compared, 110);
  EXPECT_EQ(dropped, 4);
}

// The loss, TRL's metrics and every LoRA gradient of one batch of 4 pairs equal TRL's
// DPOTrainer (each loss type; the reference is the base with the adapters off) and ORPOTrainer,
// on standard and conversational pairs (golden.json, golden.safetensors).
TEST(PreferenceGolden, LossMetricsAndGradientsEqualTrl) {
  auto m = LoadModel(kDpoFixture + "/model", 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(AttachPeftAdapter(&m.value(), kDpoFixture + "/adapter").ok());
  auto tok = Tokenizer::Load(kDpoFixture + "/model");
  ASSERT_TRUE(tok.ok());
  auto chat = ExampleRenderer::Create(*tok, TemplateKind::kGemmaChat, TrainOn::kAll);
  ASSERT_TRUE(chat.ok());
  const auto golden = nlohmann::json::parse(ReadFile(kDpoFixture + "/golden.json"));
  auto grads_file = SafeTensorsFile::Open(kDpoFixture + "/golden.safetensors");
  ASSERT_TRUE(grads_file.ok()) << grads_file.status().ToString();
  const ParamRegistry& reg = m->registry;
  AlignedBuffer params = MaterializeParams(m.value());
  EngineOptions eo;
  eo.lora = m->lora;
  eo.precision = Precision::kFp32;
  Gemma4Engine eng(m->config, 4, 128, eo);
  std::vector<bool> adapters(static_cast<size_t>(reg.layout.size()), false);
  for (int i = 0; i < reg.layout.size(); ++i)
    adapters[static_cast<size_t>(i)] = reg.layout.entry(i).name.find("lora_") != std::string::npos;
  int compared_batches = 0;
  for (const char* batch_name : {"text", "conv"}) {
    SCOPED_TRACE(batch_name);
    DatasetOptions d;
    d.path = kDpoFixture + "/" + batch_name + ".jsonl";
    d.split = "train[:4]";
    d.preference = true;
    auto ds = InstructionDataset::Open(d);
    ASSERT_TRUE(ds.ok());
    PreferenceSet set(golden["max_length"].get<int64_t>());
    ASSERT_TRUE(ds->ForEach(
                      [&](const InstructionRecord& r) -> Status {
                        PreferenceTokens t;
                        ST_RETURN_IF_ERROR(TokenizePreference(r, *tok, &*chat, &t));
                        EXPECT_TRUE(set.Add(t, r.line));
                        return Status::Ok();
                      },
                      nullptr)
                    .ok());
    ASSERT_EQ(set.size(), 4);
    BatchingOptions bo;
    bo.max_seq_len = 128;
    bo.pad_id = 0;
    const StepRows rows = {{0}, {1}, {2}, {3}};
    for (const char* loss : {"sigmoid", "hinge", "ipo", "robust", "orpo"}) {
      SCOPED_TRACE(loss);
      const nlohmann::json& want = golden["batches"][batch_name][loss];
      ObjectiveOptions oo;
      oo.objective = std::string(loss) == "orpo" ? "orpo" : "dpo";
      oo.loss_type = oo.objective == "dpo" ? loss : "sigmoid";
      oo.beta = golden["beta"].get<double>();
      oo.label_smoothing = std::string(loss) == "robust" ? 0.1 : 0.0;
      auto obj = MakeObjective(oo);
      ASSERT_TRUE(obj.ok()) << obj.status().ToString();
      const PairBatch pb = CollatePairs(set, rows, bo, (*obj)->label_prompt());
      Batch b{pb.batch.input_ids.data(),
              pb.batch.attention_mask.data(),
              pb.batch.labels.data(),
              pb.batch.B,
              pb.batch.T,
              pb.batch.position_ids.data()};
      const size_t n = static_cast<size_t>(pb.batch.B * pb.batch.T);
      std::vector<float> logp(n), weights(n);
      PairLogps ref;
      if ((*obj)->needs_reference()) {
        eng.SetAdapters(false);
        eng.Forward(params.data(), b);
        eng.TargetLogProbs(logp.data());
        ref = SumPairLogps(pb, logp.data());
        eng.SetAdapters(true);
      }
      eng.Forward(params.data(), b);
      eng.TargetLogProbs(logp.data());
      ObjectiveNorm norm;
      norm.pairs = 4;
      for (size_t t = 0; t < n; ++t)
        norm.chosen_targets +=
            pb.sequence[t] >= 0 && pb.sequence[t] % 2 == 0 && pb.batch.labels[t] != kIgnoreIndex;
      const auto& names = (*obj)->metric_names();
      std::vector<double> sums(names.size(), 0.0);
      (*obj)->Compute(pb, logp.data(), &ref, norm, sums.data(), weights.data());
      for (size_t k = 0; k < names.size(); ++k) {
        ASSERT_TRUE(want.contains(names[k])) << names[k];
        const double w = want[names[k]].get<double>();
        EXPECT_NEAR(sums[k], w, 2e-5 * std::max(1.0, std::fabs(w))) << names[k];
      }
      b.loss_weights = weights.data();
      std::vector<float> grads(static_cast<size_t>(reg.layout.total()), 0.f);
      eng.Backward(params.data(), grads.data(), b, 1.0f, &adapters);
      int compared = 0;
      for (int i = 0; i < reg.layout.size(); ++i) {
        if (!adapters[static_cast<size_t>(i)]) continue;
        const ArenaEntry& e = reg.layout.entry(i);
        const std::string key = std::string(batch_name) + "/" + loss + "/" +
                                PeftTensorName(e.name, TextPrefixFor(m->config));
        std::vector<float> g(static_cast<size_t>(e.numel));
        ASSERT_TRUE(grads_file->ReadF32(key, g.data(), e.shape).ok()) << key;
        // fp32 on both sides; the largest difference seen is 4.4e-5.
        EXPECT_LT(RelError(grads.data() + e.offset, g.data(), e.numel), 2e-4) << key;
        ++compared;
      }
      EXPECT_EQ(compared, 20);
    }
    ++compared_batches;
  }
  EXPECT_EQ(compared_batches, 2);
}

TEST(Preference, DpoStartsAtLn2AndLearnsThePairs) {
  const std::string dir = test::TempDir("dpo");
  ASSERT_FALSE(dir.empty());
  const std::string pairs = WritePairs(dir, 48);
  // The same pairs, evaluated as a held-out set (another file: the split check allows it).
  fs::copy_file(pairs, dir + "/eval.jsonl");
  const Ran r = RunCommand(Job(dir, pairs) +
                           " --objective dpo --lora-rank 16 --lr 3e-2 --num-epochs 30 --topology 2 "
                           "--eval-dataset " +
                           dir + "/eval.jsonl --eval-split train --run-name learn");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Starting slicetrain FSDP DPO job"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Objective: dpo (sigmoid, beta 0.1"), std::string::npos) << r.out;
  const auto steps = test::MetricsRecords(dir + "/learn", "step");
  ASSERT_FALSE(steps.empty());
  // The adapters start at B = 0: the policy is the reference, every log ratio is 0.
  EXPECT_NEAR(steps[0]["loss"].get<double>(), std::log(2.0), 1e-6);
  EXPECT_EQ(steps[0]["rewards/chosen"].get<double>(), 0.0);
  EXPECT_EQ(steps[0]["rewards/margins"].get<double>(), 0.0);
  for (const char* k : {"rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"})
    EXPECT_TRUE(steps[0].contains(k)) << k;
  // After training the model prefers the chosen answer of (nearly) every pair.
  const auto evals = test::MetricsRecords(dir + "/learn", "eval");
  ASSERT_EQ(evals.size(), 30u);
  EXPECT_GT(evals.back()["eval_rewards/accuracies"].get<double>(), 0.9) << evals.back().dump();
  EXPECT_LT(evals.back()["eval_loss"].get<double>(), std::log(2.0) - 0.05);
  EXPECT_NE(r.out.find("eval_rewards/margins="), std::string::npos) << r.out;
}

TEST(Preference, OrpoNeedsNoReferenceAndLogsItsOddsRatio) {
  const std::string dir = test::TempDir("orpo");
  ASSERT_FALSE(dir.empty());
  const std::string pairs = WritePairs(dir, 16);
  // Full fine-tuning: ORPO has no reference model.
  const Ran r = RunCommand(Job(dir, pairs) +
                           " --objective orpo --beta 0.2 --num-epochs 2 --topology 2 --run-name o");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto steps = test::MetricsRecords(dir + "/o", "step");
  ASSERT_FALSE(steps.empty());
  for (const char* k : {"nll_loss", "log_odds_ratio", "log_odds_chosen", "rewards/accuracies"})
    EXPECT_TRUE(steps[0].contains(k)) << k;
  // loss = nll_loss - beta x mean log sigmoid(log odds), log_odds_ratio being that mean.
  EXPECT_NEAR(steps[0]["loss"].get<double>(),
              steps[0]["nll_loss"].get<double>() - 0.2 * steps[0]["log_odds_ratio"].get<double>(),
              1e-4);
}

TEST(Preference, WorkersAndAccumulationAgreeKilledRunResumesExactly) {
  const std::string dir = test::TempDir("dpow");
  ASSERT_FALSE(dir.empty());
  const std::string pairs = WritePairs(dir, 16);
  const std::string job =
      Job(dir, pairs) + " --objective dpo --lora-rank 4 --lr 1e-2 --precision fp32 --packing off";
  std::vector<double> first;
  double first_norm = 0;
  int run = 0;
  // The same global batch of 4 pairs: 1 x 4, 2 x 2, 4 x 1, and 2 workers x 2 micro-batches of 1.
  for (const std::string& shape :
       {std::string("--topology 1 --batch-size-per-device 4"),
        std::string("--topology 2 --batch-size-per-device 2"),
        std::string("--topology 4 --batch-size-per-device 1"),
        std::string("--topology 2 --batch-size-per-device 1 --gradient-accumulation-steps 2")}) {
    const std::string name = "shape" + std::to_string(run++);
    const Ran r = RunCommand(job + " --num-epochs 2 " + shape + " --run-name " + name);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto steps = test::MetricsRecords(dir + "/" + name, "step");
    const auto epochs = test::MetricsRecords(dir + "/" + name, "epoch");
    ASSERT_EQ(epochs.size(), 2u);
    ASSERT_FALSE(steps.empty());
    // The first step's gradient (before any update): the same sum in another reduction order.
    const double norm = steps[0]["grad_norm"].get<double>();
    if (first.empty()) {
      for (const auto& e : epochs) first.push_back(e["loss"].get<double>());
      first_norm = norm;
      ASSERT_GT(first_norm, 0.0);
      continue;
    }
    EXPECT_NEAR(norm, first_norm, 1e-4 * first_norm) << shape;
    // Later steps drift apart: AdamW's first steps move every coordinate by about lr whatever its
    // gradient's size, so the reduction order's rounding of near-zero LoRA gradients (B starts at
    // zero) becomes full-size updates (as in test_trainer's LoRA runs). Measured against a fall
    // of about 1.3e-2: 3e-4 at -O3 and 1.3e-3 under the sanitizers' code generation on a Zen 4
    // (AVX-512 kernels); 6.2e-3 under the sanitizers on a Zen 3 (AVX2 kernels, whose sums run in
    // yet another order), hence 8e-3. The step-0 gradient norm above is the tight check.
    for (size_t e = 0; e < 2; ++e)
      EXPECT_NEAR(epochs[e]["loss"].get<double>(), first[e], 8e-3) << shape;
  }
  EXPECT_LT(first[1], first[0] - 8e-3) << "the adapters learn";

  // Killed after a step checkpoint inside epoch 2 (LoRA dropout on, so the masks' seeds must
  // replay too), resumed: the same adapter as the uninterrupted run.
  const std::vector<std::string> base = {ST_BINARY,
                                         "finetune",
                                         "--data-dir",
                                         ST_SOURCE_DIR "/data",
                                         "--dataset",
                                         pairs,
                                         "--dataset-split",
                                         "train",
                                         "--max-seq-len",
                                         "64",
                                         "--objective",
                                         "dpo",
                                         "--lora-rank",
                                         "4",
                                         "--lora-dropout",
                                         "0.1",
                                         "--no-dashboard",
                                         "--progress",
                                         "off",
                                         "--storage-path",
                                         dir,
                                         "--topology",
                                         "2",
                                         "--batch-size-per-device",
                                         "1",
                                         "--num-epochs",
                                         "2",
                                         "--save-steps",
                                         "3",
                                         "--packing",
                                         "off"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = base;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  testing::Proc full(with({"--run-name", "full"}));
  ASSERT_EQ(full.Wait(std::chrono::seconds(300)), 0) << full.output();
  testing::Proc part(with({"--run-name", "part"}));
  ASSERT_TRUE(part.ReadUntil(
      [](const std::string& o) { return o.find("(epoch 2, step 3 of 8)") != std::string::npos; },
      std::chrono::seconds(300)))
      << part.output();
  ASSERT_EQ(kill(part.pid(), SIGKILL), 0);
  part.Wait(std::chrono::seconds(30));
  testing::Proc rest(with({"--run-name", "part", "--resume"}));
  ASSERT_EQ(rest.Wait(std::chrono::seconds(300)), 0) << rest.output();
  EXPECT_NE(rest.output().find(" steps of epoch 2, step "), std::string::npos) << rest.output();
  const std::string a = NewestCheckpoint(dir + "/full"), b = NewestCheckpoint(dir + "/part");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_TRUE(ReadFile(a + "/adapter_model.safetensors") ==
              ReadFile(b + "/adapter_model.safetensors"))
      << "the resumed run's adapter differs from the uninterrupted run's";
}

// Full fine-tuning has no adapters to switch off: the reference log-probs are computed from the
// initial weights before the first step and stored with the run, so a resume reads them back and
// ends with the same weights as an uninterrupted run. With LoRA, precomputing them changes
// nothing but the time.
TEST(Preference, PrecomputedReferenceSurvivesResume) {
  const std::string dir = test::TempDir("dporef");
  ASSERT_FALSE(dir.empty());
  const std::string pairs = WritePairs(dir, 16);
  fs::copy_file(pairs, dir + "/eval.jsonl");
  const std::string job = Job(dir, pairs) +
                          " --objective dpo --precision fp32 "
                          "--topology 2 --batch-size-per-device 2 "
                          "--eval-dataset " +
                          dir + "/eval.jsonl --eval-split 'train[:4]'";
  Ran r = RunCommand(job + " --lr 1e-4 --num-epochs 3 --run-name whole");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reference: the initial weights, log-probs precomputed"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Reference log-probs of 20 pairs computed"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/whole/reference_logps.safetensors"));
  r = RunCommand(job + " --lr 1e-4 --num-epochs 2 --run-name part");
  ASSERT_EQ(r.code, 0) << r.out;
  r = RunCommand(job + " --lr 1e-4 --num-epochs 3 --run-name part --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Reference log-probs: " + dir + "/part/reference_logps.safetensors"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(ReadFile(NewestCheckpoint(dir + "/part") + "/model.safetensors"),
            ReadFile(NewestCheckpoint(dir + "/whole") + "/model.safetensors"));
  // The reference's weights are gone once a full fine-tuning run has stepped.
  fs::remove(dir + "/part/reference_logps.safetensors");
  r = RunCommand(job + " --lr 1e-4 --num-epochs 4 --run-name part --resume");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("is missing (on this or another worker's host: it must be shared "
                       "storage): the reference weights are gone"),
            std::string::npos)
      << r.out;
  // A fresh start under an old run's name computes its own table (the old one is replaced).
  r = RunCommand(job + " --lr 1e-4 --num-epochs 1 --run-name whole");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Reference log-probs of 20 pairs computed"), std::string::npos) << r.out;

  std::vector<std::vector<nlohmann::json>> lora;
  for (const char* extra : {"", " --precompute-ref-log-probs"}) {
    r = RunCommand(job + " --lora-rank 4 --lr 1e-2 --num-epochs 2 --run-name lora" +
                   std::string(*extra ? "p" : "") + extra);
    ASSERT_EQ(r.code, 0) << r.out;
    lora.push_back(test::MetricsRecords(dir + "/lora" + std::string(*extra ? "p" : ""), "epoch"));
    ASSERT_EQ(lora.back().size(), 2u);
  }
  for (size_t e = 0; e < 2; ++e)
    EXPECT_NEAR(lora[1][e]["loss"].get<double>(), lora[0][e]["loss"].get<double>(), 1e-6);
}

// `evaluate --objective dpo` on a run's adapter reports the run's own held-out eval_loss and
// metrics (tools/check_dpo.py compares the same figure with transformers + PEFT).
TEST(Preference, EvaluateReportsTheRunsEvalLoss) {
  const std::string dir = test::TempDir("dpoeval");
  ASSERT_FALSE(dir.empty());
  const std::string pairs = WritePairs(dir, 24);
  fs::copy_file(pairs, dir + "/eval.jsonl");
  const Ran r = RunCommand(Job(dir, pairs) +
                           " --objective dpo --lora-rank 4 --lr 2e-2 --precision fp32 --topology 2 "
                           "--num-epochs 2 --eval-dataset " +
                           dir + "/eval.jsonl --eval-split 'train[:8]' --run-name e");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto evals = test::MetricsRecords(dir + "/e", "eval");
  ASSERT_EQ(evals.size(), 2u);
  const std::string eval = std::string(ST_BINARY) +
                           " evaluate --model-id gemma4-tiny --data-dir " ST_SOURCE_DIR
                           "/data --dataset " +
                           dir + "/eval.jsonl --dataset-split 'train[:8]' --max-seq-len 64 " +
                           "--precision fp32 --objective dpo --json";
  const Ran e = RunCommand(eval + " --adapter " + NewestCheckpoint(dir + "/e"));
  ASSERT_EQ(e.code, 0) << e.out;
  const auto j = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  // The run evaluates with the weights FSDP all-gathers in bf16 (its param dtype), evaluate with
  // the saved fp32 adapter: 8e-5 apart here.
  EXPECT_NEAR(j["loss"].get<double>(), evals.back()["eval_loss"].get<double>(), 5e-4);
  EXPECT_NEAR(j["rewards/margins"].get<double>(),
              evals.back()["eval_rewards/margins"].get<double>(), 1e-3);
  EXPECT_EQ(j["pairs"], 8);
  const Ran no_adapter = RunCommand(eval);
  EXPECT_NE(no_adapter.code, 0);
  EXPECT_NE(no_adapter.out.find("evaluate --objective dpo needs --adapter"), std::string::npos)
      << no_adapter.out;
}

TEST(Preference, BadRecordsAreSkippedAndCountedBadFlagsRefused) {
  const std::string dir = test::TempDir("dpobad");
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/bad.jsonl";
  {
    std::ofstream out(path);
    const std::string long_prompt(400, 'x');
    out << R"({"prompt": "Say yes.", "chosen": "yes", "rejected": "no"})"
        << "\n"
        << R"({"prompt": "Say yes.", "chosen": "yes"})"
        << "\n"
        << R"({"prompt": "Say yes.", "chosen": "", "rejected": "no"})"
        << "\n"
        << R"({"prompt": "Say yes.", "chosen": "same", "rejected": "same"})"
        << "\n"
        << nlohmann::json{{"prompt", long_prompt}, {"chosen", "a"}, {"rejected", "b"}}.dump()
        << "\n"
        << R"({"prompt": "Say no.", "chosen": "no", "rejected": "yes"})"
        << "\n";
  }
  const std::string job = Job(dir, path) + " --num-epochs 1 --topology 1 --run-name bad";
  Ran r = RunCommand(job + " --objective dpo --lora-rank 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 skipped (line 2: no 'rejected' completion; line 3: an empty 'chosen' or "
                       "'rejected' completion; line 4: 'chosen' equals 'rejected'"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("2 pairs (each chosen + rejected, up to 64 tokens a side), 1 dropped"),
            std::string::npos)
      << r.out;
  // One clear line each.
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"", "this is preference data (chosen, rejected): train on it with --objective dpo"},
           {" --objective orpo --precompute-ref-log-probs", "--precompute-ref-log-probs is DPO's"},
           {" --objective dpo --lora-rank 4 --loss-type square", "--loss-type must be sigmoid"},
           {" --objective dpo --lora-rank 4 --label-smoothing 0.1",
            "--label-smoothing applies to --loss-type robust"},
           {" --objective kto", "--objective must be sft, dpo, orpo or grpo"}}) {
    r = RunCommand(job + flags);
    EXPECT_NE(r.code, 0) << flags;
    EXPECT_NE(r.out.find(says), std::string::npos) << flags << "\n" << r.out;
  }
  r = RunCommand(std::string(ST_BINARY) +
                 " finetune --data-dir " ST_SOURCE_DIR
                 "/data --objective orpo --no-dashboard --storage-path " +
                 dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("needs a preference data set"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace st
