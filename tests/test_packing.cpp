// Records to rows: the gemma-chat template and its response masks against transformers' and TRL's
// golden output (tools/make_chat_fixtures.py), the instruction template's response masks, and the
// epoch plans of dynamic padding, length grouping and packing (every example once, deterministic
// from seed and epoch, first-fit-decreasing bins, packed rows' positions and labels).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/batching.h"
#include "data/chat_template.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {
namespace {

const std::string kRoot = ST_SOURCE_DIR;

std::vector<nlohmann::json> GoldenLines(const std::string& kind) {
  std::ifstream f(kRoot + "/tests/fixtures/chat/gemma_chat.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line))
    if (auto j = nlohmann::json::parse(line); j["kind"] == kind) out.push_back(std::move(j));
  return out;
}

// Renders every record of a file through the data set reader, as finetune does.
std::vector<RenderedExample> RenderFile(const std::string& file, const ExampleRenderer& r) {
  DatasetOptions o;
  o.path = kRoot + "/tests/fixtures/chat/" + file;
  auto ds = InstructionDataset::Open(o);
  EXPECT_TRUE(ds.ok()) << ds.status().message();
  std::vector<RenderedExample> out;
  DatasetReport rep;
  Status st = ds->ForEach(
      [&](const InstructionRecord& rec) {
        out.emplace_back();
        return r.Render(rec, &out.back());
      },
      &rep);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(rep.skipped, 0);
  return out;
}

// gemma-chat equals transformers' apply_chat_template token for token, and the trained tokens
// equal TRL's assistant_only_loss labels, on 100 Dolly records and 100 conversations whose
// renderings the fixture script also compared with Google's own template.
TEST(ChatTemplate, GemmaChatMatchesTransformersAndTrl) {
  auto tok = Tokenizer::Load(kRoot + "/data/tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto renderer = ExampleRenderer::Create(*tok, TemplateKind::kAuto, TrainOn::kAuto);
  ASSERT_TRUE(renderer.ok()) << renderer.status().message();
  EXPECT_EQ(renderer->kind(), TemplateKind::kGemmaChat);
  EXPECT_EQ(renderer->train_on(), TrainOn::kResponses);
  int64_t checked = 0, merged_header = 0;
  for (const auto& [file, kind] : {std::pair{"dolly_records.jsonl", "dolly"},
                                   std::pair{"messages_records.jsonl", "messages"}}) {
    const std::vector<nlohmann::json> golden = GoldenLines(kind);
    const std::vector<RenderedExample> mine = RenderFile(file, *renderer);
    ASSERT_EQ(mine.size(), golden.size()) << file;
    ASSERT_EQ(golden.size(), 100u);
    for (size_t i = 0; i < golden.size(); ++i) {
      const auto ids = golden[i]["input_ids"].get<std::vector<int32_t>>();
      const auto mask = golden[i]["assistant_mask"].get<std::vector<uint8_t>>();
      ASSERT_EQ(mine[i].ids, ids) << kind << " " << i << ": " << golden[i]["text"];
      ASSERT_EQ(mine[i].trained, mask) << kind << " " << i << ": " << golden[i]["text"];
      ++checked;
      for (size_t t = 1; t < ids.size(); ++t)
        merged_header += mask[t] && !mask[t - 1] && tok->IdToToken(ids[t]).front() == '\n';
    }
  }
  EXPECT_EQ(checked, 200);
  // The fixture script compared every rendering with Google's template (TRL's copy) and says so;
  // it fails instead of skipping when that file is missing.
  std::ifstream g(kRoot + "/tests/fixtures/chat/google_template.json");
  const nlohmann::json google = nlohmann::json::parse(g, nullptr, false);
  ASSERT_TRUE(google.is_object()) << "tests/fixtures/chat/google_template.json";
  EXPECT_EQ(google.value("template", ""), "trl/chat_templates/gemma4_v5.jinja");
  EXPECT_EQ(google.value("sha256", "").size(), 64u);
  EXPECT_EQ(google.value("records_compared", 0), checked);
  EXPECT_EQ(google.value("generation_prompts_compared", 0), checked);
  EXPECT_GT(merged_header, 0) << "the golden set should hold a token that merges the header's "
                                 "newline with the answer";
  // --train-on all: the same tokens, every one trained.
  auto all = ExampleRenderer::Create(*tok, TemplateKind::kGemmaChat, TrainOn::kAll);
  ASSERT_TRUE(all.ok());
  const std::vector<RenderedExample> every = RenderFile("dolly_records.jsonl", *all);
  const std::vector<nlohmann::json> golden = GoldenLines("dolly");
  for (size_t i = 0; i < every.size(); ++i) {
    EXPECT_EQ(every[i].ids, golden[i]["input_ids"].get<std::vector<int32_t>>());
    EXPECT_TRUE(std::all_of(every[i].trained.begin(), every[i].trained.end(),
                            [](uint8_t v) { return v == 1; }));
  }
}

TEST(ChatTemplate, ErrorsAndStripping) {
  auto tok = Tokenizer::Load(kRoot + "/data/tokenizer");
  ASSERT_TRUE(tok.ok());
  auto r = ExampleRenderer::Create(*tok, TemplateKind::kGemmaChat, TrainOn::kResponses);
  ASSERT_TRUE(r.ok());
  InstructionRecord late_system;
  late_system.messages = {{"user", "hi"}, {"system", "be brief"}, {"assistant", "ok"}};
  RenderedExample e;
  Status st = r->Render(late_system, &e);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("system"), std::string::npos) << st.message();
  // Python's str.strip: Unicode spaces and the separators U+001C..U+001F, not U+200B.
  EXPECT_EQ(StripPythonWhitespace("\u00a0\u2003 a b\t\n\x1f"), "a b");
  EXPECT_EQ(StripPythonWhitespace("\u200ba\u200b"), "\u200ba\u200b");
  EXPECT_EQ(StripPythonWhitespace(" \u3000 "), "");
  // A tokenizer without Gemma 4's turn tokens: auto falls back, gemma-chat is refused.
  auto plain = Tokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "a": 3},
          "merges": []}})",
      R"({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"})");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  auto fallback = ExampleRenderer::Create(*plain, TemplateKind::kAuto, TrainOn::kAuto);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->kind(), TemplateKind::kInstruction);
  EXPECT_EQ(fallback->train_on(), TrainOn::kAll);
  auto refused = ExampleRenderer::Create(*plain, TemplateKind::kGemmaChat, TrainOn::kAuto);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--template instruction"), std::string::npos);
  EXPECT_FALSE(ParseTemplateKind("chatml").ok());
  EXPECT_FALSE(ParseTrainOn("prompts").ok());
}

