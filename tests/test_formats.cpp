// Data file readers against files written by the real tools: Parquet files written by pyarrow
// (every compression, page version and encoding pyarrow writes by default, nested lists and
// structs, nulls) compared value for value with pyarrow's to_pylist(); JSON Lines, JSON and CSV
// rows; corrupt and truncated files refused with the file and row group named. Fixtures:
// tests/fixtures/datasets (tools/make_dataset_fixtures.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_files.h"
#include "data/dataset.h"
#include "data/formats/csv.h"
#include "data/formats/parquet.h"
#include "data/formats/rows.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kDir = fs::path(ST_FIXTURE_DIR) / "datasets";

std::vector<json> ReadJsonl(const fs::path& p) {
  std::ifstream f(p);
  std::vector<json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<json> ReadAllParquet(const std::string& path,
                                 const std::vector<std::string>& cols = {}) {
  auto f = ParquetFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  std::vector<json> all, rows;
  if (!f.ok()) return all;
  for (int g = 0; g < f->num_row_groups(); ++g) {
    Status s = f->ReadRowGroup(g, cols, &rows);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(static_cast<int64_t>(rows.size()), f->row_group_rows(g));
    for (json& r : rows) all.push_back(std::move(r));
  }
  return all;
}

class ParquetFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ParquetFixture, EqualsPyarrow) {
  const fs::path base = kDir / "parquet" / GetParam();
  const json meta = json::parse(std::ifstream(base.string() + ".meta.json"));
  auto f = ParquetFile::Open(base.string() + ".parquet");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->num_rows(), meta["num_rows"].get<int64_t>());
  EXPECT_EQ(f->num_row_groups(), meta["num_row_groups"].get<int>());
  EXPECT_EQ(f->columns(), meta["columns"].get<std::vector<std::string>>());
  const std::vector<json> want = ReadJsonl(base.string() + ".expected.jsonl");
  const std::vector<json> got = ReadAllParquet(base.string() + ".parquet");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i;
}

INSTANTIATE_TEST_SUITE_P(All, ParquetFixture,
                         ::testing::Values("plain_snappy_v1", "dict_zstd_v2", "dict_gzip_v1",
                                           "plain_none_v2", "dict_fallback_snappy",
                                           "messages_snappy", "messages_zstd_v2", "empty"));

// Only the requested columns are decoded; a missing column is named.
TEST(Parquet, ColumnProjection) {
  const std::string f = (kDir / "parquet" / "dict_zstd_v2.parquet").string();
  const std::vector<json> want = ReadJsonl(kDir / "parquet" / "dict_zstd_v2.expected.jsonl");
  const std::vector<json> got = ReadAllParquet(f, {"response", "id"});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].size(), 2u);
    EXPECT_EQ(got[i]["response"], want[i]["response"]);
    EXPECT_EQ(got[i]["id"], want[i]["id"]);
  }
  auto pf = ParquetFile::Open(f);
  ASSERT_TRUE(pf.ok());
  std::vector<json> rows;
  Status s = pf->ReadRowGroup(0, {"nope"}, &rows);
  EXPECT_NE(s.message().find("no column 'nope'"), std::string::npos) << s.ToString();
}

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("st_formats_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

// Every way a Parquet file can be cut or damaged gives one line naming the file (and, past the
// footer, the row group and column), never a crash.
TEST(Parquet, TruncatedAndCorruptFilesAreNamedErrors) {
  TempDir d;
  const std::string good = Slurp(kDir / "parquet" / "messages_snappy.parquet");
  int refused = 0;
  for (size_t cut : {size_t{0}, size_t{3}, size_t{11}, good.size() / 3, good.size() / 2,
                     good.size() - 9, good.size() - 1}) {
    const std::string f = d.Write("cut.parquet", good.substr(0, cut));
    auto pf = ParquetFile::Open(f);
    ASSERT_FALSE(pf.ok()) << cut;
    EXPECT_NE(pf.status().message().find(f), std::string::npos) << pf.status().ToString();
    ++refused;
  }
  // Damage inside the pages (the footer intact): flip bytes of the column data.
  auto meta_ok = ParquetFile::Open((kDir / "parquet" / "messages_snappy.parquet").string());
  ASSERT_TRUE(meta_ok.ok());
  int errors = 0;
  for (size_t at = 4; at < good.size() / 2; at += 97) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    bad[at + 1] = static_cast<char>(bad[at + 1] ^ 0xa5);
    const std::string f = d.Write("bad.parquet", bad);
    auto pf = ParquetFile::Open(f);
    if (!pf.ok()) continue;
    std::vector<json> rows;
    for (int g = 0; g < pf->num_row_groups(); ++g) {
      Status s = pf->ReadRowGroup(g, {}, &rows);
      if (!s.ok()) {
        ++errors;
        EXPECT_NE(s.message().find("row group " + std::to_string(g)), std::string::npos)
            << s.ToString();
        break;
      }
    }
  }
  EXPECT_GT(errors, 5);  // snappy and the level decoders notice most damage
  EXPECT_EQ(refused, 7);
}

