// Tokenizer tests: golden ids / decodes from the `tokenizers` package, transformers and spm_encode
// (tools/make_tokenizer_fixtures.py), plus error handling and tokenizer_config.json behaviour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.h"
#include "io/gguf.h"

namespace st {
namespace {

const std::string kFix = std::string(ST_SOURCE_DIR) + "/tests/fixtures/tokenizer";
const std::string kBundled = std::string(ST_SOURCE_DIR) + "/data/tokenizer";

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<int32_t> Ids(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

// Runs every golden case of a file; returns the number of cases checked.
int CheckGolden(const Tokenizer& tok, const std::string& path, bool check_hf) {
  int n = 0;
  for (const nlohmann::json& c : ReadJsonl(path)) {
    if (c.contains("decode_ids")) {
      std::vector<int32_t> ids = Ids(c["decode_ids"]);
      EXPECT_EQ(tok.Decode(ids, false), c["decoded"].get<std::string>()) << c.dump();
      EXPECT_EQ(tok.Decode(ids, true), c["decoded_skip"].get<std::string>()) << c.dump();
      ++n;
      continue;
    }
    const std::string text = c["text"].get<std::string>();
    std::vector<int32_t> plain = tok.Encode(text, false);
    EXPECT_EQ(plain, Ids(c["ids_plain"])) << "text: " << c["text"].dump();
    std::vector<int32_t> ids = Ids(c["ids"]);
    if (check_hf) {
      EXPECT_EQ(tok.Encode(text, true), Ids(c["hf_ids"])) << "text: " << c["text"].dump();
    } else {
      EXPECT_EQ(tok.Encode(text, true), ids) << "text: " << c["text"].dump();
    }
    EXPECT_EQ(tok.Decode(ids, false), c["decoded"].get<std::string>()) << c["text"].dump();
    EXPECT_EQ(tok.Decode(ids, true), c["decoded_skip"].get<std::string>()) << c["text"].dump();
    ++n;
  }
  return n;
}

TEST(Tokenizer, GoldenGemmaStyleAgainstTokenizersPackage) {
  auto tok = Tokenizer::Load(kFix + "/gemma_style/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->kind(), "tokenizer.json BPE (byte fallback)");
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 3);
  EXPECT_FALSE(tok->TokenToId("<0xF0>").has_value());  // left out on purpose: unk path
  EXPECT_GE(CheckGolden(*tok, kFix + "/gemma_style/golden.jsonl", false), 300);
}

TEST(Tokenizer, GoldenBundledAgainstTokenizersAndTransformers) {
  auto tok = Tokenizer::Load(kBundled);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_LE(tok->vocab_size(), 8192);
  EXPECT_GE(CheckGolden(*tok, kFix + "/bundled_golden.jsonl", true), 300);
}

TEST(Tokenizer, GoldenSentencePieceAgainstSpmEncode) {
  auto tok = Tokenizer::Load(kFix + "/spm/tiny.model");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 1);
  int n = 0;
  for (const nlohmann::json& c : ReadJsonl(kFix + "/spm/golden.jsonl")) {
    EXPECT_EQ(tok->Encode(c["text"].get<std::string>(), false), Ids(c["ids"])) << c["text"].dump();
    ++n;
  }
  EXPECT_GE(n, 200);
  std::vector<int32_t> ids = tok->Encode("hello world", false);
  EXPECT_EQ(tok->Decode(ids), "hello world");
}

TEST(Tokenizer, EmptyTextAndRoundTrip) {
  auto tok = Tokenizer::Load(kBundled);
  ASSERT_TRUE(tok.ok());
  EXPECT_TRUE(tok->Encode("", false).empty());
  EXPECT_EQ(tok->Encode("", true), std::vector<int32_t>{tok->bos_id()});
  for (std::string s :
       {"Instruction: What is 2 + 2?\nResponse: 4", "  two  spaces ",
        "bytes \xF0\x9F\x99\x82 and \xE4\xBD\xA0\xE5\xA5\xBD", "<|turn>user\n<turn|>"}) {
    EXPECT_EQ(tok->Decode(tok->Encode(s, false)), s);
  }
}

TEST(Tokenizer, ConfigAddEosOverridesTemplate) {
  std::string j = Slurp(kBundled + "/tokenizer.json");
  auto plain = Tokenizer::FromJson(j);
  ASSERT_TRUE(plain.ok());
  auto with_eos = Tokenizer::FromJson(j, R"({"add_bos_token": false, "add_eos_token": true})");
  ASSERT_TRUE(with_eos.ok()) << with_eos.status().message();
  std::vector<int32_t> base = plain->Encode("What is 1 + 1?", false);
  std::vector<int32_t> expect = base;
  expect.push_back(with_eos->eos_id());
  EXPECT_EQ(with_eos->Encode("What is 1 + 1?", true), expect);
  // Without config flags the file's template (bos) applies.
  expect = base;
  expect.insert(expect.begin(), plain->bos_id());
  EXPECT_EQ(plain->Encode("What is 1 + 1?", true), expect);
}

TEST(Tokenizer, Errors) {
  auto missing = Tokenizer::Load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
  EXPECT_FALSE(Tokenizer::FromJson("{not json").ok());
  EXPECT_FALSE(Tokenizer::FromJson("{}").ok());
  auto bad_norm = Tokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "normalizer": {"type": "NFKC"}})");
  ASSERT_FALSE(bad_norm.ok());
  EXPECT_NE(bad_norm.status().message().find("NFKC"), std::string::npos);
  auto bad_merge = Tokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("missing from the vocabulary"), std::string::npos);
  auto bad_cfg = Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})",
                                     R"({"add_bos_token": true})");
  ASSERT_FALSE(bad_cfg.ok());
  EXPECT_NE(bad_cfg.status().message().find("no bos token"), std::string::npos);
}