// The instruction template with --train-on responses: the trained tokens are those that cover the
// responses' characters (and only those), for plain records and for every turn of a conversation.
TEST(ChatTemplate, InstructionTemplateTrainsOnResponses) {
  auto tok = Tokenizer::Load(kRoot + "/data/tokenizer");
  ASSERT_TRUE(tok.ok());
  auto r = ExampleRenderer::Create(*tok, TemplateKind::kInstruction, TrainOn::kResponses);
  ASSERT_TRUE(r.ok());
  InstructionRecord a;
  a.instruction = "What is 23 + 58?";
  a.response = "81";
  InstructionRecord conv;
  conv.messages = {{"user", "Reverse the word \"planet\"."},
                   {"assistant", "tenalp"},
                   {"user", "How many letters are in \"banana\"?"},
                   {"assistant", "6"}};
  for (const InstructionRecord& rec : {a, conv}) {
    RenderedExample e;
    ASSERT_TRUE(r->Render(rec, &e).ok());
    EXPECT_EQ(e.ids, tok->Encode(PromptTemplate{}.Format(rec), true));
    std::string trained_text;
    std::vector<int32_t> run;
    std::vector<std::string> runs;
    for (size_t i = 0; i <= e.ids.size(); ++i) {
      if (i < e.ids.size() && e.trained[i]) {
        run.push_back(e.ids[i]);
      } else if (!run.empty()) {
        runs.push_back(tok->Decode(run, true));
        run.clear();
      }
    }
    const std::vector<std::string> want = rec.messages.empty()
                                              ? std::vector<std::string>{"81"}
                                              : std::vector<std::string>{"tenalp", "6"};
    ASSERT_EQ(runs.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_NE(runs[k].find(want[k]), std::string::npos) << runs[k];
  }
}

// A set of n examples of the given lengths (ids = example index, every token trained).
TokenizedSet MakeSet(const std::vector<int64_t>& lengths, int64_t T) {
  TokenizedSet s;
  s.T = T;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> ids(static_cast<size_t>(lengths[i]), static_cast<int32_t>(i + 10));
    std::vector<uint8_t> trained(ids.size(), 1);
    s.Add(ids, trained);
  }
  return s;
}

std::vector<int64_t> RandomLengths(int64_t n, int64_t max, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> l(static_cast<size_t>(n));
  for (auto& x : l) x = 1 + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(max)));
  return l;
}

