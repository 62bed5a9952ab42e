#include "model/config.h"

#include <fstream>
#include <sstream>

namespace st {

using nlohmann::json;

int64_t Gemma4Config::KvSourceLayer(int64_t layer) const {
  if (!IsKvShared(layer)) return layer;
  for (int64_t j = FirstKvSharedLayer() - 1; j >= 0; --j)
    if (layer_types[j] == layer_types[layer]) return j;
  return -1;  // rejected by Validate()
}

Status Gemma4Config::Validate() const {
  auto bad = [](const std::string& m) { return InvalidArgument("invalid Gemma 4 config: " + m); };
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 31))
    return bad(StrCat("vocab_size must be in [1, 2^31], got ", vocab_size));
  if (hidden_size < 1 || hidden_size > 65536)
    return bad(StrCat("hidden_size must be in [1, 65536], got ", hidden_size));
  if (intermediate_size < 1 || intermediate_size > 1 << 20)
    return bad(StrCat("intermediate_size must be in [1, 2^20], got ", intermediate_size));
  if (num_hidden_layers < 1 || num_hidden_layers > 1024)
    return bad(StrCat("num_hidden_layers must be in [1, 1024], got ", num_hidden_layers));
  if (num_attention_heads < 1 || num_attention_heads > 1024)
    return bad(StrCat("num_attention_heads must be in [1, 1024], got ", num_attention_heads));
  if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers)
    return bad(StrCat("layer_types has ", layer_types.size(), " entries but num_hidden_layers is ",
                      num_hidden_layers));
  if (num_kv_shared_layers < 0 || num_kv_shared_layers >= num_hidden_layers)
    return bad(StrCat("num_kv_shared_layers must be in [0, num_hidden_layers), got ",
                      num_kv_shared_layers));
  for (int64_t i = 0; i < num_hidden_layers; ++i) {
    const int64_t D = HeadDim(i), kv = KvHeads(i);
    if (D < 2 || D % 2 != 0 || D > 4096)
      return bad(StrCat("layer ", i, ": head dim must be even and in [2, 4096], got ", D));
    if (kv < 1 || num_attention_heads % kv != 0)
      return bad(StrCat("layer ", i, ": num_attention_heads (", num_attention_heads,
                        ") must be a multiple of the kv heads (", kv, ")"));
    if (IsKvShared(i)) {
      const int64_t src = KvSourceLayer(i);
      if (src < 0)
        return bad(StrCat("layer ", i, " shares K/V but no earlier non-shared layer has its type"));
      if (HeadDim(src) != D || KvHeads(src) != kv)
        return bad(
            StrCat("layer ", i, " shares K/V with layer ", src, " but their head shapes differ"));
    }
  }
  if (hidden_size_per_layer_input < 0 || hidden_size_per_layer_input > 65536)
    return bad(StrCat("hidden_size_per_layer_input must be in [0, 65536], got ",
                      hidden_size_per_layer_input));
  if (hidden_size_per_layer_input > 0 && vocab_size_per_layer_input != vocab_size)
    return Unimplemented(StrCat("vocab_size_per_layer_input (", vocab_size_per_layer_input,
                                ") different from vocab_size (", vocab_size, ") is not supported"));
  if (sliding_window < 1) return bad(StrCat("sliding_window must be >= 1, got ", sliding_window));
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1))
    return bad(StrCat("rms_norm_eps must be in (0, 1), got ", rms_norm_eps));
  if (final_logit_softcapping < 0)
    return bad(StrCat("final_logit_softcapping must be >= 0, got ", final_logit_softcapping));
  if (hidden_activation != "gelu_pytorch_tanh")
    return Unimplemented("hidden_activation '" + hidden_activation +
                         "' is not supported (only gelu_pytorch_tanh)");
  if (enable_moe_block) return Unimplemented("the MoE block (enable_moe_block) is not supported");
  if (attention_k_eq_v) return Unimplemented("attention_k_eq_v is not supported");
  if (!tie_word_embeddings)
    return Unimplemented("untied word embeddings (tie_word_embeddings=false) are not supported");
  for (int64_t i = 1; i < num_hidden_layers; ++i)
    for (int64_t j = 0; j < i; ++j)
      if (layer_types[i] == layer_types[j] && HeadDim(i) != HeadDim(j))
        return Unimplemented(
            StrCat("layers ", j, " and ", i, " have the same type but different head dims"));
  for (const RopeParams* r : {&rope_sliding, &rope_full}) {
    if (r->rope_type != "default" && r->rope_type != "proportional")
      return Unimplemented("rope_type '" + r->rope_type + "' is not supported");
    if (r->rope_type == "default" && r->partial_rotary_factor != 1.0)
      return Unimplemented("partial_rotary_factor with rope_type 'default' is not supported");
    if (!(r->theta > 0)) return bad("rope_theta must be > 0");
    if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
      return bad("partial_rotary_factor must be in (0, 1]");
  }
  // Every field can be in range while their product is absurd (a 2^31 vocabulary of 65536-wide
  // embeddings): bound the parameter count (roughly, in floating point) before anything sizes an
  // arena from it.
  double params = static_cast<double>(vocab_size) * static_cast<double>(hidden_size);
  if (hidden_size_per_layer_input > 0)
    params += static_cast<double>(vocab_size_per_layer_input) *
              static_cast<double>(num_hidden_layers) *
              static_cast<double>(hidden_size_per_layer_input);
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    params += static_cast<double>(hidden_size) *
              (2.0 * static_cast<double>(num_attention_heads * HeadDim(i)) +
               2.0 * static_cast<double>(KvHeads(i) * HeadDim(i)) + 3.0 * MlpWidth(i));
  constexpr double kMaxParams = 1099511627776.0;  // 2^40: 4 TiB of fp32 weights
  if (params > kMaxParams)
    return bad(StrCat("the model would have about ", static_cast<int64_t>(params / 1e9),
                      " billion parameters, more than the limit of ",
                      static_cast<int64_t>(kMaxParams / 1e9), " billion"));
  if (pad_token_id < 0 || pad_token_id >= vocab_size)
    return bad(StrCat("pad_token_id ", pad_token_id, " is outside the vocabulary"));
  return Status::Ok();
}