TEST(Tokenizer, MergesByRankLeftmostFirst) {
  // "abab": merge ranks a+b (0) then ab+ab (1) -> one token; "aaa" with a+a -> [aa, a].
  auto tok = Tokenizer::FromJson(R"({"model": {"type": "BPE",
      "vocab": {"a": 0, "b": 1, "ab": 2, "abab": 3, "aa": 4},
      "merges": [["a", "b"], ["ab", "ab"], ["a", "a"]]}})");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("abab", false), (std::vector<int32_t>{3}));
  EXPECT_EQ(tok->Encode("aaa", false), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(tok->Encode("aab", false), (std::vector<int32_t>{0, 2}));
}

TEST(Tokenizer, ManyAddedTokensLeftmostLongest) {
  // Gemma ships thousands of reserved added tokens; matching must pick the longest at the leftmost
  // position ("<unused12>" over "<unused1>").
  nlohmann::json j;
  j["model"] = {
      {"type", "BPE"}, {"vocab", {{"x", 0}, {"<", 1}}}, {"merges", nlohmann::json::array()}};
  j["added_tokens"] = nlohmann::json::array();
  for (int i = 0; i < 6000; ++i)
    j["added_tokens"].push_back({{"id", 10 + i},
                                 {"content", "<unused" + std::to_string(i) + ">"},
                                 {"special", true},
                                 {"normalized", false}});
  auto tok = Tokenizer::FromJson(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("<unused12>x<unused1><unused5999><", false),
            (std::vector<int32_t>{22, 0, 11, 6009, 1}));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{22, 0}, true), "x");
}

// Files the loader used to accept silently or crash on (tests/bad_inputs/tokenizer has more).
TEST(Tokenizer, InconsistentIdsAndWrongTypesAreErrors) {
  auto tok = [](nlohmann::json model, nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json j = {{"model", model}};
    j.update(extra);
    return Tokenizer::FromJson(j.dump());
  };
  nlohmann::json bpe = {
      {"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", nlohmann::json::array()}};
  ASSERT_TRUE(tok(bpe).ok());
  nlohmann::json dup = bpe;
  dup["vocab"]["c"] = 1;  // two tokens, one id
  EXPECT_NE(tok(dup).status().message().find("gives id 1 to both"), std::string::npos);
  nlohmann::json sparse = bpe;
  sparse["vocab"]["c"] = 2000000000;  // would size the id tables at 2^31 entries
  EXPECT_NE(tok(sparse).status().message().find("(nearly) dense"), std::string::npos);
  nlohmann::json type = bpe;
  type["type"] = nlohmann::json::array({"BPE"});  // threw nlohmann::type_error
  EXPECT_EQ(tok(type).status().code(), StatusCode::kInvalidArgument);
  nlohmann::json pp = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {900000}}}}}}};
  EXPECT_NE(tok(bpe, {{"post_processor", pp}}).status().message().find("outside the vocabulary"),
            std::string::npos);
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// A GGUF file holding only a vocabulary (tokenizer.ggml.*), as llama.cpp's vocab files do.
struct GgufVocabFile {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<std::string> merges;
  std::string model = "gemma4";
  int64_t bos = 2;
  bool with_merges = true, with_model = true;