// Every mode but max_length uses each example exactly once an epoch, on every world size and
// batch; every rank runs the same number of steps; the plan depends only on (seed, epoch).
TEST(Batching, EveryExampleOnceAndDeterministic) {
  const TokenizedSet set = MakeSet(RandomLengths(203, 120, 1), 128);
  for (int mode = 0; mode < 3; ++mode)
    for (int world : {1, 2, 3})
      for (int64_t batch : {1, 4}) {
        SCOPED_TRACE(testing::Message()
                     << "mode " << mode << " world " << world << " batch " << batch);
        BatchingOptions o;
        o.max_seq_len = 128;
        o.batch_size = batch;
        o.packing = mode == 2;
        o.group_by_length = mode == 1;
        o.seed = 5;
        std::vector<int64_t> seen(static_cast<size_t>(set.size()), 0);
        size_t steps = 0;
        for (int r = 0; r < world; ++r) {
          const auto plan = PlanEpoch(set, o, world, r, 3);
          if (r == 0) steps = plan.size();
          EXPECT_EQ(plan.size(), steps);
          EXPECT_EQ(plan, PlanEpoch(set, o, world, r, 3));
          EXPECT_NE(plan, PlanEpoch(set, o, world, r, 4));
          for (const StepRows& step : plan) {
            EXPECT_LE(static_cast<int64_t>(step.size()), batch);
            for (const auto& row : step) {
              int64_t fill = 0;
              for (int64_t i : row) ++seen[static_cast<size_t>(i)], fill += set.length(i);
              EXPECT_LE(fill, 128);
              if (!o.packing) {
                EXPECT_EQ(row.size(), 1u);
              }
            }
          }
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int64_t c) { return c == 1; }));
      }
}

// First fit decreasing against a direct O(n^2) rendering of its definition.
TEST(Batching, FirstFitDecreasing) {
  for (uint64_t seed : {1, 2, 3}) {
    const std::vector<int64_t> lengths = RandomLengths(500, 200, seed);
    std::vector<int64_t> order(lengths.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng rng(seed);
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.Below(i + 1)]);
    const auto bins = PackFirstFitDecreasing(order, lengths, 256);
    std::vector<int64_t> sorted = order;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    std::vector<std::vector<int64_t>> want;
    std::vector<int64_t> free;
    for (int64_t i : sorted) {
      size_t b = 0;
      while (b < free.size() && free[b] < lengths[i]) ++b;
      if (b == free.size()) want.emplace_back(), free.push_back(256);
      want[b].push_back(i);
      free[b] -= lengths[i];
    }
    EXPECT_EQ(bins, want);
    int64_t total = 0;
    for (int64_t l : lengths) total += l;
    // Near-full rows: FFD needs at most 11/9 OPT + 1 bins; here well under 3% waste.
    EXPECT_LT(static_cast<double>(bins.size()) * 256, 1.03 * total + 256) << bins.size();
  }
}