namespace {

const char* LayerTypeName(LayerType t) {
  return t == LayerType::kFull ? "full_attention" : "sliding_attention";
}

// Reads an optional field with a type check; absent or null keeps the default.
template <typename T>
Status Field(const json& j, const char* name, T* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::Ok();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::runtime_error("not a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw std::runtime_error("not an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw std::runtime_error("not a number");
    } else {
      if (!it->is_string()) throw std::runtime_error("not a string");
    }
    *out = it->get<T>();
  } catch (const std::exception& e) {
    return InvalidArgument(StrCat("invalid Gemma 4 config: field '", name, "' has the wrong type (",
                                  e.what(), "): ", it->dump()));
  }
  return Status::Ok();
}

Status ParseRope(const json& j, RopeParams* r) {
  if (!j.is_object())
    return InvalidArgument("invalid Gemma 4 config: rope_parameters entry is not an object");
  ST_RETURN_IF_ERROR(Field(j, "rope_type", &r->rope_type));
  ST_RETURN_IF_ERROR(Field(j, "rope_theta", &r->theta));
  r->partial_rotary_factor = 1.0;
  ST_RETURN_IF_ERROR(Field(j, "partial_rotary_factor", &r->partial_rotary_factor));
  double factor = 1.0;
  ST_RETURN_IF_ERROR(Field(j, "factor", &factor));
  if (factor != 1.0) return Unimplemented("rope scaling factor != 1 is not supported");
  return Status::Ok();
}

