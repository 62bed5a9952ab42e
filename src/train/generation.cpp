#include "train/generation.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "io/files.h"
#include "io/gguf.h"
#include "io/gguf_export.h"
#include "io/peft_adapter.h"
#include "kernels/cpu/ops_cpu.h"

namespace st {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The length of the longest prefix of `text` that ends on a whole UTF-8 character and not in
// the replacement character a partial byte-fallback sequence decodes to (its next token may
// complete it).
size_t CompletePrefix(const std::string& text) {
  size_t n = text.size();
  static const std::string kReplacement = "\xEF\xBF\xBD";
  while (n >= kReplacement.size() && text.compare(n - 3, 3, kReplacement) == 0) n -= 3;
  // Back up over an unfinished multi-byte character.
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i > 0) {
    const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
    const int want = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (want > back) n = i - 1;
  }
  return n;
}

}  // namespace

StatusOr<std::vector<PromptLine>> ReadPromptFile(const std::string& path) {
  ST_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<PromptLine> out;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line[line.find_first_not_of(" \t")] != '{') {
      out.push_back({line, {}});
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    auto field = [&](const char* k) {
      return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>()
                                                                : std::string();
    };
    PromptLine p;
    p.text = field("prompt");
    if (p.text.empty()) {
      p.text = field("instruction");
      const std::string c = field("context");
      if (!p.text.empty() && !c.empty()) p.text += "\n\n" + c;
    }
    if (p.text.empty())
      return InvalidArgument(StrCat(path, ":", n,
                                    ": a JSON line needs a string field \"prompt\" or "
                                    "\"instruction\""));
    for (const char* key : {"images", "image"}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      const nlohmann::json& v = j[key];
      const bool ok = std::string(key) == "image"
                          ? v.is_string()
                          : v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& e) {
                              return e.is_string();
                            });
      if (!ok)
        return InvalidArgument(StrCat(path, ":", n, ": \"", key, "\" must be ",
                                      std::string(key) == "image" ? "a path" : "a list of paths",
                                      " to image files"));
      for (const std::string& f : v.is_string() ? std::vector<std::string>{v.get<std::string>()}
                                                : v.get<std::vector<std::string>>())
        p.images.push_back(std::filesystem::path(f).is_absolute() ? f : (dir / f).string());
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return InvalidArgument(path + " holds no prompt");
  return out;
}

std::vector<ImageRef> ImageRefsOf(const std::vector<std::string>& paths) {
  std::vector<ImageRef> refs;
  for (const std::string& p : paths) refs.push_back(ImageRef{"", p});
  return refs;
}

double Generation::DecodeTokensPerSecond() const {
  const int64_t n = static_cast<int64_t>(ids.size());
  return decode_s > 0 && n > 1 ? static_cast<double>(n - 1) / decode_s : 0.0;
}

