// Image chat data (TRL's vision layout: `messages` with {"type": "image"} parts and an `images`
// column, as `datasets` writes it to Parquet or as paths in JSON Lines) through the chat template
// and the engine, against tests/fixtures/vision_chat (tools/make_vision_chat_fixtures.py):
// Google's Gemma 4 template with Gemma4Processor's image expansion and
// Gemma4ForConditionalGeneration's loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/chat_template.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "model/vision/image_encoder.h"
#include "test_util.h"

namespace st {
namespace {

const std::string kDir = ST_FIXTURE_DIR "/vision_chat";
const std::string kModel = kDir + "/model";

nlohmann::json Golden() {
  std::ifstream f(kDir + "/golden.json");
  return nlohmann::json::parse(f);
}

struct Rendered {
  std::vector<RenderedExample> examples;
  std::vector<int64_t> lines;
};

StatusOr<Rendered> RenderAll(const std::string& file, TrainOn train_on) {
  ST_ASSIGN_OR_RETURN(const Tokenizer tok, Tokenizer::Load(kModel));
  ST_ASSIGN_OR_RETURN(auto encoder, vision::ImageEncoder::Load(kModel));
  ST_ASSIGN_OR_RETURN(ExampleRenderer renderer,
                      ExampleRenderer::Create(tok, TemplateKind::kGemmaChat, train_on));
  renderer.SetImageTokens(encoder->Tokens());
  DatasetOptions o;
  o.path = file;
  ST_ASSIGN_OR_RETURN(const InstructionDataset ds, InstructionDataset::Open(o));
  Rendered out;
  ST_RETURN_IF_ERROR(ds.ForEach(
      [&](const InstructionRecord& r) {
        RenderedExample e;
        ST_RETURN_IF_ERROR(renderer.Render(r, &e));
        out.examples.push_back(std::move(e));
        out.lines.push_back(r.line);
        return Status::Ok();
      },
      nullptr));
  return out;
}

class VisionChatData : public ::testing::TestWithParam<const char*> {};

TEST_P(VisionChatData, RendersAsGoogleTemplateAndProcessor) {
  const nlohmann::json g = Golden();
  auto r = RenderAll(kDir + "/data/" + GetParam(), TrainOn::kAll);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->examples.size(), g["records"].size());
  auto config = vision::ReadVisionConfig(kModel);
  ASSERT_TRUE(config.ok());
  for (size_t i = 0; i < r->examples.size(); ++i) {
    const RenderedExample& e = r->examples[i];
    const nlohmann::json& want = g["records"][i];
    EXPECT_EQ(e.ids, want["input_ids"].get<std::vector<int32_t>>()) << "record " << i;
    const auto counts = want["soft_tokens"].get<std::vector<int64_t>>();
    ASSERT_EQ(e.images.size(), counts.size()) << "record " << i;
    ASSERT_EQ(e.image_spans.size(), counts.size());
    for (size_t k = 0; k < counts.size(); ++k) {
      const auto [lo, hi] = e.image_spans[k];
      EXPECT_EQ(static_cast<int64_t>(hi - lo), counts[k] + 2) << "record " << i << " image " << k;
      EXPECT_EQ(e.ids[lo], config->boi_token_id);
      EXPECT_EQ(e.ids[hi - 1], config->eoi_token_id);
    }
    for (size_t t = 0; t < e.ids.size(); ++t)  // a placeholder is never a target
      EXPECT_EQ(e.trained[t] != 0, e.ids[t] != config->image_token_id)
          << "record " << i << " " << t;
  }
}

// `evaluate` reads the set, runs each batch's images through the tower and places the soft tokens:
// the loss is transformers' (the images decoded, resized and normalised by our processor).
TEST_P(VisionChatData, EvaluateEqualsTransformersLoss) {
  const nlohmann::json g = Golden();
  const test::Ran ran = test::RunCommand(
      std::string(ST_BINARY) + " evaluate --model-id " + kModel + " --dataset " + kDir + "/data/" +
      GetParam() + " --train-on all --batch-size 3 --max-seq-len 256 --precision fp32 --json");
  ASSERT_EQ(ran.code, 0) << ran.out;
  const std::string last = ran.out.substr(ran.out.rfind('{'));
  const nlohmann::json j = nlohmann::json::parse(last);
  EXPECT_EQ(j["tokens"].get<int64_t>(), g["targets"].get<int64_t>()) << ran.out;
  EXPECT_NEAR(j["loss"].get<double>(), g["loss"].get<double>(), 1e-4 * g["loss"].get<double>())
      << ran.out;

  // Through an adapter PEFT made on every linear (all-linear: the vision tower's `.linear`s, its
  // input_proj and the projection too): PEFT's loss, the tower's adapters applied.
  const test::Ran peft =
      test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " + kModel + " --adapter " +
                       kDir + "/peft_adapter --dataset " + kDir + "/data/" + GetParam() +
                       " --train-on all --batch-size 3 --max-seq-len 256 --precision fp32 --json");
  ASSERT_EQ(peft.code, 0) << peft.out;
  const nlohmann::json p = nlohmann::json::parse(peft.out.substr(peft.out.rfind('{')));
  const double want = g["peft_adapter"]["loss"].get<double>();
  EXPECT_EQ(g["peft_adapter"]["tower_modules"].get<int>(), 16);
  EXPECT_NEAR(p["loss"].get<double>(), want, 1e-4 * want) << peft.out;
  EXPECT_GT(std::fabs(want - g["loss"].get<double>()), 0.05);  // the adapter changes the loss
}