TEST(Csv, QuotesNewlinesNullsAndShortRows) {
  TempDir d;
  const std::string f = d.Write("x.csv",
                                "\xEF\xBB\xBFinstruction,context,response\r\n"
                                "\"a, \"\"quoted\"\"\",,\"multi\nline\"\r\n"
                                "\r\n"
                                "b,NA,None\r\n"
                                "c,ctx\r\n");
  auto rf = RowFile::Open(f);
  ASSERT_TRUE(rf.ok()) << rf.status().ToString();
  EXPECT_EQ(rf->columns(), (std::vector<std::string>{"instruction", "context", "response"}));
  std::vector<json> rows;
  std::vector<int64_t> lines;
  ASSERT_TRUE(rf->ForEach(0, INT64_MAX, {}, [&](const Row& r) {
                  rows.push_back(*r.value);
                  lines.push_back(r.position);
                  return Status::Ok();
                }).ok());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json::parse(R"({"instruction": "a, \"quoted\"", "context": null,
                                     "response": "multi\nline"})"));
  EXPECT_EQ(rows[1], json::parse(R"({"instruction": "b", "context": null, "response": null})"));
  EXPECT_EQ(rows[2], json::parse(R"({"instruction": "c", "context": "ctx", "response": null})"));
  EXPECT_EQ(lines, (std::vector<int64_t>{2, 5, 6}));
  EXPECT_EQ(*rf->CountRows(), 3);

  const std::string wide = d.Write("w.csv", "a,b\n1,2\n1,2,3\n");
  auto wf = RowFile::Open(wide);
  ASSERT_TRUE(wf.ok());
  Status s = wf->ForEach(0, INT64_MAX, {}, [](const Row&) { return Status::Ok(); });
  EXPECT_NE(s.message().find("line 3: 3 fields, the header has 2"), std::string::npos)
      << s.ToString();
  const std::string open = d.Write("o.csv", "a,b\n\"x,2\n");
  auto of = RowFile::Open(open);
  ASSERT_TRUE(of.ok());
  s = of->ForEach(0, INT64_MAX, {}, [](const Row&) { return Status::Ok(); });
  EXPECT_NE(s.message().find("unclosed quote"), std::string::npos) << s.ToString();
  // TSV by extension.
  auto tf = RowFile::Open(d.Write("t.tsv", "instruction\tresponse\nq\ta,b\n"));
  ASSERT_TRUE(tf.ok());
  EXPECT_EQ(tf->format(), DataFormat::kTsv);
  EXPECT_EQ(tf->columns(), (std::vector<std::string>{"instruction", "response"}));
}

// The array under a key of a top-level object (datasets' json loader with field=).
TEST(Json, RecordsUnderAField) {
  TempDir d;
  const std::string f = d.Write("squad.json",
                                R"({"version": "v2", "meta": {"data": [1]}, "data": [
           {"instruction": "q1", "response": "a1", "tags": [1, {"x": null}]},
           {"instruction": "q2", "response": "a2"}, 3], "after": [4]})");
  DatasetOptions o;
  o.path = f;
  o.json_field = "data";
  auto ds = InstructionDataset::Open(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  std::vector<std::string> got;
  DatasetReport rep;
  ASSERT_TRUE(ds->ForEach(
                    [&](const InstructionRecord& r) {
                      got.push_back(r.instruction + "=" + r.response);
                      return Status::Ok();
                    },
                    &rep)
                  .ok());
  EXPECT_EQ(got, (std::vector<std::string>{"q1=a1", "q2=a2"}));
  EXPECT_EQ(rep.skipped, 1);  // the 3
  o.json_field = "missing";
  auto bad = InstructionDataset::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no array under the key 'missing'"), std::string::npos)
      << bad.status().ToString();
}

