// SentencePiece .model files (older Gemma / Llama checkpoints) through Debian's libsentencepiece.
// The processor's own normalization and piece splitting apply; bos/eos come from
// tokenizer_config.json (the Tokenizer wrapper), never from the processor's extra options.
#include <sentencepiece_processor.h>

#include "data/tokenizer.h"

namespace st {
namespace {

class SpmTokenizer final : public TokenizerBackend {
 public:
  Status Load(const std::string& path) {
    auto s = sp_.Load(path);
    if (!s.ok()) return InvalidArgument(StrCat("not a SentencePiece model: ", s.ToString()));
    return Status::Ok();
  }
  void EncodePlain(std::string_view text, std::vector<int32_t>* out) const override {
    std::vector<int> ids;
    if (!sp_.Encode(text, &ids).ok()) return;
    out->insert(out->end(), ids.begin(), ids.end());
  }
  void TemplateSpecials(std::vector<int32_t>*, std::vector<int32_t>*) const override {}
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize()) continue;
      if (skip_special && (sp_.IsControl(id) || sp_.IsUnknown(id))) continue;
      v.push_back(id);
    }
    std::string out;
    if (!sp_.Decode(v, &out).ok()) return std::string();
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    int id = sp_.PieceToId(token);
    if (id == sp_.unk_id() && sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::string IdToToken(int32_t id) const override {
    return id >= 0 && id < sp_.GetPieceSize() ? sp_.IdToPiece(id) : std::string();
  }
  std::optional<std::string> UnkToken() const override {
    if (sp_.unk_id() < 0) return std::nullopt;
    return sp_.IdToPiece(sp_.unk_id());
  }
  std::string kind() const override { return "sentencepiece"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

StatusOr<std::unique_ptr<TokenizerBackend>> LoadSentencePieceModel(const std::string& path) {
  auto t = std::make_unique<SpmTokenizer>();
  ST_RETURN_IF_ERROR(t->Load(path));
  return std::unique_ptr<TokenizerBackend>(std::move(t));
}

}  // namespace st
