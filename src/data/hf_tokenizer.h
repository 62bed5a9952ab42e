// The tokenizer.json pipeline (src/data/hf_tokenizer.cpp) given an already parsed document, for
// vocabularies that arrive in another container (a GGUF file's tokenizer.ggml.* keys,
// src/data/gguf_tokenizer.cpp). Internal to src/data/.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/status.h"
#include "data/tokenizer.h"

namespace st {

struct HfPipelineOptions {
  // A word made only of newlines that is itself a token is that token, without merges: llama.cpp's
  // gemma4 tokenizer (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GEMMA4), which splits text into runs
  // of newlines and runs of everything else before merging.
  bool whole_newline_runs = false;
  std::string kind = "tokenizer.json BPE (byte fallback)";  // Tokenizer::kind()
};

StatusOr<std::unique_ptr<TokenizerBackend>> LoadHfTokenizerParsed(
    const nlohmann::json& tokenizer_json, const HfPipelineOptions& options);

}  // namespace st