// messages (role/content) and ShareGPT conversations (from/value) from Parquet, rendered one
// exchange per assistant turn.
TEST(Conversation, MessagesAndShareGptFromParquet) {
  const std::string f = (kDir / "parquet" / "messages_snappy.parquet").string();
  const std::vector<json> want = ReadJsonl(kDir / "parquet" / "messages_snappy.expected.jsonl");
  for (const char* field : {"messages", "conversations"}) {
    DatasetOptions o;
    o.path = f;
    if (std::string(field) == "conversations") o.messages_field = field;
    auto ds = InstructionDataset::Open(o);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->layout(), DatasetLayout::kConversation);
    std::vector<InstructionRecord> recs;
    DatasetReport rep;
    ASSERT_TRUE(ds->ForEach(
                      [&](const InstructionRecord& r) {
                        recs.push_back(r);
                        return Status::Ok();
                      },
                      &rep)
                    .ok());
    // Expected: every row whose turns include an assistant turn.
    size_t k = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const json& turns = want[i][field];
      bool answered = false;
      if (turns.is_array())
        for (const json& t : turns) {
          const std::string role = t.value(t.contains("role") ? "role" : "from", "");
          answered |= role == "assistant" || role == "gpt";
        }
      if (!answered) continue;
      ASSERT_LT(k, recs.size());
      const InstructionRecord& r = recs[k++];
      EXPECT_EQ(r.line, static_cast<int64_t>(i) + 1);
      ASSERT_EQ(r.messages.size(), turns.size());
      for (size_t t = 0; t < turns.size(); ++t) {
        const json& c = turns[t][turns[t].contains("content") ? "content" : "value"];
        EXPECT_EQ(r.messages[t].content, c.is_null() ? "" : c.get<std::string>());
      }
    }
    EXPECT_EQ(k, recs.size());
    EXPECT_EQ(rep.used + rep.skipped, static_cast<int64_t>(want.size()));
  }
  InstructionRecord r;
  r.messages = {{"system", "Be brief."},
                {"user", "Hi"},
                {"assistant", "Hello"},
                {"user", "2+2?"},
                {"assistant", "4"}};
  EXPECT_EQ(PromptTemplate{}.Format(r),
            "Instruction: Hi\nContext: Be brief.\nResponse: Hello\nInstruction: 2+2?\nResponse: 4");
}

// The hub repositories of the fixtures, read as local directories: the same files per split as
// `datasets` resolved, and the same rows for every split expression (golden files written by
// tools/make_dataset_fixtures.py with datasets.load_dataset).
TEST(DataSetRepo, SameFilesAndRowsAsDatasets) {
  const json index = json::parse(std::ifstream(kDir / "hub_golden" / "index.json"));
  ASSERT_GE(index.size(), 13u);
  for (const json& c : index) {
    const std::string dir = (kDir / "hub" / c["dir"].get<std::string>()).string();
    const std::string config = c["config"].is_null() ? "" : c["config"].get<std::string>();
    const std::string split = c["split"].get<std::string>();
    SCOPED_TRACE(c["dir"].get<std::string>() + " " + config + " " + split);
    DatasetOptions o;
    o.path = dir;
    o.config = config;
    o.split = split;
    auto ds = InstructionDataset::Open(o);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    std::vector<std::string> rel;
    for (const std::string& f : ds->files()) rel.push_back(fs::relative(f, dir).generic_string());
    EXPECT_EQ(rel, c["data_files"].get<std::vector<std::string>>());
    EXPECT_EQ(ds->config(), c["resolved_config"].get<std::string>());
    const std::vector<json> want = ReadJsonl(kDir / "hub_golden" / c["file"].get<std::string>());
    std::vector<InstructionRecord> got;
    DatasetReport rep;
    ASSERT_TRUE(ds->ForEach(
                      [&](const InstructionRecord& r) {
                        got.push_back(r);
                        return Status::Ok();
                      },
                      &rep)
                    .ok());
    ASSERT_EQ(got.size(), want.size());
    auto text = [](const json& v) { return v.is_null() ? std::string() : v.get<std::string>(); };
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].instruction, text(want[i]["instruction"])) << i;
      ASSERT_EQ(got[i].context, text(want[i]["context"])) << i;
      ASSERT_EQ(got[i].response, text(want[i]["response"])) << i;
    }
  }
}

