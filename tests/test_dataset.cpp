// Data set tests: split syntax, JSONL / JSON-array readers, layouts, malformed records, prompt
// template, collation against transformers' DataCollatorForLanguageModeling (fixture).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = ST_SOURCE_DIR;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("st_dataset_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::vector<InstructionRecord> ReadAll(const DatasetOptions& o, DatasetReport* rep,
                                       Status* status = nullptr) {
  std::vector<InstructionRecord> out;
  auto ds = InstructionDataset::Open(o);
  if (!ds.ok()) {
    if (status) *status = ds.status();
    return out;
  }
  Status s = ds->ForEach(
      [&](const InstructionRecord& r) {
        out.push_back(r);
        return Status::Ok();
      },
      rep);
  if (status) *status = s;
  return out;
}

TEST(Split, Parse) {
  auto s = ParseSplit("train");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "train");
  EXPECT_FALSE(s->begin.set || s->end.set);
  s = ParseSplit("train[:1024]");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->begin.set);
  EXPECT_EQ(s->end.value, 1024);
  EXPECT_FALSE(s->needs_count());
  s = ParseSplit("validation[100:200]");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "validation");
  EXPECT_EQ(s->begin.value, 100);
  EXPECT_EQ(s->ToString(), "validation[100:200]");
  s = ParseSplit("train[-10%:]");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->begin.percent);
  EXPECT_EQ(s->begin.value, -10);
  EXPECT_TRUE(s->needs_count());
  for (const char* bad :
       {"", "train[", "train[5]", "train[a:b]", "train[:101%]", "[:10]", "train[1:2"}) {
    EXPECT_FALSE(ParseSplit(bad).ok()) << bad;
  }
}

TEST(Split, ResolveLikeDatasets) {
  auto r = [](const char* s, int64_t n) { return ParseSplit(s).value().Resolve(n); };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(r("train", 50), P(0, 50));
  EXPECT_EQ(r("train[:1024]", 50), P(0, 50));
  EXPECT_EQ(r("train[100:200]", 150), P(100, 150));
  EXPECT_EQ(r("train[:10%]", 1000), P(0, 100));
  EXPECT_EQ(r("train[-10%:]", 1000), P(900, 1000));
  EXPECT_EQ(r("train[:10%]", 15), P(0, 2));     // round(1.5) = 2
  EXPECT_EQ(r("train[:10%]", 25), P(0, 2));     // round(2.5) = 2 (halves to even)
  EXPECT_EQ(r("train[-5:]", 3), P(0, 3));       // clamped
  EXPECT_EQ(r("train[10:5]", 100), P(10, 10));  // empty
}

TEST(Dataset, BundledDollySplits) {
  DatasetReport rep;
  DatasetOptions o{kRoot + "/data/tiny_instruct/train.jsonl", "train[:10]", "", "", "", "", "", ""};
  auto recs = ReadAll(o, &rep);
  ASSERT_EQ(recs.size(), 10u);
  EXPECT_EQ(rep.layout, DatasetLayout::kDolly);
  EXPECT_EQ(recs[0].line, 1);
  EXPECT_EQ(rep.skipped, 0);
  o.split = "train[-10%:]";
  recs = ReadAll(o, &rep);
  EXPECT_EQ(recs.size(), 400u);
  EXPECT_EQ(recs.front().line, 3601);
  // A directory resolves <split>.jsonl.
  o.path = kRoot + "/data/tiny_instruct";
  o.split = "train[3990:]";
  recs = ReadAll(o, &rep);
  EXPECT_EQ(recs.size(), 10u);
}

TEST(Dataset, MalformedRecordsSkippedWithLines) {
  TempDir d;
  std::string f =
      d.Write("x.jsonl",
              "{\"instruction\": \"a\", \"context\": \"\", \"response\": \"b\"}\n"
              "\n"
              "{not json\n"
              "{\"instruction\": \"a\"}\n"
              "[1, 2]\n"
              "{\"instruction\": 5, \"response\": \"x\"}\n"
              "{\"instruction\": \"c\", \"context\": \"ctx\", \"response\": \"d\"}\r\n");
  DatasetReport rep;
  Status st;
  auto recs = ReadAll({f, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].line, 7);
  EXPECT_EQ(recs[1].context, "ctx");
  EXPECT_EQ(rep.used, 2);
  EXPECT_EQ(rep.skipped, 4);
  ASSERT_EQ(rep.skipped_lines.size(), 4u);
  EXPECT_EQ(rep.skipped_lines[0], (std::pair<int64_t, std::string>{3, "not valid JSON"}));
  EXPECT_EQ(rep.skipped_lines[1].first, 4);
  EXPECT_EQ(rep.skipped_lines[1].second, "no field 'response'");
  EXPECT_EQ(rep.skipped_lines[2].second, "not a JSON object");
  EXPECT_EQ(rep.skipped_lines[3].second, "field 'instruction' is not a string");
  EXPECT_NE(rep.Summary().find("line 3: not valid JSON"), std::string::npos) << rep.Summary();
}