  // The hand-made vocabulary of the tests below; byte tokens <0x00>..<0xFF> from id 14.
  static GgufVocabFile Small() {
    GgufVocabFile v;
    v.tokens = {"<pad>",
                "<eos>",
                "<bos>",
                "<unk>",
                "<|turn>",
                "<|channel>",
                "\n",
                "\n\n",
                "\n\n\n",
                "a",
                "b",
                "ab",
                "\xe2\x96\x81",
                "\xe2\x96\x81"
                "a"};
    v.types = {3, 3, 3, 2, 3, 4, 1, 1, 1, 1, 1, 1, 1, 1};
    static const char* kHex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', '\0'};
      v.tokens.emplace_back(name);
      v.types.push_back(6);
    }
    // "\n\n\n" has no merge of its own: merges alone would make it "\n\n" "\n".
    v.merges = {"\n \n", "a b", "\xe2\x96\x81 a"};
    return v;
  }

  std::string Write(const std::string& path) const {
    GgufWriter w;
    w.Set("general.architecture", GgufValue::String("gemma4"));
    if (with_model) w.Set("tokenizer.ggml.model", GgufValue::String(model));
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
    w.Set("tokenizer.ggml.token_type", GgufValue::IntArray(GgufValueType::kI32, types));
    if (with_merges) w.Set("tokenizer.ggml.merges", GgufValue::StringArray(merges));
    w.Set("tokenizer.ggml.bos_token_id", GgufValue::Int(GgufValueType::kU32, bos));
    w.Set("tokenizer.ggml.eos_token_id", GgufValue::Int(GgufValueType::kU32, 1));
    w.Set("tokenizer.ggml.unknown_token_id", GgufValue::Int(GgufValueType::kU32, 3));
    w.Set("tokenizer.ggml.padding_token_id", GgufValue::Int(GgufValueType::kU32, 0));
    w.Set("tokenizer.ggml.add_bos_token", GgufValue::Int(GgufValueType::kBool, 1));
    EXPECT_TRUE(w.Write(path, [](size_t, const GgufWriter::PutFn&) { return Status::Ok(); }).ok());
    EXPECT_TRUE(w.Commit().ok());
    return path;
  }
};

std::string GgufTempDir() {
  const auto dir =
      std::filesystem::temp_directory_path() / ("st_gguf_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

// llama.cpp's gemma4 rules (llama-vocab.cpp), each on a case where a plain tokenizer.json
// pipeline would give other ids.
TEST(GgufTokenizer, LlamaCppsGemma4RulesOnAHandMadeVocabulary) {
  const std::string dir = GgufTempDir();
  StatusOr<Tokenizer> t = Tokenizer::Load(GgufVocabFile::Small().Write(dir + "/vocab.gguf"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  using V = std::vector<int32_t>;
  const int32_t byte0 = 14;
  EXPECT_EQ(t->Encode("ab", false), V{11});
  EXPECT_EQ(t->Encode("ba", false), (V{10, 9}));
  EXPECT_EQ(t->Encode(" a", false), V{13});  // spaces are U+2581
  // A run of newlines that is a token is that token, not what the merges make of it.
  EXPECT_EQ(t->Encode("a\n\n\nb", false), (V{9, 8, 10}));
  // One that is not a token is merged.
  EXPECT_EQ(t->Encode("\n\n\n\n", false), (V{7, 7}));
  // Text never merges across a newline: "a" and "b" stay apart.
  EXPECT_EQ(t->Encode("a\nb", false), (V{9, 6, 10}));
  // Characters outside the vocabulary become byte tokens.
  EXPECT_EQ(t->Encode("\xc3\xa9", false), (V{byte0 + 0xC3, byte0 + 0xA9}));
  // CONTROL and USER_DEFINED tokens are split out of the text first.
  EXPECT_EQ(t->Encode("<|turn>ab<|channel>", false), (V{4, 11, 5}));
  EXPECT_EQ(t->Encode("ab"), (V{2, 11}));  // add_bos_token
  EXPECT_EQ(t->Decode(V{2, 13, 8, byte0 + 0xC3, byte0 + 0xA9}), "<bos> a\n\n\n\xc3\xa9");
  EXPECT_EQ(t->Decode(V{2, 13, 4, 5}, /*skip_special_tokens=*/true), " a<|channel>");
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_EQ(t->eos_id(), 1);
  EXPECT_EQ(t->unk_id(), 3);
  EXPECT_EQ(t->vocab_size(), 270);
  std::filesystem::remove_all(dir);
}

TEST(GgufTokenizer, BrokenVocabulariesAreOneLineEach) {
  const std::string dir = GgufTempDir();
  struct Case {
    std::string name, says;
    std::function<void(GgufVocabFile*)> spoil;
  };
  const std::vector<Case> cases = {
      {"no_model", "has no tokenizer", [](GgufVocabFile* v) { v->with_model = false; }},
      {"llama", "'llama' is not supported", [](GgufVocabFile* v) { v->model = "llama"; }},
      {"no_merges", "has no tokenizer.ggml.merges",
       [](GgufVocabFile* v) { v->with_merges = false; }},
      {"types", "token_type has 13 entries for 270 tokens",
       [](GgufVocabFile* v) { v->types.resize(13); }},
      {"duplicate", "tokens 9 and 10 are both 'a'",
       [](GgufVocabFile* v) { v->tokens[10] = v->tokens[9]; }},
      {"bos", "bos_token_id is 999, outside the vocabulary",
       [](GgufVocabFile* v) { v->bos = 999; }},
      {"one_token_merge", "merge 1 'ab' is not two tokens",
       [](GgufVocabFile* v) { v->merges[1] = "ab"; }},
      {"unknown_merge", "merge 3 uses a token missing from the vocabulary",
       [](GgufVocabFile* v) { v->merges.push_back("x y"); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GgufVocabFile v = GgufVocabFile::Small();
    c.spoil(&v);
    const std::string path = v.Write(dir + "/" + c.name + ".gguf");
    const Status s = Tokenizer::Load(path).status();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace st
