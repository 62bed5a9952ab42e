// Text generation on top of the KV-cached decoder (model/decode.h) and the sampler
// (model/sampling.h): what `slicetrain generate`, `slicetrain chat` and finetune's
// --sample-prompts share. A Conversation owns the token sequence of one dialogue and feeds the
// decoder only what it has not seen, so every turn of a chat reuses the cache of the ones before.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "io/model_loader.h"
#include "model/decode.h"
#include "model/sampling.h"
#include "model/vision/image_encoder.h"

namespace st {

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 256;
  // Recompute the whole sequence for every new token instead of using the cache (for the
  // benchmark and as a check; the output is the same).
  bool no_cache = false;
};

struct Generation {
  std::vector<int32_t> ids;  // the new tokens, the stop token included when there was one
  std::string text;          // their text, special tokens and the stop token left out
  // Why it ended: "eos" or "end_of_turn" (a stop token), "max_new_tokens", "capacity" (the
  // decoder is full).
  std::string stop;
  int64_t prompt_tokens = 0;  // tokens fed before the first new one (this turn's)
  double prefill_s = 0, decode_s = 0;
  double DecodeTokensPerSecond() const;
};

// A model ready to generate: its weights resident in fp32 (adapters merged), its tokenizer, the
// prompt renderer and the stop tokens (eos, the config's eos, `<turn|>`).
struct TextGenerator {
  LoadedModel model;
  std::unique_ptr<DecodeWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ExampleRenderer> renderer;
  std::vector<int32_t> stops;
  std::string tokenizer_dir;
  // The first stop token that is `<turn|>`, -1 if none.
  int32_t end_of_turn = -1;
  // Tokens a conversation may hold: Load's capacity, or (0) 4096 capped at the model's positions.
  int64_t capacity = 0;
  // The prompt's matrix products (Gemma4Decoder): fp32, or bf16 (generate --precision).
  Precision precision = Precision::kFp32;
  // A model with a vision tower: user turns may hold images (Conversation::Reply).
  std::unique_ptr<vision::ImageEncoder> images;

  // model_id: a directory or preset (resolved already); adapter: a PEFT adapter directory or "";
  // tokenizer: a path or "" (the model directory's, else the bundled one in data_dir).
  // preset_seed: a preset's initialisation (finetune --seed; 42 as finetune's default).
  // weights_dtype: how the matrices are held (auto | fp32 | bf16 | q8_0 | q4_0 | q4_k_m;
  // DecodeWeights).
  // Refuses, before reading weights, a model whose fp32 weights and cache would not fit in
  // this machine's memory.
  static StatusOr<std::unique_ptr<TextGenerator>> Load(
      const std::string& model_id, const std::string& adapter, const std::string& tokenizer,
      const std::string& data_dir, TemplateKind kind, int64_t capacity, uint64_t preset_seed = 42,
      const std::string& weights_dtype = "auto");
};

// A prompt of a prompt file: its text and the image files shown before it.
struct PromptLine {
  std::string text;
  std::vector<std::string> images;  // paths (a JSON line's relative to the file's directory)
};

// A prompt file (generate --prompts, finetune --sample-prompts): JSON lines ({"prompt": ...}, or
// {"instruction": ..., "context": ...} joined as the chat template joins them; "images": [paths]
// or "image": path for a vision model) when a line starts with '{', else one prompt per non-blank
// line.
StatusOr<std::vector<PromptLine>> ReadPromptFile(const std::string& path);
// Image files as the data sets' image references (paths, read when encoded).
std::vector<ImageRef> ImageRefsOf(const std::vector<std::string>& paths);

class Conversation {
 public:
  Conversation(const TextGenerator& g, int64_t capacity, int64_t chunk = 128);

  // Appends a user turn (with an optional first system turn) as the template renders it, then
  // generates the model's answer. on_text receives the answer's text as it grows, in pieces
  // that are whole UTF-8 characters.
  // `images`: shown before the user's text (a vision model only).
  StatusOr<Generation> Reply(const std::string& user, const std::string& system,
                             const GenerateOptions& o,
                             const std::function<void(std::string_view)>& on_text = {},
                             std::span<const ImageRef> images = {});
  // Generates after raw token ids (no template): the parity tests' and the benchmark's path.
  StatusOr<Generation> Continue(const std::vector<int32_t>& ids, const GenerateOptions& o,
                                const std::function<void(std::string_view)>& on_text = {});
  // Forgets the dialogue.
  void Reset();
  int64_t length() const { return static_cast<int64_t>(sequence_.size()); }
  // Every token of the dialogue so far (prompts and answers).
  const std::vector<int32_t>& sequence() const { return sequence_; }
  int64_t capacity() const { return decoder_.capacity(); }

 private:
  // Feeds the decoder up to the sequence's end and writes the logits after it.
  Status CatchUp(bool no_cache);

  const TextGenerator& g_;
  Gemma4Decoder decoder_;
  std::vector<int32_t> sequence_;
  std::vector<float> logits_;
  std::vector<float> soft_;  // the soft tokens of every image of the dialogue, in order
};

}  // namespace st
