// A tokenizer from a GGUF file's vocabulary (the tokenizer.ggml.* keys), as llama.cpp's gemma4
// tokenizer reads it (llama-vocab.cpp, tokenizer model "gemma4"): tokens by id, ranked merges
// "a b" (split at the first space after the first byte), token types, the special ids and
// add_bos/add_eos. It is run by the tokenizer.json pipeline (hf_tokenizer.cpp) with the
// components llama.cpp applies to that vocabulary:
//   CONTROL, USER_DEFINED and UNKNOWN tokens are split out of the text first (as added tokens;
//   transformers' behaviour, which is llama.cpp's with parse_special) ->
//   spaces become U+2581 -> the text is split into runs of newlines and runs of anything else ->
//   a run of newlines that is a token is that token, any other run is merged by rank ->
//   characters left outside the vocabulary become <0xXX> byte tokens.
// Decoding maps U+2581 back to spaces and byte tokens back to bytes.
#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "io/gguf.h"

namespace st {
namespace {

using json = nlohmann::json;

// llama_token_type (llama.cpp's include/llama.h).
constexpr int64_t kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4;

StatusOr<const GgufValue*> Required(const GgufFile& f, const std::string& key, GgufValueType type,
                                    GgufValueType elem = GgufValueType::kU32) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return InvalidArgument(StrCat("has no ", key));
  if (v->type != type || (type == GgufValueType::kArray && v->elem != elem))
    return InvalidArgument(StrCat(
        key, " is ", GgufValueTypeName(v->type),
        v->type == GgufValueType::kArray ? StrCat(" of ", GgufValueTypeName(v->elem))
                                         : std::string(),
        ", not ", GgufValueTypeName(type),
        type == GgufValueType::kArray ? StrCat(" of ", GgufValueTypeName(elem)) : std::string()));
  return v;
}

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

// A special id (tokenizer.ggml.bos_token_id and the like) as a token's text for
// tokenizer_config.json, or null when the file has none (llama.cpp then has no such token either).
StatusOr<json> SpecialToken(const GgufFile& f, const std::string& key,
                            const std::vector<std::string>& tokens) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return json(nullptr);
  if (!IsIntegerType(v->type)) return InvalidArgument(StrCat(key, " is not an integer"));
  if (v->i < 0 || v->i >= static_cast<int64_t>(tokens.size()))
    return InvalidArgument(
        StrCat(key, " is ", v->i, ", outside the vocabulary of ", tokens.size(), " tokens"));
  return json(tokens[static_cast<size_t>(v->i)]);
}