StatusOr<std::unique_ptr<TextGenerator>> TextGenerator::Load(
    const std::string& model_id, const std::string& adapter, const std::string& tokenizer,
    const std::string& data_dir, TemplateKind kind, int64_t capacity, uint64_t preset_seed,
    const std::string& weights_dtype) {
  if (weights_dtype != "auto" && weights_dtype != "fp32" && weights_dtype != "bf16" &&
      weights_dtype != "q8_0" && weights_dtype != "q4_0" && weights_dtype != "q4_k_m")
    return InvalidArgument("--weights-dtype must be auto, fp32, bf16, q8_0, q4_0 or q4_k_m, got '" +
                           weights_dtype + "'");
  auto g = std::make_unique<TextGenerator>();
  ST_ASSIGN_OR_RETURN(g->model, LoadModelWithAdapter(model_id, adapter, preset_seed));
  const Gemma4Config& cfg = g->model.config;
  if (capacity == 0) capacity = std::min<int64_t>(4096, cfg.max_position_embeddings);
  g->capacity = capacity;
  if (capacity > cfg.max_position_embeddings)
    return InvalidArgument(StrCat("--max-seq-len ", capacity, " exceeds the model's ",
                                  cfg.max_position_embeddings, " positions"));
  const DType storage = weights_dtype == "fp32" ? DType::kF32
                        : weights_dtype == "bf16"
                            ? DType::kBF16
                            : DecodeWeights::DefaultStorage(g->model.registry, *g->model.weights);
  // A GGUF file's matrices stored in a type with an int8 product are decoded as stored under
  // auto (the others, and the vectors, in fp32): no second rounding of quantized weights.
  const WeightSource& source = *g->model.weights;
  bool stored_blocks = false;
  std::vector<GgmlType> stored_types(static_cast<size_t>(g->model.registry.layout.size()),
                                     GgmlType::kF32);
  if (weights_dtype == "auto" && !g->model.registry.HasAdapters())
    for (int e = 0; e < g->model.registry.base_entries; ++e)
      if (const std::optional<WeightSource::StoredBlocks> st = source.StoredGgml(e);
          st && g->model.registry.layout.entry(e).shape.size() == 2 &&
          cpu::HasInt8BlockProduct(st->type)) {
        stored_types[static_cast<size_t>(e)] = st->type;
        stored_blocks = true;
      }
  const bool quantized = weights_dtype == "q8_0" || weights_dtype == "q4_0" ||
                         weights_dtype == "q4_k_m" || stored_blocks;
  // q4_k_m: each matrix in the type llama-quantize's Q4_K_M mixture gives it, as `export --format
  // gguf --quant q4_k_m` writes it (Q4_K, Q6_K; Q5_0 and Q8_0 for rows that are not whole 256-value
  // super-blocks; per_layer_model_proj in fp32).
  DecodeWeights::BlockStorage blocks;
  if (stored_blocks)
    blocks.types = std::move(stored_types);
  else if (weights_dtype == "q4_k_m")
    blocks.types =
        GgufMatrixTypes(g->model.registry, cfg.num_hidden_layers, GgufQuant{GgmlType::kQ4_K, true});
  else
    blocks.type = weights_dtype == "q4_0" ? GgmlType::kQ4_0 : GgmlType::kQ8_0;
  if (quantized && !stored_blocks)
    for (int e = 0; e < g->model.registry.base_entries; ++e) {
      const ArenaEntry& a = g->model.registry.layout.entry(e);
      if (a.shape.size() == 2 && e != g->model.registry.embed_tokens_per_layer &&
          a.shape[1] % 32 != 0)
        return InvalidArgument(StrCat("--weights-dtype ", weights_dtype, ": ", a.name,
                                      " has rows of ", a.shape[1],
                                      " values, not whole 32-value blocks; use bf16 or fp32"));
    }
  const double need = (quantized ? DecodeWeights::Bytes(g->model.registry, blocks)
                                 : DecodeWeights::Bytes(g->model.registry, storage)) +
                      Gemma4Decoder::Bytes(cfg, capacity);
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > 0.9 * have)
    return ResourceExhausted(StrCat(
        "generating needs about ", static_cast<int64_t>(need / (1 << 20)), " MiB (the weights in ",
        stored_blocks ? "the GGUF file's types"
        : quantized   ? weights_dtype
                      : DTypeName(storage),
        " and the cache for ", capacity, " tokens), more than ", "this machine's ",
        static_cast<int64_t>(have / (1 << 20)), " MiB; lower --max-seq-len",
        weights_dtype == "q4_0" || weights_dtype == "q4_k_m" ? ""
        : quantized ? ", hold the weights in 4 bits (--weights-dtype q4_0)"
                    : ", hold the weights in 8 bits (--weights-dtype q8_0)",
        " or use a machine with more memory"));
  std::error_code ec;
  // The tokenizer: --tokenizer, else the model directory's, a GGUF file's own vocabulary, else
  // the bundled one.
  g->tokenizer_dir =
      !tokenizer.empty() ? tokenizer
      : (std::filesystem::is_directory(model_id, ec) && HasTokenizerFiles(model_id)) ||
              (std::filesystem::is_regular_file(model_id, ec) && IsGgufFile(model_id))
          ? model_id
          : data_dir + "/tokenizer";
  ST_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(g->tokenizer_dir));
  if (tok.vocab_size() > cfg.vocab_size)
    return InvalidArgument(StrCat("the tokenizer at ", g->tokenizer_dir, " has ", tok.vocab_size(),
                                  " tokens but the model's vocabulary is ", cfg.vocab_size,
                                  "; pass the model's own with --tokenizer"));
  g->tokenizer = std::make_unique<Tokenizer>(std::move(tok));
  ST_ASSIGN_OR_RETURN(ExampleRenderer r,
                      ExampleRenderer::Create(*g->tokenizer, kind, TrainOn::kAll));
  g->renderer = std::make_unique<ExampleRenderer>(r);
  auto add_stop = [&](int64_t id) {
    if (id >= 0 && id < cfg.vocab_size &&
        std::find(g->stops.begin(), g->stops.end(), id) == g->stops.end())
      g->stops.push_back(static_cast<int32_t>(id));
  };
  add_stop(g->tokenizer->eos_id());
  add_stop(cfg.eos_token_id);
  if (std::optional<int32_t> t = g->tokenizer->TokenToId("<turn|>")) {
    add_stop(*t);
    g->end_of_turn = *t;
  }
  g->weights = quantized
                   ? std::make_unique<DecodeWeights>(g->model.registry, *g->model.weights, blocks)
                   : std::make_unique<DecodeWeights>(g->model.registry, *g->model.weights, storage);
  if (std::filesystem::is_directory(model_id, ec)) {  // a vision tower: prompts may hold images
    StatusOr<std::unique_ptr<vision::ImageEncoder>> images = vision::ImageEncoder::Load(model_id);
    if (images.ok()) {
      g->images = std::move(*images);
      if (!adapter.empty()) g->images->UseAdapter(adapter);
      g->renderer->SetImageTokens(g->images->Tokens());
    } else if (images.status().code() != StatusCode::kNotFound) {
      return images.status();
    }
  }
  return g;
}

