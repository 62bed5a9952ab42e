// Text <-> token ids for Gemma-family models: Hugging Face `tokenizer.json` files (BPE with byte
// fallback and the normalizers / pre-tokenizers / decoders / post-processors Gemma's files use:
// Replace, Prepend, Strip, Split, ByteFallback, Fuse, TemplateProcessing), plus
// `tokenizer_config.json` (add_bos_token, add_eos_token, bos/eos/pad/unk), and SentencePiece
// `.model` files for older models. Not a trainer and not a chat-template engine; offsets are not
// tracked. Encode/Decode are const and thread-safe. Unsupported components are rejected at load
// time with a one-line error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace st {

class GgufFile;

// The backend behind a Tokenizer (tokenizer.json pipeline or SentencePiece). Internal.
class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // Appends the ids of text, without any bos/eos the post-processor would add.
  virtual void EncodePlain(std::string_view text, std::vector<int32_t>* out) const = 0;
  // The special ids the file's own template (tokenizer.json post_processor) puts before and after
  // a single sequence.
  virtual void TemplateSpecials(std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) const = 0;
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::string IdToToken(int32_t id) const = 0;  // "" when out of range
  virtual std::optional<std::string> UnkToken() const = 0;
  virtual std::string kind() const = 0;
};

// The files of a tokenizer directory, as Tokenizer::Load reads them (tokenizer.json, else
// tokenizer.model, else tokenizer.gguf; tokenizer_config.json beside the first two): what a
// checkpoint or an export copies, and what a directory's checksums may list.
inline const std::vector<std::string> kTokenizerFiles = {"tokenizer.json", "tokenizer_config.json",
                                                         "tokenizer.model", "tokenizer.gguf"};
// Whether directory dir holds a tokenizer Tokenizer::Load reads.
bool HasTokenizerFiles(const std::string& dir);

class Tokenizer {
 public:
  // path: a directory holding tokenizer.json (or tokenizer.model) and optionally
  // tokenizer_config.json; a tokenizer.json file (its directory's tokenizer_config.json is read if
  // present); a SentencePiece .model file; or a GGUF file (its vocabulary, FromGguf).
  static StatusOr<Tokenizer> Load(const std::string& path);
  // From the text of tokenizer.json and (optionally, "" = none) tokenizer_config.json.
  static StatusOr<Tokenizer> FromJson(std::string_view tokenizer_json,
                                      std::string_view config_json = "");
  // The vocabulary of a GGUF file (tokenizer.ggml.*, model "gemma4"), tokenized as llama.cpp does
  // (src/data/gguf_tokenizer.cpp). Load takes this path for a file that starts with "GGUF".
  static StatusOr<Tokenizer> FromGguf(const std::string& path);
  static StatusOr<Tokenizer> FromGguf(const GgufFile& file);
  // Writes the vocabulary of a GGUF file (its general.architecture and tokenizer.* keys, no
  // tensors) to out_path: what a checkpoint keeps as tokenizer.gguf when it was trained with a
  // GGUF tokenizer, in the shape of llama.cpp's own vocabulary files.
  static Status WriteGgufVocabulary(const std::string& gguf_path, const std::string& out_path);
  // A backend built elsewhere in src/data/, with tokenizer_config.json's text ("" = none).
  static StatusOr<Tokenizer> FromBackend(std::unique_ptr<TokenizerBackend> backend,
                                         std::string_view config_json);

  // add_special_tokens: bos/eos as tokenizer_config.json's add_bos_token/add_eos_token say when it
  // sets them, else the tokenizer.json post-processor's template (what `transformers` does).
  // max_length > 0 truncates like `transformers` (truncation=True): the text's ids are cut so that
  // they and the special tokens fit, the special tokens are kept.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true,
                              int64_t max_length = 0) const;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const { return backend_->vocab_size(); }
  std::optional<int32_t> TokenToId(std::string_view token) const {
    return backend_->TokenToId(token);
  }
  std::string IdToToken(int32_t id) const { return backend_->IdToToken(id); }
  // -1 when the tokenizer has no such token.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  // "tokenizer.json BPE (byte fallback)", "GGUF gemma4 BPE (byte fallback)" or "sentencepiece".
  std::string kind() const { return backend_->kind(); }
  // The special ids Encode(.., add_special_tokens=true) puts before and after the text.
  void SpecialsAround(std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) const;

 private:
  Tokenizer() = default;
  Status ApplyConfig(std::string_view config_json);

  std::shared_ptr<const TokenizerBackend> backend_;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  std::optional<bool> add_bos_, add_eos_;  // set by tokenizer_config.json
};

// Internal factories (src/data/hf_tokenizer.cpp, src/data/spm_tokenizer.cpp).
StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizerJson(std::string_view json_text);
StatusOr<std::unique_ptr<TokenizerBackend>> LoadSentencePieceModel(const std::string& path);

}  // namespace st
