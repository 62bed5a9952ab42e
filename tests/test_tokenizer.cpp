// Tokenizer tests: golden ids / decodes from the `tokenizers` package, transformers and spm_encode
// (tools/make_tokenizer_fixtures.py), plus error handling and tokenizer_config.json behaviour.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer.h"

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