Conversation::Conversation(const TextGenerator& g, int64_t capacity, int64_t chunk)
    : g_(g),
      decoder_(g.model.config, g.model.registry, *g.weights, capacity, chunk, g.precision),
      logits_(static_cast<size_t>(g.model.config.vocab_size)) {}

void Conversation::Reset() {
  sequence_.clear();
  soft_.clear();
  decoder_.Reset();
}

Status Conversation::CatchUp(bool no_cache) {
  if (no_cache) decoder_.Reset();
  const int64_t from = decoder_.length();
  const std::span<const int32_t> rest =
      std::span<const int32_t>(sequence_).subspan(static_cast<size_t>(from));
  if (soft_.empty()) return decoder_.Append(rest, logits_.data());
  // The soft tokens of the image positions not fed yet (those before `from` were).
  const int32_t id = g_.images->config().image_token_id;
  const int64_t d = g_.model.config.hidden_size;
  const auto fed = std::count(sequence_.begin(), sequence_.begin() + from, id);
  SoftTokens soft{soft_.data() + fed * d, std::count(rest.begin(), rest.end(), id), id};
  return decoder_.Append(0, rest, logits_.data(), soft);
}

StatusOr<Generation> Conversation::Reply(const std::string& user, const std::string& system,
                                         const GenerateOptions& o,
                                         const std::function<void(std::string_view)>& on_text,
                                         std::span<const ImageRef> images) {
  std::vector<ChatMessage> messages;
  const bool start = sequence_.empty();
  if (!system.empty()) {
    if (!start) return InvalidArgument("a system message can only open a conversation");
    messages.push_back({"system", system});
  }
  messages.push_back({"user", user});
  if (!images.empty()) {  // the images first, then the text (an image part per image)
    if (!g_.images)
      return InvalidArgument(
          "the model has no vision tower: images need a Gemma 4 model whose config.json has a "
          "vision_config");
    messages.back().segments.assign(images.size(), std::string());
    messages.back().segments.emplace_back(StripPythonWhitespace(user));
  }
  std::vector<int32_t> prompt;
  // A model turn cut short (max_new_tokens) is closed before the next user turn.
  const int32_t close = g_.renderer->turn_close();
  if (!start && close >= 0 && sequence_.back() != close) prompt.push_back(close);
  ST_RETURN_IF_ERROR(g_.renderer->RenderPrompt(messages, start, &prompt, images));
  if (!images.empty()) {
    std::vector<const ImageRef*> refs;
    for (const ImageRef& im : images) refs.push_back(&im);
    ST_ASSIGN_OR_RETURN(const std::vector<float> soft, g_.images->Encode(refs));
    soft_.insert(soft_.end(), soft.begin(), soft.end());
  }
  StatusOr<Generation> gen = Continue(prompt, o, on_text);
  if (!gen.ok() && g_.images) {  // the soft tokens of the images the sequence still holds
    const int64_t kept =
        std::count(sequence_.begin(), sequence_.end(), g_.images->config().image_token_id);
    soft_.resize(static_cast<size_t>(kept * g_.model.config.hidden_size));
  }
  return gen;
}