INSTANTIATE_TEST_SUITE_P(Layouts, VisionChatData, ::testing::Values("train.parquet", "train.jsonl"),
                         [](const auto& info) {
                           return std::string(info.param).find("parquet") != std::string::npos
                                      ? std::string("parquet")
                                      : std::string("jsonl");
                         });

// Truncation never splits an image's block: a cut inside one cuts before it, and the image goes.
TEST(VisionChatData, TruncationKeepsImagesWholeOrDropsThem) {
  auto r = RenderAll(kDir + "/data/train.jsonl", TrainOn::kAll);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const RenderedExample& two = r->examples[1];  // "Compare <image> with <image>"
  ASSERT_EQ(two.image_spans.size(), 2u);
  const auto [lo2, hi2] = two.image_spans[1];
  RenderedExample cut = two;
  cut.Truncate(lo2 + 3);  // inside the second image's block
  EXPECT_EQ(cut.ids.size(), lo2);
  EXPECT_EQ(cut.images.size(), 1u);
  cut = two;
  cut.Truncate(hi2);  // just after it: both stay
  EXPECT_EQ(cut.images.size(), 2u);
  EXPECT_EQ(cut.ids.size(), hi2);

  // Split into pieces (--packing split): the second image starts a piece of its own.
  CollateOptions co;
  co.max_seq_len = static_cast<int64_t>(lo2) + 3;
  co.split_long = true;
  TokenizedSet set;
  AddExample(two, co, &set);
  ASSERT_GE(set.size(), 2);
  EXPECT_EQ(set.images.size(), 2u);
  EXPECT_EQ(set.images_dropped, 0);
  EXPECT_EQ(set.length(0), static_cast<int64_t>(lo2));
  EXPECT_EQ(set.image_offsets[1], 1);
  EXPECT_EQ(set.ids[static_cast<size_t>(set.offsets[1])], two.ids[lo2]);  // the begin marker
  // A piece shorter than an image's block drops the image (and counts it).
  TokenizedSet small;
  co.max_seq_len = 20;
  AddExample(two, co, &small);
  EXPECT_EQ(small.images.size() + static_cast<size_t>(small.images_dropped), 2u);
  EXPECT_GT(small.images_dropped, 0);
  for (int64_t i = 0; i < small.size(); ++i) EXPECT_LE(small.length(i), 20);

  // Collate hands over the rows' images in order.
  const TokenBatch b = Collate(set, std::vector<int64_t>{1, 0}, 0);
  ASSERT_EQ(b.images.size(), 2u);
  EXPECT_EQ(b.images[0], &set.images[1]);
  EXPECT_EQ(b.images[1], &set.images[0]);
}