TEST(DataSetRepo, ErrorsNameConfigsAndSplits) {
  const std::string dir = (kDir / "hub" / "acme--instruct").string();
  DatasetOptions o;
  o.path = dir;
  o.config = "nope";
  auto r = InstructionDataset::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no config 'nope' (the README defines: default, jsonl, csv)"),
            std::string::npos)
      << r.status().ToString();
  o.config = "jsonl";
  o.split = "test";
  r = InstructionDataset::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("config 'jsonl' has no split 'test' (splits: train)"),
            std::string::npos)
      << r.status().ToString();
  o.path = (kDir / "hub" / "acme--instruct" / "data" / "train-*.parquet").string();
  o.config = "";
  o.split = "train[295:305]";
  r = InstructionDataset::Open(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // a glob: the train split over both shards
  EXPECT_EQ(r->files().size(), 2u);
  o.instruction_field = "question";
  r = InstructionDataset::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no column 'question' (columns: instruction, context, "
                                      "response, category)"),
            std::string::npos)
      << r.status().ToString();
}

TEST(DataFiles, DefaultPatternsAsDatasets) {
  auto files = [](std::vector<std::string> f, const std::string& split) {
    StatusOr<SplitFiles> s = ResolveSplitFiles(f, "", "", split);
    return s.ok() ? s->files : std::vector<std::string>{"ERR " + s.status().message()};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(files({"README.md", "train.jsonl", "test.jsonl"}, "train"), V{"train.jsonl"});
  EXPECT_EQ(files({"README.md", "train.jsonl", "test.jsonl"}, "test"), V{"test.jsonl"});
  EXPECT_EQ(files({"a/my_dev-1.csv", "a/my_train-1.csv"}, "validation"), V{"a/my_dev-1.csv"});
  EXPECT_EQ(files({"training/x.parquet", "training/y.parquet", "eval/z.parquet"}, "test"),
            V{"eval/z.parquet"});
  EXPECT_EQ(files({"data.jsonl", ".hidden/train.jsonl", "__pycache__/x.json"}, "train"),
            V{"data.jsonl"});
  EXPECT_EQ(files({"data/train-00001-of-00002.parquet", "data/train-00000-of-00002.parquet",
                   "data/custom-00000-of-00001.parquet"},
                  "custom"),
            V{"data/custom-00000-of-00001.parquet"});
  // The most common data file type wins (datasets' module inference).
  EXPECT_EQ(files({"x.csv", "y.jsonl", "z.jsonl"}, "train"), (V{"y.jsonl", "z.jsonl"}));
  EXPECT_TRUE(GlobMatch("**/train[-._ 0-9]*", "train.jsonl"));
  EXPECT_TRUE(GlobMatch("**/train[-._ 0-9]*", "a/b/train-1.csv"));
  EXPECT_FALSE(GlobMatch("data/*.parquet", "data/x/y.parquet"));
  EXPECT_TRUE(GlobMatch("data/**", "data/x/y.parquet"));
  // A config's data_dir: its data_files, or the default patterns, are relative to it.
  const std::string dirs =
      "---\nconfigs:\n- config_name: en\n  data_dir: en\n- config_name: de\n  data_dir: de/\n"
      "  data_files:\n  - split: train\n    path: \"*.jsonl\"\n---\n";
  const V repo = {"README.md",  "en/train.parquet", "en/test.parquet",
                  "de/a.jsonl", "de/b.jsonl",       "train.csv"};
  StatusOr<SplitFiles> en = ResolveSplitFiles(repo, dirs, "en", "test");
  ASSERT_TRUE(en.ok()) << en.status().ToString();
  EXPECT_EQ(en->files, V{"en/test.parquet"});
  EXPECT_EQ(en->splits, (V{"train", "test"}));
  StatusOr<SplitFiles> de = ResolveSplitFiles(repo, dirs, "de", "train");
  ASSERT_TRUE(de.ok()) << de.status().ToString();
  EXPECT_EQ(de->files, (V{"de/a.jsonl", "de/b.jsonl"}));
  EXPECT_FALSE(GlobMatch("data/[z-a].parquet", "data/z.parquet"));  // a bad class matches nothing
  const std::string bad_readme =
      "---\nconfigs:\n- config_name: x\n  data_files: \"[z-a]*.csv\"\n---\n";
  StatusOr<SplitFiles> bad = ResolveSplitFiles({"a.csv"}, bad_readme, "", "train");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no data files"), std::string::npos)
      << bad.status().ToString();
  StatusOr<SplitFiles> yaml = ResolveSplitFiles({"a.csv"}, "---\nconfigs: [\n---\n", "", "train");
  ASSERT_FALSE(yaml.ok());
  EXPECT_NE(yaml.status().message().find("README.md: the YAML front matter does not parse"),
            std::string::npos)
      << yaml.status().ToString();
}

}  // namespace
}  // namespace st