StatusOr<Generation> Conversation::Continue(const std::vector<int32_t>& ids,
                                            const GenerateOptions& o,
                                            const std::function<void(std::string_view)>& on_text) {
  if (ids.empty()) return InvalidArgument("the prompt has no tokens");
  if (o.max_new_tokens < 1)
    return InvalidArgument(StrCat("--max-new-tokens must be >= 1, got ", o.max_new_tokens));
  ST_RETURN_IF_ERROR(o.sampling.Validate());
  const int64_t before = length();
  if (before + static_cast<int64_t>(ids.size()) >= capacity())
    return ResourceExhausted(StrCat("the prompt needs ", before + static_cast<int64_t>(ids.size()),
                                    " tokens with the conversation so far, and leaves no room in "
                                    "the ",
                                    capacity(),
                                    " the decoder holds; raise --max-seq-len or start a new "
                                    "conversation"));
  Generation gen;
  gen.prompt_tokens =
      static_cast<int64_t>(sequence_.size()) - decoder_.length() + static_cast<int64_t>(ids.size());
  sequence_.insert(sequence_.end(), ids.begin(), ids.end());
  Sampler sampler(o.sampling);
  const auto t0 = Clock::now();
  if (Status s = CatchUp(o.no_cache); !s.ok()) {
    sequence_.resize(static_cast<size_t>(before));
    decoder_.Reset();  // the cache no longer matches the sequence: refed on the next call
    return s;
  }
  auto t1 = Clock::now();
  gen.prefill_s = Seconds(t0, t1);
  size_t shown = 0;
  std::vector<int32_t> visible;  // new tokens without the stop token
  for (;;) {
    const int32_t next = sampler.Next(sequence_, logits_);
    gen.ids.push_back(next);
    sequence_.push_back(next);
    const bool stop = std::find(g_.stops.begin(), g_.stops.end(), next) != g_.stops.end();
    if (stop) {
      gen.stop = next == g_.end_of_turn ? "end_of_turn" : "eos";
    } else {
      visible.push_back(next);
      if (on_text) {
        const std::string text = g_.tokenizer->Decode(visible, true);
        const size_t n = CompletePrefix(text);
        if (n > shown) {
          on_text(std::string_view(text).substr(shown, n - shown));
          shown = n;
        }
      }
    }
    if (stop) break;
    if (static_cast<int64_t>(gen.ids.size()) >= o.max_new_tokens) {
      gen.stop = "max_new_tokens";
      break;
    }
    if (length() >= capacity()) {
      gen.stop = "capacity";
      break;
    }
    ST_RETURN_IF_ERROR(CatchUp(o.no_cache));
  }
  gen.decode_s = Seconds(t1, Clock::now());
  gen.text = g_.tokenizer->Decode(visible, true);
  if (on_text && gen.text.size() > shown) on_text(std::string_view(gen.text).substr(shown));
  return gen;
}

}  // namespace st