// transformers' get_length_grouped_indices (tools/make_batching_fixtures.py): torch's random
// permutation cannot be slicetrain's, so each case feeds the permutation transformers drew to
// LengthGroupedOrder and compares the whole order: mega batches, the stable sort by decreasing
// length (ties in their permutation order), and the longest example moved to the front (the first
// mega batch holding the maximum when several do). With transformers' default mega-batch size
// (world 1, no gradient accumulation), PlanEpoch's order is LengthGroupedOrder of its own
// permutation with that size.
TEST(Batching, LengthGroupedOrder) {
  std::ifstream f(kRoot + "/tests/fixtures/batching/length_grouped.json");
  const nlohmann::json golden = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(golden.is_object());
  ASSERT_GE(golden["cases"].size(), 9u);
  for (const nlohmann::json& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto lengths = c["lengths"].get<std::vector<int64_t>>();
    const auto perm = c["permutation"].get<std::vector<int64_t>>();
    const auto expected = c["expected"].get<std::vector<int64_t>>();
    const int64_t mb = c["megabatch"].get<int64_t>(), n = static_cast<int64_t>(lengths.size());
    const std::vector<int64_t> out = LengthGroupedOrder(perm, lengths, mb);
    EXPECT_EQ(out, expected);
    // The same, as properties: a permutation, the longest first, and every adjacent pair inside a
    // mega batch non-increasing except where the swap put mega batch 0's head (then the first
    // pair of the mega batch the longest came from).
    std::vector<int64_t> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), int64_t{0});
    EXPECT_EQ(sorted, all);
    EXPECT_EQ(lengths[out[0]], *std::max_element(lengths.begin(), lengths.end()));
    int64_t unsorted = 0;
    for (int64_t g = 0; g < n; g += mb)
      for (int64_t i = g + 1; i < std::min(n, g + mb); ++i)
        if (lengths[out[i - 1]] < lengths[out[i]]) {
          EXPECT_EQ(i, g + 1) << "position " << i;
          EXPECT_NE(std::find(perm.begin() + g, perm.begin() + std::min(n, g + mb), out[0]),
                    perm.begin() + std::min(n, g + mb))
              << "an unsorted pair in mega batch " << g / mb
              << ", which is not where the longest came from";
          ++unsorted;
        }
    EXPECT_LE(unsorted, 1);
    // transformers' default mega-batch size, through PlanEpoch: with world 1, the steps' examples
    // in order are LengthGroupedOrder(PlanEpoch's permutation, lengths, that size).
    if (c["mega_batch_mult"].is_null()) {
      const int64_t bs = c["batch_size"].get<int64_t>();
      const TokenizedSet set = MakeSet(lengths, *std::max_element(lengths.begin(), lengths.end()));
      BatchingOptions o;
      o.max_seq_len = set.T;
      o.batch_size = bs;
      o.group_by_length = true;
      o.seed = 3;
      std::vector<int64_t> planned;
      for (const StepRows& step : PlanEpoch(set, o, 1, 0, 0))
        for (const std::vector<int64_t>& row : step)
          planned.insert(planned.end(), row.begin(), row.end());
      EXPECT_EQ(planned, LengthGroupedOrder(EpochPermutation(n, o.seed, 0), lengths, mb));
    }
  }
}

// Packed rows: positions restart with each example, its first token is no target, padding
// continues the last example's positions; dynamic padding rounds to 8; a rank without examples
// runs one padding row.
TEST(Batching, CollatedRows) {
  TokenizedSet set = MakeSet({3, 5, 6, 10}, 16);
  set.trained[set.offsets[1] + 2] = 0;  // an untrained token inside example 1
  BatchingOptions o;
  o.max_seq_len = 16;
  o.packing = true;
  o.pad_id = 0;
  const TokenBatch b = CollateStep(set, {{0, 1, 2}, {3}}, o);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.T, 16);
  EXPECT_EQ(b.real_tokens, 24);
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2,  3,  4,  5,  6,  7,
                                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(b.position_ids, pos);
  const int32_t I = kIgnoreIndex;
  const std::vector<int32_t> labels = {I, 10, 10, I,  11, I,  11, 11, I,  12, 12, 12, 12, 12, I, I,
                                       I, 13, 13, 13, 13, 13, 13, 13, 13, 13, I,  I,  I,  I,  I, I};
  EXPECT_EQ(b.labels, labels);
  EXPECT_EQ(std::accumulate(b.attention_mask.begin(), b.attention_mask.end(), 0), 24);
  // Dynamic padding: the batch's longest (10) rounded up to 16; max_length: --max-seq-len.
  o.packing = false;
  o.max_seq_len = 24;
  EXPECT_EQ(CollateStep(set, {{3}, {0}}, o).T, 16);
  EXPECT_EQ(CollateStep(set, {{0}}, o).T, 8);
  o.padding = PaddingMode::kMaxLength;
  EXPECT_EQ(CollateStep(set, {{0}}, o).T, 24);
  const TokenBatch none = CollateStep(set, {}, o);
  EXPECT_EQ(none.B, 1);
  EXPECT_EQ(none.real_tokens, 0);
  EXPECT_TRUE(std::all_of(none.labels.begin(), none.labels.end(),
                          [](int32_t l) { return l == kIgnoreIndex; }));
}

// --packing split: an example longer than T becomes pieces of T; otherwise it is cut.
TEST(Batching, SplitOrTruncateLongExamples) {
  RenderedExample e;
  for (int i = 0; i < 23; ++i) e.ids.push_back(i), e.trained.push_back(1);
  CollateOptions o;
  o.max_seq_len = 10;
  TokenizedSet cut, split;
  AddExample(e, o, &cut);
  EXPECT_EQ(cut.size(), 1);
  EXPECT_EQ(cut.truncated, 1);
  o.split_long = true;
  AddExample(e, o, &split);
  EXPECT_EQ(split.size(), 3);
  EXPECT_EQ(split.split, 1);
  EXPECT_EQ(split.length(2), 3);
  EXPECT_EQ(split.ids, e.ids);
}

}  // namespace
}  // namespace st