// generate --image: the prompt as transformers' template and processor make it, greedy tokens
// as Gemma4ForConditionalGeneration.generate's (the decoder places the soft tokens); chat takes
// --image too.
TEST(VisionChatData, GenerateWithAnImageEqualsTransformers) {
  const nlohmann::json g = Golden()["generate"];
  const std::string image =
      std::string(ST_FIXTURE_DIR) + "/images/" + g["image"].get<std::string>();
  const test::Ran ran =
      test::RunCommand(std::string(ST_BINARY) + " generate --model-id " + kModel + " --image " +
                       image + " --prompt '" + g["prompt"].get<std::string>() +
                       "' --max-new-tokens 12 --temperature 0 --json");
  ASSERT_EQ(ran.code, 0) << ran.out;
  const nlohmann::json j = nlohmann::json::parse(ran.out.substr(ran.out.rfind("\n{") + 1));
  EXPECT_EQ(j["prompt_tokens"].get<size_t>(), g["prompt_ids"].size()) << ran.out;
  const auto want = g["new_ids"].get<std::vector<int32_t>>();
  const auto got = j["token_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(got.empty());
  // Ours stops at a stop token (transformers was told not to): a prefix of its tokens.
  ASSERT_LE(got.size(), want.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << ran.out;

  // The same prompt from a --prompts file whose JSON line names its image (relative to the file),
  // beside a text-only line: the first answer is the --image one, the second has no image.
  const std::string dir = test::TempDir("vision_prompts");
  std::filesystem::copy_file(image, dir + "/picture.jpg");
  std::ofstream(dir + "/prompts.jsonl")
      << nlohmann::json{{"prompt", g["prompt"]}, {"images", {"picture.jpg"}}}.dump() << "\n"
      << nlohmann::json{{"prompt", g["prompt"]}}.dump() << "\n";
  const test::Ran file =
      test::RunCommand(std::string(ST_BINARY) + " generate --model-id " + kModel + " --prompts " +
                       dir + "/prompts.jsonl --max-new-tokens 12 --temperature 0 --json");
  ASSERT_EQ(file.code, 0) << file.out;
  std::vector<nlohmann::json> answers;
  std::istringstream lines(file.out);
  for (std::string l; std::getline(lines, l);)
    if (!l.empty() && l[0] == '{') answers.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(answers.size(), 2u) << file.out;
  EXPECT_EQ(answers[0]["token_ids"].get<std::vector<int32_t>>(), got) << file.out;
  EXPECT_EQ(answers[0]["prompt_tokens"], j["prompt_tokens"]);
  EXPECT_LT(answers[1]["prompt_tokens"].get<int64_t>(), j["prompt_tokens"].get<int64_t>());
  std::ofstream(dir + "/bad.jsonl") << R"({"prompt": "hi", "images": [3]})"
                                    << "\n";
  const test::Ran bad = test::RunCommand(std::string(ST_BINARY) + " generate --model-id " + kModel +
                                         " --prompts " + dir + "/bad.jsonl");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("bad.jsonl:1: \"images\" must be a list of paths"), std::string::npos)
      << bad.out;

  const test::Ran chat = test::RunCommand("echo '" + g["prompt"].get<std::string>() + "' | " +
                                          ST_BINARY + " chat --model-id " + kModel + " --image " +
                                          image + " --max-new-tokens 12 --temperature 0");
  EXPECT_EQ(chat.code, 0) << chat.out;  // (the tiny model's answer is byte tokens: not compared)
  // A text-only model refuses images with the reason.
  const test::Ran text = test::RunCommand(std::string(ST_BINARY) + " generate --model-id " +
                                          ST_FIXTURE_DIR + "/tiny_mm --tokenizer " + kModel +
                                          " --image " + image + " --prompt hi --json");
  EXPECT_NE(text.code, 0);
  EXPECT_NE(text.out.find("no vision tower"), std::string::npos) << text.out;
}

// The frozen tower's soft tokens, kept for later epochs: a second batch of the same images skips
// the tower and gets the same values; a budget of 0 keeps nothing.
TEST(VisionChatData, EncoderCacheServesLaterBatchesTheSameSoftTokens) {
  const std::string images = std::string(ST_FIXTURE_DIR) + "/images/";
  const std::vector<ImageRef> refs = {ImageRef{"", images + "rgb420_61x43.jpg"},
                                      ImageRef{"", images + "tall_5x500.png"}};
  const std::vector<const ImageRef*> batch = {&refs[1], &refs[0], &refs[1]};
  auto plain = vision::ImageEncoder::Load(kModel);
  auto cached = vision::ImageEncoder::Load(kModel);
  ASSERT_TRUE(plain.ok() && cached.ok());
  (*cached)->EnableCache(size_t{1} << 20);
  auto a = (*plain)->Encode(batch);
  auto b = (*cached)->Encode(batch);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_EQ((*plain)->tower_images(), 2);  // the repeated image once
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->size(), size_t(70 + 63 + 70) * 48);
  auto c = (*cached)->Encode(std::vector<const ImageRef*>{&refs[0]});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*cached)->tower_images(), 2);  // served from the cache
  EXPECT_TRUE(std::equal(c->begin(), c->end(), a->begin() + 70 * 48));
  ASSERT_TRUE((*plain)->Encode(std::vector<const ImageRef*>{&refs[0]}).ok());
  EXPECT_EQ((*plain)->tower_images(), 3);
}