TEST(Dataset, NoUsableRecordIsAnError) {
  TempDir d;
  std::string f = d.Write("x.jsonl",
                          "{\"instruction\": \"a\", \"response\": \"b\"}\n{\"instruction\": 1, "
                          "\"response\": \"b\"}\n");
  DatasetReport rep;
  Status st;
  ReadAll({f, "train[1:]", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no usable record"), std::string::npos) << st.message();
  std::string g = d.Write("y.jsonl", "{\"text\": \"a\"}\n");
  ReadAll({g, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--instruction-field"), std::string::npos) << st.message();
  ReadAll({d.path() + "/missing.jsonl", "train", "", "", "", "", "", ""}, &rep, &st);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  ReadAll({f, "test", "", "", "", "", "", ""}, &rep, &st);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

TEST(Dataset, AlpacaJsonArrayStreaming) {
  TempDir d;
  std::string f = d.Write("alpaca.json",
                          "[\n"
                          "  {\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"},\n"
                          "  {\"instruction\": \"Add\",\n"
                          "   \"input\": \"[1, 2] {}\", \"output\": \"3 \\\" ]\"},\n"
                          "  {\"instruction\": \"broken\" \"output\": 1},\n"
                          "  {\"instruction\": \"last\", \"output\": \"x\"}\n"
                          "]\n");
  DatasetReport rep;
  Status st;
  auto recs = ReadAll({f, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(rep.layout, DatasetLayout::kAlpaca);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[1].line, 3);
  EXPECT_EQ(recs[1].context, "[1, 2] {}");
  EXPECT_EQ(recs[1].response, "3 \" ]");
  EXPECT_EQ(recs[2].line, 6);
  ASSERT_EQ(rep.skipped_lines.size(), 1u);
  EXPECT_EQ(rep.skipped_lines[0].first, 5);
  std::string bad = d.Write("bad.json", "{\"instruction\": \"a\"}");
  ReadAll({bad, "train", "", "", "", "", "", ""}, &rep, &st);
  EXPECT_FALSE(st.ok());
  std::string open = d.Write("open.json", "[{\"instruction\": \"a\", \"response\": \"b\"},");
  ReadAll({open, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not closed"), std::string::npos);
}

TEST(Dataset, ByteOrderMarkIsIgnored) {
  TempDir d;
  const std::string rec = "{\"instruction\": \"a\", \"response\": \"b\"}";
  DatasetReport rep;
  Status st;
  auto l =
      ReadAll({d.Write("bom.jsonl", "\xEF\xBB\xBF" + rec + "\n"), "train", "", "", "", "", "", ""},
              &rep, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(rep.skipped, 0);
  auto a =
      ReadAll({d.Write("bom.json", "\xEF\xBB\xBF[" + rec + "]"), "train", "", "", "", "", "", ""},
              &rep, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(a.size(), 1u);
}

TEST(Dataset, CustomFields) {
  TempDir d;
  std::string f = d.Write("c.jsonl", "{\"q\": \"question\", \"a\": \"answer\", \"ctx\": \"c\"}\n");
  DatasetReport rep;
  auto recs = ReadAll({f, "train", "q", "ctx", "a", "", "", ""}, &rep);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(rep.layout, DatasetLayout::kCustom);
  EXPECT_EQ(recs[0].instruction, "question");
  EXPECT_EQ(recs[0].context, "c");
  EXPECT_EQ(recs[0].response, "answer");
}

TEST(Prompt, TemplateDefaultsAndOverride) {
  PromptTemplate t;
  ASSERT_TRUE(t.Validate().ok());
  InstructionRecord r;
  r.line = 1, r.instruction = "What is 1 + 1?", r.response = "2";
  EXPECT_EQ(t.Format(r), "Instruction: What is 1 + 1?\nResponse: 2");  // the seed's template
  r.context = "math";
  EXPECT_EQ(t.Format(r), "Instruction: What is 1 + 1?\nContext: math\nResponse: 2");
  t.plain = t.with_context = "<|turn>user\n{instruction} {{{context}}}<turn|>{response}";
  ASSERT_TRUE(t.Validate().ok());
  EXPECT_EQ(t.Format(r), "<|turn>user\nWhat is 1 + 1? {math}<turn|>2");
  t.plain = "{question}";
  EXPECT_FALSE(t.Validate().ok());
  t.plain = "{instruction";
  EXPECT_FALSE(t.Validate().ok());
}

TEST(Collate, MatchesTransformersDataCollator) {
  std::ifstream f(kRoot + "/tests/fixtures/tokenizer/collate_golden.json");
  nlohmann::json g = nlohmann::json::parse(f);
  auto tok = Tokenizer::Load(kRoot + "/data/tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto ds = InstructionDataset::Open({kRoot + "/data/tiny_instruct/train.jsonl",
                                      g["split"].get<std::string>(), "", "", "", "", "", ""});
  ASSERT_TRUE(ds.ok());
  CollateOptions o;
  o.max_seq_len = g["max_seq_len"].get<int64_t>();
  DatasetReport rep;
  // The seed's layout: the plain prompt, every token trained, padded to max_length.
  auto renderer = ExampleRenderer::Create(*tok, TemplateKind::kInstruction, TrainOn::kAuto);
  ASSERT_TRUE(renderer.ok()) << renderer.status().message();
  EXPECT_EQ(renderer->train_on(), TrainOn::kAll);
  auto set = TokenizeDataset(*ds, *renderer, o, &rep);
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_EQ(set->size(), 12);
  EXPECT_GT(set->truncated, 0);  // the fixture includes records longer than T
  std::vector<int64_t> rows(12);
  for (int i = 0; i < 12; ++i) rows[i] = i;
  TokenBatch b = Collate(*set, rows, 0);
  EXPECT_EQ(b.B, 12);
  EXPECT_EQ(b.T, 16);
  auto flat = [](const nlohmann::json& m) {
    std::vector<int32_t> v;
    for (const auto& row : m)
      for (const auto& x : row) v.push_back(x.get<int32_t>());
    return v;
  };
  EXPECT_EQ(b.input_ids, flat(g["input_ids"]));
  EXPECT_EQ(std::vector<int32_t>(b.attention_mask.begin(), b.attention_mask.end()),
            flat(g["attention_mask"]));
  EXPECT_EQ(b.labels, flat(g["labels"]));
  // Reordered rows gather the same data.
  std::vector<int64_t> two = {3, 0};
  TokenBatch b2 = Collate(*set, two, 0);
  EXPECT_TRUE(std::equal(b2.labels.begin(), b2.labels.begin() + 16, b.labels.begin() + 3 * 16));
}

TEST(Collate, TruncationKeepsSpecialsAndLeftPadding) {
  std::string j = R"({"model": {"type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2,
      "a": 3, "b": 4}, "merges": []}})";
  auto tok = Tokenizer::FromJson(j, R"({"add_bos_token": true, "add_eos_token": true})");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("ababab", true, 4), (std::vector<int32_t>{2, 3, 4, 1}));
  EXPECT_EQ(tok->Encode("ababab", true, 1), (std::vector<int32_t>{2}));
  // What the renderer makes of a text: the tokenizer's ids with its eos as the kept tail.
  auto rendered = [&](const std::string& text) {
    RenderedExample e;
    e.ids = tok->Encode(text, true);
    e.trained.assign(e.ids.size(), 1);
    e.tail = 1;
    return e;
  };
  CollateOptions o;
  o.max_seq_len = 5;
  TokenizedSet set;
  AddExample(rendered("ab"), o, &set);
  std::vector<int64_t> row = {0};
  TokenBatch b = Collate(set, row, 0, /*pad_left=*/true);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{0, 2, 3, 4, 1}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{kIgnoreIndex, 2, 3, 4, 1}));
  // Truncation keeps the eos, as transformers' truncation=True does.
  for (int64_t T : {1, 2, 4, 6}) {
    o.max_seq_len = T;
    TokenizedSet cut;
    AddExample(rendered("ababab"), o, &cut);
    EXPECT_EQ(cut.truncated, 1);
    EXPECT_EQ(cut.ids, tok->Encode("ababab", true, T)) << T;
  }
}

// A record longer than kMaxDatasetRecordBytes is refused by line number instead of being held.
TEST(Dataset, HugeRecordIsAnErrorNotAnAllocation) {
  TempDir d;
  const std::string big(kMaxDatasetRecordBytes + 1, 'a');
  std::string f = d.Write("x.jsonl", "{\"instruction\": \"a\", \"response\": \"b\"}\n" + big);
  DatasetReport rep;
  Status st;
  ReadAll({f, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("line 2: the line is longer than 16 MiB"), std::string::npos)
      << st.message();
  std::string g = d.Write("x.json", "[{\"instruction\": \"" + big + "\", \"response\": \"b\"}]");
  ReadAll({g, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("longer than 16 MiB"), std::string::npos) << st.message();
}

// When no record is usable the error says why the first one is not (here: invalid UTF-8).
TEST(Dataset, InvalidUtf8IsNamed) {
  TempDir d;
  std::string f = d.Write("x.jsonl", "{\"instruction\": \"\xff\", \"response\": \"b\"}\n");
  DatasetReport rep;
  Status st;
  ReadAll({f, "train", "", "", "", "", "", ""}, &rep, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("line 1 is not valid JSON (invalid UTF-8)"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace st
