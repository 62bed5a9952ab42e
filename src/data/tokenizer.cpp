// Tokenizer: picks the backend for a path and applies tokenizer_config.json (special tokens,
// bos/eos).
#include "data/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gguf.h"

namespace st {
namespace {

namespace fs = std::filesystem;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(StrCat(path, ": cannot open"));
  std::ostringstream os;
  os << f.rdbuf();
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  return os.str();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A special token in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> TokenField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

bool HasTokenizerFiles(const std::string& dir) {
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer.gguf"})
    if (fs::is_regular_file(fs::path(dir) / f, ec)) return true;
  return false;
}

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  std::string json_path, model_path, config_path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json"))
      json_path = (fs::path(path) / "tokenizer.json").string();
    else if (fs::exists(fs::path(path) / "tokenizer.model"))
      model_path = (fs::path(path) / "tokenizer.model").string();
    else if (fs::exists(fs::path(path) / "tokenizer.gguf"))
      return FromGguf((fs::path(path) / "tokenizer.gguf").string());
    else
      return NotFound(
          StrCat(path, ": no tokenizer.json, tokenizer.model or tokenizer.gguf in this directory"));
    config_path = (fs::path(path) / "tokenizer_config.json").string();
  } else if (!fs::exists(path, ec)) {
    return NotFound(StrCat(path, ": no such file or directory"));
  } else if (IsGgufFile(path)) {
    return FromGguf(path);
  } else if (EndsWith(path, ".model")) {
    model_path = path;
    config_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
  } else {
    json_path = path;
    config_path = (fs::path(path).parent_path() / "tokenizer_config.json").string();
  }
  std::string config;
  if (fs::exists(config_path, ec)) {
    ST_ASSIGN_OR_RETURN(config, ReadFile(config_path));
  }
  Tokenizer t;
  if (!json_path.empty()) {
    ST_ASSIGN_OR_RETURN(std::string text, ReadFile(json_path));
    auto b = LoadHfTokenizerJson(text);
    if (!b.ok()) return b.status().WithContext(json_path);
    t.backend_ = std::move(b).value();
  } else {
    auto b = LoadSentencePieceModel(model_path);
    if (!b.ok()) return b.status().WithContext(model_path);
    t.backend_ = std::move(b).value();
  }
  Status s = t.ApplyConfig(config);
  if (!s.ok()) return s.WithContext(config_path);
  return t;
}

StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json,
                                        std::string_view config_json) {
  Tokenizer t;
  ST_ASSIGN_OR_RETURN(auto backend, LoadHfTokenizerJson(tokenizer_json));
  t.backend_ = std::move(backend);
  ST_RETURN_IF_ERROR(t.ApplyConfig(config_json));
  return t;
}

StatusOr<Tokenizer> Tokenizer::FromBackend(std::unique_ptr<TokenizerBackend> backend,
                                           std::string_view config_json) {
  Tokenizer t;
  t.backend_ = std::move(backend);
  ST_RETURN_IF_ERROR(t.ApplyConfig(config_json));
  return t;
}

Status Tokenizer::ApplyConfig(std::string_view config_json) {
  nlohmann::json cfg = nlohmann::json::object();
  if (!config_json.empty()) {
    cfg = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object())
      return InvalidArgument("tokenizer_config.json is not a JSON object");
  }
  auto id_of = [&](const char* key, std::initializer_list<const char*> fallbacks) -> int32_t {
    std::optional<std::string> name = TokenField(cfg, key);
    if (name) {
      auto id = backend_->TokenToId(*name);
      return id ? *id : -1;
    }
    if (cfg.contains(key)) return -1;  // explicitly null
    for (const char* f : fallbacks)
      if (auto id = backend_->TokenToId(f)) return *id;
    return -1;
  };
  bos_id_ = id_of("bos_token", {"<bos>", "<s>"});
  eos_id_ = id_of("eos_token", {"<eos>", "</s>"});
  pad_id_ = id_of("pad_token", {"<pad>"});
  std::optional<std::string> unk = backend_->UnkToken();
  unk_id_ = id_of("unk_token", {unk ? unk->c_str() : "<unk>", "<unk>"});
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) continue;
    if (!it->is_boolean()) return InvalidArgument(StrCat(key, " must be true or false"));
    (std::string(key) == "add_bos_token" ? add_bos_ : add_eos_) = it->get<bool>();
  }
  if (add_bos_.value_or(false) && bos_id_ < 0)
    return InvalidArgument("add_bos_token is true but the tokenizer has no bos token");
  if (add_eos_.value_or(false) && eos_id_ < 0)
    return InvalidArgument("add_eos_token is true but the tokenizer has no eos token");
  return Status::Ok();
}

void Tokenizer::SpecialsAround(std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) const {
  prefix->clear();
  suffix->clear();
  if (!add_bos_ && !add_eos_) {
    backend_->TemplateSpecials(prefix, suffix);
    return;
  }
  // tokenizer_config.json decides (transformers rebuilds the post-processor from these flags).
  if (add_bos_.value_or(false)) prefix->push_back(bos_id_);
  if (add_eos_.value_or(false)) suffix->push_back(eos_id_);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens,
                                       int64_t max_length) const {
  std::vector<int32_t> ids, prefix, suffix;
  if (add_special_tokens) SpecialsAround(&prefix, &suffix);
  ids = prefix;
  backend_->EncodePlain(text, &ids);
  if (max_length > 0) {
    const int64_t room =
        std::max<int64_t>(0, max_length - static_cast<int64_t>(prefix.size() + suffix.size()));
    if (static_cast<int64_t>(ids.size() - prefix.size()) > room) ids.resize(prefix.size() + room);
  }
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length) ids.resize(max_length);
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return backend_->Decode(ids, skip_special_tokens);
}

}  // namespace st
