// Gemma 4 text-decoder configuration: parsed from a Hugging Face config.json (the multimodal
// `gemma4` wrapper with `text_config`, or plain `gemma4_text`) or taken from a built-in preset.
// Validation lives here so that every entry point rejects the same bad configs the same way.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace st {

enum class LayerType { kSliding, kFull };

struct RopeParams {
  std::string rope_type = "default";  // "default" or "proportional"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // proportional only
};

// Field defaults are transformers' Gemma4TextConfig class defaults (not E2B's values), so that a
// config.json that omits a field means what it means to transformers.
struct Gemma4Config {
  std::string model_type = "gemma4_text";  // of the file it came from: "gemma4" or "gemma4_text"
  int64_t vocab_size = 262144;
  int64_t hidden_size = 2304;        // d
  int64_t intermediate_size = 9216;  // F (doubled in KV-shared layers with use_double_wide_mlp)
  int64_t num_hidden_layers = 30;    // L
  int64_t num_attention_heads = 8;   // H
  int64_t num_key_value_heads = 4;   // Hkv
  int64_t head_dim = 256;            // D of sliding layers
  int64_t global_head_dim = 512;     // D of full layers
  int64_t num_global_key_value_heads = 0;     // 0 = same as num_key_value_heads
  int64_t hidden_size_per_layer_input = 256;  // P (0 disables PLE)
  int64_t vocab_size_per_layer_input = 262144;
  int64_t num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  bool attention_k_eq_v = false;
  bool enable_moe_block = false;
  bool tie_word_embeddings = true;
  int64_t sliding_window = 512;
  double rms_norm_eps = 1e-6;
  double final_logit_softcapping = 0.0;  // 0 = none
  double initializer_range = 0.02;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 131072;
  int64_t pad_token_id = 0, eos_token_id = 1, bos_token_id = 2;
  std::vector<LayerType> layer_types;
  // Per-layer overrides from `per_layer_config` (newer transformers serialise global_head_dim this
  // way): layer index -> head_dim / num_key_value_heads. Empty: full layers use global_head_dim.
  std::vector<int64_t> layer_head_dim, layer_kv_heads;
  RopeParams rope_sliding{"default", 10000.0, 1.0};
  RopeParams rope_full{"proportional", 1000000.0, 0.25};
  // The top-level config.json object, kept so that a checkpoint writes back what it read.
  nlohmann::json original;

  // Derived helpers.
  int64_t FirstKvSharedLayer() const { return num_hidden_layers - num_kv_shared_layers; }
  bool IsKvShared(int64_t layer) const { return layer >= FirstKvSharedLayer(); }
  // The layer whose K/V a shared layer reads: the last non-shared layer of the same type.
  int64_t KvSourceLayer(int64_t layer) const;
  int64_t HeadDim(int64_t layer) const {
    if (!layer_head_dim.empty()) return layer_head_dim[layer];
    return layer_types[layer] == LayerType::kFull ? global_head_dim : head_dim;
  }
  int64_t KvHeads(int64_t layer) const {
    if (!layer_kv_heads.empty()) return layer_kv_heads[layer];
    return layer_types[layer] == LayerType::kFull && attention_k_eq_v &&
                   num_global_key_value_heads > 0
               ? num_global_key_value_heads
               : num_key_value_heads;
  }
  int64_t MlpWidth(int64_t layer) const {
    return use_double_wide_mlp && IsKvShared(layer) ? 2 * intermediate_size : intermediate_size;
  }

  // Checks every invariant the model relies on; the message names the field and the fix.
  Status Validate() const;
  // The text config as HF writes it (model_type gemma4_text), for checkpoints.
  nlohmann::json ToTextJson() const;
};

// Parses config.json text. Accepts {"model_type": "gemma4", "text_config": {...}} and
// {"model_type": "gemma4_text", ...}; fields absent from the file take transformers' class
// defaults.
StatusOr<Gemma4Config> ParseGemma4Config(const std::string& json_text);
StatusOr<Gemma4Config> LoadGemma4Config(const std::string& path);

// Built-in CPU-sized presets of the same architecture: "gemma4-tiny", "gemma4-small", and
// "gemma4-e2b" (the real E2B shape, for shape checks; 4.6 B parameters).
StatusOr<Gemma4Config> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace st