Status ParseText(const json& t, Gemma4Config* c) {
  if (!t.is_object())
    return InvalidArgument("invalid Gemma 4 config: text config is not a JSON object");
  ST_RETURN_IF_ERROR(Field(t, "vocab_size", &c->vocab_size));
  ST_RETURN_IF_ERROR(Field(t, "hidden_size", &c->hidden_size));
  ST_RETURN_IF_ERROR(Field(t, "intermediate_size", &c->intermediate_size));
  ST_RETURN_IF_ERROR(Field(t, "num_hidden_layers", &c->num_hidden_layers));
  ST_RETURN_IF_ERROR(Field(t, "num_attention_heads", &c->num_attention_heads));
  ST_RETURN_IF_ERROR(Field(t, "num_key_value_heads", &c->num_key_value_heads));
  ST_RETURN_IF_ERROR(Field(t, "head_dim", &c->head_dim));
  ST_RETURN_IF_ERROR(Field(t, "global_head_dim", &c->global_head_dim));
  ST_RETURN_IF_ERROR(Field(t, "num_global_key_value_heads", &c->num_global_key_value_heads));
  ST_RETURN_IF_ERROR(Field(t, "hidden_size_per_layer_input", &c->hidden_size_per_layer_input));
  ST_RETURN_IF_ERROR(Field(t, "vocab_size_per_layer_input", &c->vocab_size_per_layer_input));
  ST_RETURN_IF_ERROR(Field(t, "num_kv_shared_layers", &c->num_kv_shared_layers));
  ST_RETURN_IF_ERROR(Field(t, "use_double_wide_mlp", &c->use_double_wide_mlp));
  ST_RETURN_IF_ERROR(Field(t, "attention_k_eq_v", &c->attention_k_eq_v));
  ST_RETURN_IF_ERROR(Field(t, "enable_moe_block", &c->enable_moe_block));
  ST_RETURN_IF_ERROR(Field(t, "tie_word_embeddings", &c->tie_word_embeddings));
  ST_RETURN_IF_ERROR(Field(t, "sliding_window", &c->sliding_window));
  ST_RETURN_IF_ERROR(Field(t, "rms_norm_eps", &c->rms_norm_eps));
  ST_RETURN_IF_ERROR(Field(t, "final_logit_softcapping", &c->final_logit_softcapping));
  ST_RETURN_IF_ERROR(Field(t, "initializer_range", &c->initializer_range));
  ST_RETURN_IF_ERROR(Field(t, "hidden_activation", &c->hidden_activation));
  ST_RETURN_IF_ERROR(Field(t, "max_position_embeddings", &c->max_position_embeddings));
  ST_RETURN_IF_ERROR(Field(t, "pad_token_id", &c->pad_token_id));
  ST_RETURN_IF_ERROR(Field(t, "bos_token_id", &c->bos_token_id));
  if (t.contains("eos_token_id") && t["eos_token_id"].is_array() && !t["eos_token_id"].empty() &&
      t["eos_token_id"][0].is_number_integer()) {
    c->eos_token_id = t["eos_token_id"][0].get<int64_t>();
  } else {
    ST_RETURN_IF_ERROR(Field(t, "eos_token_id", &c->eos_token_id));
  }
  if (t.contains("use_bidirectional_attention") && !t["use_bidirectional_attention"].is_null())
    return Unimplemented("use_bidirectional_attention is not supported (text decoding is causal)");
  if (c->num_hidden_layers < 1 || c->num_hidden_layers > 1024)
    return InvalidArgument(
        StrCat("invalid Gemma 4 config: num_hidden_layers must be in [1, 1024], got ",
               c->num_hidden_layers));

  // layer_types: explicit, or transformers' default 5:1 pattern; the last layer is always full.
  c->layer_types.clear();
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    const json& lt = t["layer_types"];
    if (!lt.is_array()) return InvalidArgument("invalid Gemma 4 config: layer_types is not a list");
    for (const json& e : lt) {
      if (e == "sliding_attention")
        c->layer_types.push_back(LayerType::kSliding);
      else if (e == "full_attention")
        c->layer_types.push_back(LayerType::kFull);
      else
        return InvalidArgument("invalid Gemma 4 config: unknown layer type " + e.dump());
    }
  } else {
    for (int64_t i = 0; i < c->num_hidden_layers; ++i)
      c->layer_types.push_back((i + 1) % 6 ? LayerType::kSliding : LayerType::kFull);
  }
  if (!c->layer_types.empty()) c->layer_types.back() = LayerType::kFull;
  // Checked here, not only in Validate: per_layer_config below indexes layer_types by layer.
  if (static_cast<int64_t>(c->layer_types.size()) != c->num_hidden_layers)
    return InvalidArgument(StrCat("invalid Gemma 4 config: layer_types has ", c->layer_types.size(),
                                  " entries but num_hidden_layers is ", c->num_hidden_layers));

  if (t.contains("rope_parameters") && !t["rope_parameters"].is_null()) {
    const json& rp = t["rope_parameters"];
    if (!rp.is_object())
      return InvalidArgument("invalid Gemma 4 config: rope_parameters is not an object");
    if (rp.contains("sliding_attention"))
      ST_RETURN_IF_ERROR(ParseRope(rp["sliding_attention"], &c->rope_sliding));
    if (rp.contains("full_attention"))
      ST_RETURN_IF_ERROR(ParseRope(rp["full_attention"], &c->rope_full));
  }

  // per_layer_config: {"<layer>": {"head_dim": D, "num_key_value_heads": K}} (newer transformers).
  if (t.contains("per_layer_config") && !t["per_layer_config"].is_null()) {
    const json& plc = t["per_layer_config"];
    if (!plc.is_object())
      return InvalidArgument("invalid Gemma 4 config: per_layer_config is not an object");
    c->layer_head_dim.assign(c->num_hidden_layers, c->head_dim);
    c->layer_kv_heads.assign(c->num_hidden_layers, c->num_key_value_heads);
    for (auto it = plc.begin(); it != plc.end(); ++it) {
      int64_t layer = -1;
      try {
        size_t used = 0;
        layer = std::stoll(it.key(), &used);
        if (used != it.key().size()) layer = -1;
      } catch (...) {
        layer = -1;
      }
      if (layer < 0 || layer >= c->num_hidden_layers)
        return InvalidArgument("invalid Gemma 4 config: per_layer_config has a bad layer index '" +
                               it.key() + "'");
      ST_RETURN_IF_ERROR(Field(it.value(), "head_dim", &c->layer_head_dim[layer]));
      ST_RETURN_IF_ERROR(Field(it.value(), "num_key_value_heads", &c->layer_kv_heads[layer]));
      if (c->layer_types[layer] == LayerType::kFull) c->global_head_dim = c->layer_head_dim[layer];
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Gemma4Config> ParseGemma4Config(const std::string& json_text) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument("config.json is not valid JSON");
  if (!root.is_object()) return InvalidArgument("config.json is not a JSON object");
  Gemma4Config c;
  std::string type;
  ST_RETURN_IF_ERROR(Field(root, "model_type", &type));
  const json* text = &root;
  if (type == "gemma4") {
    if (!root.contains("text_config") || !root["text_config"].is_object())
      return InvalidArgument("config.json: model_type gemma4 but no text_config object");
    text = &root["text_config"];
    // The wrapper's tie_word_embeddings governs the LM head.
    ST_RETURN_IF_ERROR(Field(root, "tie_word_embeddings", &c.tie_word_embeddings));
  } else if (type != "gemma4_text") {
    return InvalidArgument("config.json: model_type '" + type +
                           "' is not a Gemma 4 model (expected gemma4 or gemma4_text)");
  }
  c.model_type = type;
  bool tie = c.tie_word_embeddings;
  ST_RETURN_IF_ERROR(ParseText(*text, &c));
  if (type == "gemma4" && root.contains("tie_word_embeddings")) c.tie_word_embeddings = tie;
  c.original = root;
  ST_RETURN_IF_ERROR(c.Validate());
  return c;
}

StatusOr<Gemma4Config> LoadGemma4Config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  StatusOr<Gemma4Config> c = ParseGemma4Config(ss.str());
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

json Gemma4Config::ToTextJson() const {
  json j;
  j["model_type"] = "gemma4_text";
  j["architectures"] = json::array({"Gemma4ForCausalLM"});
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["global_head_dim"] = global_head_dim;
  j["hidden_size_per_layer_input"] = hidden_size_per_layer_input;
  j["vocab_size_per_layer_input"] = vocab_size_per_layer_input;
  j["num_kv_shared_layers"] = num_kv_shared_layers;
  j["use_double_wide_mlp"] = use_double_wide_mlp;
  j["attention_k_eq_v"] = attention_k_eq_v;
  j["enable_moe_block"] = enable_moe_block;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["sliding_window"] = sliding_window;
  j["rms_norm_eps"] = rms_norm_eps;
  j["final_logit_softcapping"] =
      final_logit_softcapping > 0 ? json(final_logit_softcapping) : json(nullptr);
  j["initializer_range"] = initializer_range;
  j["hidden_activation"] = hidden_activation;
  j["max_position_embeddings"] = max_position_embeddings;
  j["pad_token_id"] = pad_token_id;
  j["eos_token_id"] = eos_token_id;
  j["bos_token_id"] = bos_token_id;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  json types = json::array();
  for (LayerType t : layer_types) types.push_back(LayerTypeName(t));
  j["layer_types"] = types;
  auto rope = [](const RopeParams& r) {
    json o{{"rope_type", r.rope_type}, {"rope_theta", r.theta}};
    if (r.rope_type == "proportional") o["partial_rotary_factor"] = r.partial_rotary_factor;
    return o;
  };
  j["rope_parameters"] = {{"sliding_attention", rope(rope_sliding)},
                          {"full_attention", rope(rope_full)}};
  return j;
}

std::vector<std::string> PresetNames() {
  return {"gemma4-tiny", "gemma4-small", "gemma4-e2b"};
}

StatusOr<Gemma4Config> PresetConfig(const std::string& name) {
  Gemma4Config c;
  c.model_type = "gemma4_text";
  c.final_logit_softcapping = 30.0;
  c.use_double_wide_mlp = true;
  const LayerType S = LayerType::kSliding, F = LayerType::kFull;
  if (name == "gemma4-tiny") {
    // ~4.3 M parameters: both layer types, PLE, KV sharing, double-wide MLP, MQA. As in E2B, the
    // layers before the KV-shared ones end with a sliding and a full layer (2, 3), whose caches the
    // shared layers 4 (sliding) and 5 (full) read: the layout llama.cpp's gemma4 can run.
    c.vocab_size = c.vocab_size_per_layer_input = 8192;
    c.hidden_size = 128;
    c.intermediate_size = 512;
    c.num_hidden_layers = 6;
    c.layer_types = {S, S, S, F, S, F};
    c.num_attention_heads = 4;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.global_head_dim = 64;
    c.hidden_size_per_layer_input = 32;
    c.num_kv_shared_layers = 2;
    c.sliding_window = 64;
    c.max_position_embeddings = 4096;
  } else if (name == "gemma4-small") {
    // ~50 M parameters: GQA (8 query heads, 2 kv heads), KV sharing (layers 5-7), double-wide MLP.
    c.vocab_size = c.vocab_size_per_layer_input = 8192;
    c.hidden_size = 512;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 8;
    c.layer_types = {S, S, S, F, S, S, S, F};
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.global_head_dim = 128;
    c.hidden_size_per_layer_input = 64;
    c.num_kv_shared_layers = 3;
    c.sliding_window = 128;
    c.max_position_embeddings = 8192;
  } else if (name == "gemma4-e2b") {
    // google/gemma-4-E2B-it's text decoder (4.6 B parameters; see shared/reference/gemma4.md).
    c.vocab_size = c.vocab_size_per_layer_input = 262144;
    c.hidden_size = 1536;
    c.intermediate_size = 6144;
    c.num_hidden_layers = 35;
    c.layer_types.clear();
    for (int i = 0; i < 7; ++i) c.layer_types.insert(c.layer_types.end(), {S, S, S, S, F});
    c.num_attention_heads = 8;
    c.num_key_value_heads = 1;
    c.head_dim = 256;
    c.global_head_dim = 512;
    c.hidden_size_per_layer_input = 256;
    c.num_kv_shared_layers = 20;
    c.sliding_window = 512;
    c.max_position_embeddings = 131072;
  } else {
    std::string names;
    for (const auto& n : PresetNames()) names += (names.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown model preset '" + name + "' (presets: " + names + ")");
  }
  ST_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace st