StatusOr<Tokenizer> FromGgufImpl(const GgufFile& f) {
  const GgufValue* model = f.Find("tokenizer.ggml.model");
  if (model == nullptr)
    return InvalidArgument(
        "has no tokenizer (tokenizer.ggml.model); give the model's tokenizer with --tokenizer");
  if (model->type != GgufValueType::kString)
    return InvalidArgument("tokenizer.ggml.model is not a string");
  if (model->s != "gemma4")
    return Unimplemented(StrCat("tokenizer.ggml.model '", model->s,
                                "' is not supported (slicetrain reads 'gemma4' vocabularies: "
                                "Gemma 4's and slicetrain's own exports)"));
  ST_ASSIGN_OR_RETURN(
      const GgufValue* tokens_v,
      Required(f, "tokenizer.ggml.tokens", GgufValueType::kArray, GgufValueType::kString));
  ST_ASSIGN_OR_RETURN(
      const GgufValue* merges_v,
      Required(f, "tokenizer.ggml.merges", GgufValueType::kArray, GgufValueType::kString));
  const std::vector<std::string>& tokens = tokens_v->strings;
  if (tokens.empty()) return InvalidArgument("tokenizer.ggml.tokens is empty");
  std::vector<int64_t> types(tokens.size(), 1);
  if (const GgufValue* t = f.Find("tokenizer.ggml.token_type")) {
    if (t->type != GgufValueType::kArray || !IsIntegerType(t->elem))
      return InvalidArgument("tokenizer.ggml.token_type is not an array of integers");
    if (t->ints.size() != tokens.size())
      return InvalidArgument(StrCat("tokenizer.ggml.token_type has ", t->ints.size(),
                                    " entries for ", tokens.size(), " tokens"));
    types = t->ints;
  }

  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& text = tokens[id];
    if (text.empty()) return InvalidArgument(StrCat("token ", id, " is empty"));
    auto [it, fresh] = vocab.emplace(text, static_cast<int64_t>(id));
    if (!fresh)
      return InvalidArgument(
          StrCat("tokens ", it.value().get<int64_t>(), " and ", id, " are both '", text, "'"));
    const int64_t type = types[id];
    if (type == kTokenControl || type == kTokenUserDefined || type == kTokenUnknown)
      added.push_back({{"id", id},
                       {"content", text},
                       {"special", type != kTokenUserDefined},
                       {"normalized", false}});
  }
  json merges = json::array();
  const std::vector<std::string>& ms = merges_v->strings;
  for (size_t r = 0; r < ms.size(); ++r) {
    const size_t sp = ms[r].size() > 1 ? ms[r].find(' ', 1) : std::string::npos;
    if (sp == std::string::npos)
      return InvalidArgument(StrCat("merge ", r, " '", ms[r], "' is not two tokens"));
    merges.push_back({ms[r].substr(0, sp), ms[r].substr(sp + 1)});
  }

  json tj = {
      {"model",
       {{"type", "BPE"},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)},
        {"byte_fallback", true},
        {"fuse_unk", false},
        {"ignore_merges", false}}},
      {"normalizer",
       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}},
      {"pre_tokenizer",
       {{"type", "Split"},
        {"pattern", {{"Regex", "[^\\n]+|[\\n]+"}}},
        {"behavior", "Isolated"},
        {"invert", false}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"added_tokens", std::move(added)},
  };
  HfPipelineOptions options;
  options.whole_newline_runs = true;
  options.kind = "GGUF gemma4 BPE (byte fallback)";
  ST_ASSIGN_OR_RETURN(auto backend, LoadHfTokenizerParsed(tj, options));

  // The special tokens and bos/eos as tokenizer_config.json would give them.
  json cfg = json::object();
  for (const auto& [name, key] : {std::pair{"bos", "bos"}, std::pair{"eos", "eos"},
                                  std::pair{"unk", "unknown"}, std::pair{"pad", "padding"}}) {
    ST_ASSIGN_OR_RETURN(cfg[StrCat(name, "_token")],
                        SpecialToken(f, StrCat("tokenizer.ggml.", key, "_token_id"), tokens));
  }
  // llama.cpp adds bos for gemma4 even when the file says not to (it warns and overrides).
  cfg["add_bos_token"] = !cfg["bos_token"].is_null();
  const GgufValue* add_eos = f.Find("tokenizer.ggml.add_eos_token");
  cfg["add_eos_token"] = add_eos != nullptr && add_eos->type == GgufValueType::kBool &&
                         add_eos->i != 0 && !cfg["eos_token"].is_null();
  return Tokenizer::FromBackend(std::move(backend), cfg.dump());
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::FromGguf(const GgufFile& file) {
  auto t = FromGgufImpl(file);
  if (!t.ok()) return t.status().WithContext(file.path());
  return t;
}

Status Tokenizer::WriteGgufVocabulary(const std::string& gguf_path, const std::string& out_path) {
  ST_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(gguf_path));
  GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    if (key == "general.architecture" || key.rfind("tokenizer.", 0) == 0) w.Set(key, value);
  ST_RETURN_IF_ERROR(w.Write(out_path, [](size_t, const GgufWriter::PutFn&) {
    return Status::Ok();  // no tensors
  }));
  return w.Commit();
}

StatusOr<Tokenizer> Tokenizer::FromGguf(const std::string& path) {
  ST_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  return FromGguf(f);
}

}  // namespace st
