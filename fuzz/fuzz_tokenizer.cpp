// Fuzzes tokenizer.json loading and encoding. The input is
//   <tokenizer.json> NUL <text to encode> [NUL <tokenizer_config.json>]
// (NUL cannot occur in valid JSON, so the split never hides a valid file). A loaded tokenizer
// encodes the text with and without special tokens and with truncation, decodes the result, and
// decodes the text's bytes read as ids (including ids outside the vocabulary).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  std::string_view tok_json = in.substr(0, nul);
  std::string_view text, config;
  if (nul != std::string_view::npos) {
    text = in.substr(nul + 1);
    size_t nul2 = text.find('\0');
    if (nul2 != std::string_view::npos) {
      config = text.substr(nul2 + 1);
      text = text.substr(0, nul2);
    }
  }
  st::StatusOr<st::Tokenizer> tok = st::Tokenizer::FromJson(tok_json, config);
  if (!tok.ok()) return 0;
  std::vector<int32_t> ids = tok->Encode(text, true);
  (void)tok->Decode(ids, false);
  (void)tok->Decode(ids, true);
  (void)tok->Encode(text, false);
  (void)tok->Encode(text, true, 3);
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < text.size() && raw.size() < 64; i += 2)
    raw.push_back(static_cast<int32_t>(static_cast<uint8_t>(text[i]) << 8 |
                                       static_cast<uint8_t>(text[i + 1])) -
                  256);
  (void)tok->Decode(raw, false);
  (void)tok->Decode(raw, true);
  for (int32_t id : raw) (void)tok->IdToToken(id);
  (void)tok->TokenToId(text);
  return 0;
}