// finetune on the image set (Parquet), packed, two workers, LoRA on every linear (all-linear: the
// text model's and, as PEFT's all-linear, the vision tower's and the projection): the held-out copy
// (JSON Lines, the same records) is learnt, and the saved adapter holds the tower's trained
// adapters, which `evaluate --adapter` applies (its loss is the run's last eval loss, up to the
// run's bf16 parameter gathers).
TEST(VisionChatData, FinetuneLearnsTheImageSet) {
  const std::string dir = test::TempDir("vision_ft");
  // Each epoch's checkpoint answers a prompt about an image (--sample-prompts with "images").
  std::ofstream(dir + "/prompts.jsonl")
      << nlohmann::json{{"prompt", "What is in the picture?"},
                        {"images", {std::string(ST_FIXTURE_DIR) + "/images/rgb420_61x43.jpg"}}}
             .dump()
      << "\n";
  const test::Ran ran = test::RunCommand(
      std::string(ST_BINARY) + " finetune --model-id " + kModel + " --dataset " + kDir +
      "/data/train.parquet --dataset-split train --eval-dataset " + kDir +
      "/data/train.jsonl --eval-split train --max-seq-len 256 --batch-size-per-device 1 "
      "--topology 2 --lora-rank 8 --lora-target-modules all-linear --lr 1e-2 --num-epochs 15 "
      "--precision fp32 --no-dashboard --sample-prompts " +
      dir + "/prompts.jsonl --sample-max-new-tokens 4 --progress off --storage-path " + dir +
      " --run-name v");
  ASSERT_EQ(ran.code, 0) << ran.out;
  EXPECT_EQ(ran.out.find("Samples skipped"), std::string::npos) << ran.out;
  EXPECT_EQ(test::MetricsRecords(dir + "/v", "samples").size(), 15u) << ran.out;
  // What each part trains: the text model's LoRA, the tower's (frozen under its adapters).
  EXPECT_NE(ran.out.find("Parts: text "), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("frozen under LoRA on 16 of their linears (6272 trainable"),
            std::string::npos)
      << ran.out;
  const auto evals = test::MetricsRecords(dir + "/v", "eval");
  ASSERT_EQ(evals.size(), 15u) << ran.out;
  const double first = evals.front()["eval_loss"].get<double>();
  const double last = evals.back()["eval_loss"].get<double>();
  EXPECT_LT(last, 0.3 * first) << ran.out;  // measured: 5.69 after the first epoch, 1.12 after 15

  const std::string ckpt = test::NewestCheckpoint(dir + "/v");
  auto file = SafeTensorsFile::Open(ckpt + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  int tower = 0;
  for (const SafeTensorInfo& t : file->tensors())
    if (t.name.find("vision_tower") != std::string::npos ||
        t.name.find("embed_vision") != std::string::npos)
      ++tower;
  EXPECT_EQ(tower, 32);  // A and B of 16 modules
  std::vector<float> b(size_t(48) * 8);
  ASSERT_TRUE(
      file->ReadF32("base_model.model.model.embed_vision.embedding_projection.lora_B.weight",
                    b.data(), {48, 8})
          .ok());
  EXPECT_GT(*std::max_element(b.begin(), b.end()), 0.0f);  // B starts at zero: the tower trained
  const test::Ran eval = test::RunCommand(
      std::string(ST_BINARY) + " evaluate --model-id " + kModel + " --adapter " + ckpt +
      " --dataset " + kDir + "/data/train.jsonl --max-seq-len 256 --precision fp32 --json");
  ASSERT_EQ(eval.code, 0) << eval.out;
  const nlohmann::json j = nlohmann::json::parse(eval.out.substr(eval.out.rfind('{')));
  // The run's eval computes with the trained tensors gathered in bf16 (FSDP's param_dtype, as the
  // seed's MixedPrecisionPolicy; docs/training.md), `evaluate` with the fp32 checkpoint: 2e-5 to
  // 1.2e-3 of the loss apart on this over-fit model, while the same adapter without its tower
  // part is 38 % off (measured).
  EXPECT_NEAR(j["loss"].get<double>(), last, 2e-3 * last) << eval.out;
  // export writes the whole model with the adapter merged, towers included: every tensor of the
  // base, and the merged model evaluates as the base with the adapter (an export without the
  // tower's merge would be 38 % off, one without the towers would not load images).
  const test::Ran exported =
      test::RunCommand(std::string(ST_BINARY) + " export --model-id " + kModel + " --adapter " +
                       ckpt + " --output " + dir + "/merged");
  ASSERT_EQ(exported.code, 0) << exported.out;
  EXPECT_NE(exported.out.find("16 of them vision tower linears with the adapter merged"),
            std::string::npos)
      << exported.out;
  auto base = SafeTensorsFile::Open(kModel + "/model.safetensors");
  auto merged = SafeTensorsFile::Open(dir + "/merged/model.safetensors");
  ASSERT_TRUE(base.ok() && merged.ok());
  for (const SafeTensorInfo& t : base->tensors()) {
    const SafeTensorInfo* m = merged->Find(t.name);
    ASSERT_NE(m, nullptr) << t.name << " is not in the export";
    EXPECT_EQ(m->shape, t.shape) << t.name;
  }
  EXPECT_EQ(merged->tensors().size(), base->tensors().size());
  EXPECT_TRUE(std::filesystem::exists(dir + "/merged/processor_config.json"));
  const test::Ran merged_eval = test::RunCommand(
      std::string(ST_BINARY) + " evaluate --model-id " + dir + "/merged --dataset " + kDir +
      "/data/train.jsonl --max-seq-len 256 --precision fp32 --json");
  ASSERT_EQ(merged_eval.code, 0) << merged_eval.out;
  const nlohmann::json m =
      nlohmann::json::parse(merged_eval.out.substr(merged_eval.out.rfind('{')));
  EXPECT_NEAR(m["loss"].get<double>(), j["loss"].get<double>(), 1e-5 * j["loss"].get<double>())
      << merged_eval.out;
}

// A full fine-tune of a multimodal model trains the text model with the towers frozen; its
// checkpoint is still the whole model (the towers as the base stores them, the processor files),
// so that `evaluate` reads images from it.
TEST(VisionChatData, FullFinetuneCheckpointKeepsTheTowers) {
  const std::string dir = test::TempDir("vision_full");
  const test::Ran ran = test::RunCommand(
      std::string(ST_BINARY) + " finetune --model-id " + kModel + " --dataset " + kDir +
      "/data/train.jsonl --max-seq-len 256 --batch-size-per-device 2 --topology 1 --lr 1e-3 "
      "--num-epochs 1 --precision fp32 --no-dashboard --progress off --storage-path " +
      dir + " --run-name f");
  ASSERT_EQ(ran.code, 0) << ran.out;
  const std::string ckpt = test::NewestCheckpoint(dir + "/f");
  auto base = SafeTensorsFile::Open(kModel + "/model.safetensors");
  auto saved = SafeTensorsFile::Open(ckpt + "/model.safetensors");
  ASSERT_TRUE(base.ok() && saved.ok());
  for (const SafeTensorInfo& t : base->tensors())
    EXPECT_NE(saved->Find(t.name), nullptr) << t.name << " is not in the checkpoint";
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/processor_config.json"));
  const std::string eval_args = " --dataset " + kDir + "/data/train.jsonl --max-seq-len 256 --json";
  const test::Ran before =
      test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " + kModel + eval_args);
  const test::Ran after =
      test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " + ckpt + eval_args);
  ASSERT_EQ(before.code, 0) << before.out;
  ASSERT_EQ(after.code, 0) << after.out;
  const nlohmann::json b = nlohmann::json::parse(before.out.substr(before.out.rfind('{')));
  const nlohmann::json a = nlohmann::json::parse(after.out.substr(after.out.rfind('{')));
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_LT(a["loss"].get<double>(), b["loss"].get<double>()) << after.out;  // it trained
}

// The memory plan counts the tower of a multimodal model: its weights and, frozen, the soft-token
// cache's cap, or, with LoRA on it, the adapters and the saved values of a step's image tokens.
TEST(VisionChatData, DryRunCountsTheTower) {
  const auto row = [](const std::string& out) {
    const size_t at = out.find("  vision tower (with images) ");
    return at == std::string::npos
               ? -1.0
               : std::stod(out.substr(out.find_first_of("0123456789", at + 20)));
  };
  const std::string job = std::string(ST_BINARY) + " finetune --dry-run --model-id " + kModel +
                          " --dataset " + kDir + "/data/train.jsonl --max-seq-len 256 --topology 1";
  const test::Ran frozen = test::RunCommand(job + " --lora-rank 8");
  const test::Ran lora = test::RunCommand(job + " --lora-rank 8 --lora-target-modules all-linear");
  const test::Ran text = test::RunCommand(job + " --objective dpo --lora-rank 8");
  ASSERT_EQ(frozen.code, 0) << frozen.out;
  ASSERT_EQ(lora.code, 0) << lora.out;
  EXPECT_GE(row(frozen.out), 512.0) << frozen.out;  // the cache's cap
  EXPECT_GT(row(lora.out), 0.0) << lora.out;
  EXPECT_LT(row(lora.out), 512.0) << lora.out;  // no cache: the tower trains
  EXPECT_LT(row(text.out), 0.0) << text.out;    // preference pairs read no images
}

// The tower's adapters and its projection (modules_to_save) resume with their AdamW state: two
// epochs, then a resume to three, end with the adapter (text and tower) of an uninterrupted
// three-epoch run, byte for byte.
TEST(VisionChatData, TowerAdaptersResume) {
  const std::string dir = test::TempDir("vision_resume");
  const std::string job = std::string(ST_BINARY) + " finetune --model-id " + kModel +
                          " --dataset " + kDir +
                          "/data/train.parquet --dataset-split train --max-seq-len 256 "
                          "--batch-size-per-device 1 --topology 2 --lora-rank 4 "
                          "--lora-target-modules q_proj,v_proj,down_proj.linear,input_proj "
                          "--modules-to-save embedding_projection "
                          "--lr 1e-2 --precision fp32 --no-dashboard --progress off "
                          "--storage-path " +
                          dir;
  test::Ran r = test::RunCommand(job + " --num-epochs 3 --run-name whole");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("frozen under LoRA on 3 of their linears"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the projection trained in full"), std::string::npos) << r.out;
  r = test::RunCommand(job + " --num-epochs 2 --run-name part");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::RunCommand(job + " --num-epochs 3 --run-name part --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string whole = test::NewestCheckpoint(dir + "/whole");
  const std::string part = test::NewestCheckpoint(dir + "/part");
  EXPECT_TRUE(std::filesystem::exists(part + "/vision_lora_state.safetensors"));
  EXPECT_EQ(test::ReadFile(part + "/adapter_model.safetensors"),
            test::ReadFile(whole + "/adapter_model.safetensors"))
      << "the resumed run's adapter differs from the uninterrupted run's";
}

// Targets that reach the tower, refused where they cannot work: one line with the reason.
TEST(VisionChatData, TowerTargetRefusals) {
  const std::string dir = test::TempDir("vision_refuse");
  const auto run = [&](const std::string& data, const std::string& targets) {
    return test::RunCommand(std::string(ST_BINARY) + " finetune --model-id " + kModel +
                            " --dataset " + data + " --lora-rank 4 --lora-target-modules '" +
                            targets + "' --no-dashboard --storage-path " + dir + " --run-name r");
  };
  const std::string images = kDir + "/data/train.parquet --dataset-split train";
  struct Case {
    std::string data, targets, want;
  } cases[] = {
      // PEFT refuses the wrapper too; its Linear is q_proj.linear.
      {images, "q_proj.linear", "select only the vision tower's linears: add a text target"},
      {images, "qkv_proj", "in the vision tower q_proj.linear"},
      {images, "audio_proj", "the audio tower stays frozen"},
      // A text-only set never runs the tower.
      {ST_FIXTURE_DIR "/chat/messages_records.jsonl", "q_proj,q_proj.linear", "has no image parts"},
  };
  for (const Case& c : cases) {
    const test::Ran ran = run(c.data, c.targets);
    EXPECT_NE(ran.code, 0) << c.targets << ": " << ran.out;
    EXPECT_NE(ran.out.find(c.want), std::string::npos) << c.targets << ": " << ran.out;
    // One error line (a refusal found while the workers read the data comes after the job's
    // start lines).
    size_t errors = 0;
    for (size_t at = ran.out.find("error:"); at != std::string::npos;
         at = ran.out.find("error:", at + 1))
      ++errors;
    EXPECT_EQ(errors, 1u) << c.targets << ": " << ran.out;
  }
}

// --modules-to-save embedding_projection trains the tower's projection in full beside text LoRA,
// as PEFT's modules_to_save: the adapter file carries the trained copy under PEFT's name, evaluate
// and export apply it; names the tower cannot train in full are refused.
TEST(VisionChatData, ModulesToSaveTrainsTheProjection) {
  const std::string dir = test::TempDir("vision_mts");
  const test::Ran ran = test::RunCommand(
      std::string(ST_BINARY) + " finetune --model-id " + kModel + " --dataset " + kDir +
      "/data/train.parquet --dataset-split train --eval-dataset " + kDir +
      "/data/train.jsonl --eval-split train --max-seq-len 256 --batch-size-per-device 1 "
      "--topology 2 --lora-rank 4 --modules-to-save embedding_projection --lr 1e-2 "
      "--num-epochs 4 --precision fp32 --no-dashboard --progress off --storage-path " +
      dir + " --run-name m");
  ASSERT_EQ(ran.code, 0) << ran.out;
  EXPECT_NE(ran.out.find(": the tower frozen, the projection trained in full (modules_to_save"),
            std::string::npos)
      << ran.out;
  const std::string ckpt = test::NewestCheckpoint(dir + "/m");
  std::ifstream config_file(ckpt + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["modules_to_save"], nlohmann::json({"embed_vision.embedding_projection"}));
  auto adapter = SafeTensorsFile::Open(ckpt + "/adapter_model.safetensors");
  auto base = SafeTensorsFile::Open(kModel + "/model.safetensors");
  ASSERT_TRUE(adapter.ok() && base.ok());
  const std::string name = "model.embed_vision.embedding_projection.weight";
  const SafeTensorInfo* info = base->Find(name);
  ASSERT_NE(info, nullptr);
  std::vector<float> before(static_cast<size_t>(info->shape[0] * info->shape[1])),
      after(before.size());
  ASSERT_TRUE(base->ReadF32(name, before.data(), info->shape).ok());
  ASSERT_TRUE(adapter->ReadF32("base_model.model." + name, after.data(), info->shape).ok());
  double moved = 0;
  for (size_t i = 0; i < before.size(); ++i)
    moved = std::max(moved, double(std::fabs(after[i] - before[i])));
  EXPECT_GT(moved, 1e-3);  // it trained
  const auto evals = test::MetricsRecords(dir + "/m", "eval");
  ASSERT_FALSE(evals.empty());
  const double last = evals.back()["eval_loss"].get<double>();
  // fp32 products: the adapter and its merged export give the same loss (with bf16 products,
  // which --precision auto picks on an AMD CPU with AVX512-BF16, the merged weights are rounded:
  // 3e-4 of the loss apart here, measured).
  const std::string data =
      " --dataset " + kDir + "/data/train.jsonl --max-seq-len 256 --precision fp32 --json";
  const test::Ran eval = test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " +
                                          kModel + " --adapter " + ckpt + data);
  ASSERT_EQ(eval.code, 0) << eval.out;
  const double loss = nlohmann::json::parse(eval.out.substr(eval.out.rfind('{')))["loss"];
  EXPECT_NEAR(loss, last, 2e-3 * last) << eval.out;  // the run's eval: bf16-gathered text LoRA
  const test::Ran exported =
      test::RunCommand(std::string(ST_BINARY) + " export --model-id " + kModel + " --adapter " +
                       ckpt + " --output " + dir + "/merged");
  ASSERT_EQ(exported.code, 0) << exported.out;
  EXPECT_NE(exported.out.find("the vision projection the adapter's"), std::string::npos)
      << exported.out;
  const test::Ran merged =
      test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " + dir + "/merged" + data);
  ASSERT_EQ(merged.code, 0) << merged.out;
  EXPECT_NEAR(nlohmann::json::parse(merged.out.substr(merged.out.rfind('{')))["loss"].get<double>(),
              loss, 1e-5 * loss)
      << merged.out;
  // A GGUF file holds the text model only: the export says the trained projection stays behind.
  const test::Ran gguf =
      test::RunCommand(std::string(ST_BINARY) + " export --model-id " + kModel + " --adapter " +
                       ckpt + " --format gguf --quant f16 " + "--output " + dir + "/m.gguf");
  ASSERT_EQ(gguf.code, 0) << gguf.out;
  EXPECT_NE(gguf.out.find("the adapter's trained vision projection is not in this GGUF file"),
            std::string::npos)
      << gguf.out;
  // The same file under a config that does not list the projection: its copy would be read by
  // nobody, so the adapter is refused with one line naming the tensor.
  const std::string unlisted = dir + "/unlisted";
  std::filesystem::create_directories(unlisted);
  std::filesystem::copy_file(ckpt + "/adapter_model.safetensors",
                             unlisted + "/adapter_model.safetensors");
  nlohmann::json without = config;
  without["modules_to_save"] = nullptr;
  std::ofstream(unlisted + "/adapter_config.json") << without.dump();
  const test::Ran stray = test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " +
                                           kModel + " --adapter " + unlisted + data);
  EXPECT_NE(stray.code, 0) << stray.out;
  EXPECT_NE(stray.out.find("tensor base_model.model." + name + " is not an adapter"),
            std::string::npos)
      << stray.out;

  // Refused with one line: a tower linear named for full training, the audio projection too (this
  // model has no audio tower, so embedding_projection is the vision one alone), a text set.
  const auto refuse = [&](const std::string& data, const std::string& names,
                          const std::string& want) {
    const test::Ran r =
        test::RunCommand(std::string(ST_BINARY) + " finetune --model-id " + kModel + " --dataset " +
                         data + " --lora-rank 4 --modules-to-save '" + names +
                         "' --no-dashboard --storage-path " + dir + " --run-name r");
    EXPECT_NE(r.code, 0) << names << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << names << ": " << r.out;
  };
  const std::string images = kDir + "/data/train.parquet --dataset-split train";
  refuse(images, "input_proj", "is trained only through LoRA");
  // The memory plan reads the same names and says so before anything starts.
  const test::Ran plan = test::RunCommand(
      std::string(ST_BINARY) + " finetune --dry-run --model-id " + kModel + " --dataset " + images +
      " --lora-rank 4 --modules-to-save input_proj --no-dashboard --storage-path " + dir);
  EXPECT_NE(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find("is trained only through LoRA"), std::string::npos) << plan.out;
  refuse(ST_FIXTURE_DIR "/chat/messages_records.jsonl", "embedding_projection",
         "has no image parts");
}

// Bad data: one line naming the record, a non-zero exit, no crash.
TEST(VisionChatData, BadRecordsAreOneLine) {
  const std::string dir = test::TempDir("vision_bad");
  const std::string images = std::string(ST_FIXTURE_DIR) + "/images/";
  auto write = [&](const std::string& name, const std::string& line) {
    std::ofstream(dir + "/" + name) << line << "\n";
    return dir + "/" + name;
  };
  const std::string user_image =
      R"("messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},)"
      R"( {"role": "assistant", "content": "Yes."}])";
  std::ofstream(dir + "/broken.jpg") << "\xff\xd8\xff\xe0 not really a jpeg";
  struct Case {
    std::string file, want;
  } cases[] = {
      {write("fewer.jsonl", "{" + user_image + R"(, "images": []})"),
       "1 image part in its turns and 0 images"},
      {write("corrupt.jsonl", "{" + user_image + R"(, "images": ["broken.jpg"]})"), "broken.jpg"},
      {write("missing.jsonl", "{" + user_image + R"(, "images": ["nowhere.png"]})"), "nowhere.png"},
      {write("format.jsonl", "{" + user_image + R"(, "images": [")" + dir + R"(/fewer.jsonl"]})"),
       "fewer.jsonl"},
  };
  for (const Case& c : cases) {
    const test::Ran ran = test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " +
                                           kModel + " --dataset " + c.file + " --json");
    EXPECT_NE(ran.code, 0) << c.file << ": " << ran.out;
    EXPECT_NE(ran.out.find(c.want), std::string::npos) << c.file << ": " << ran.out;
    EXPECT_NE(ran.out.find("line 1"), std::string::npos) << c.file << ": " << ran.out;
    EXPECT_EQ(std::count(ran.out.begin(), ran.out.end(), '\n'), 1) << c.file << ": " << ran.out;
  }
  // A text-only model: the record's images are refused with the reason.
  const test::Ran text = test::RunCommand(std::string(ST_BINARY) + " evaluate --model-id " +
                                          ST_FIXTURE_DIR + "/tiny_mm --tokenizer " + kModel +
                                          " --dataset " + kDir + "/data/train.jsonl --json");
  EXPECT_NE(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("no vision tower"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace st
