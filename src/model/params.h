// The parameter registry of a Gemma 4 text decoder: every tensor's Hugging Face name (relative to
// the text model, e.g. "layers.3.mlp.up_proj.weight"), shape and arena offset, plus typed indices
// per layer so that the forward pass never looks names up. Parameters, gradients and optimizer
// state all use this one layout, so an FSDP shard is an offset and a length in each.
#pragma once

#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "model/config.h"

namespace st {

struct LayerParams {
  int input_layernorm, q_proj, q_norm, k_proj = -1, k_norm = -1, v_proj = -1, o_proj;
  int post_attention_layernorm, pre_feedforward_layernorm, gate_proj, up_proj, down_proj;
  int post_feedforward_layernorm, per_layer_input_gate = -1, per_layer_projection = -1;
  int post_per_layer_input_norm = -1, layer_scalar;
};

struct ParamRegistry {
  ArenaLayout layout;
  int embed_tokens = -1, embed_tokens_per_layer = -1, per_layer_model_projection = -1;
  int per_layer_projection_norm = -1, norm = -1;
  std::vector<LayerParams> layers;
  // Per entry: true for tensors that are buffers in transformers (layer_scalar): loaded and saved,
  // never trained.
  std::vector<bool> is_buffer;
  // Per entry: true for RMSNorm weights (initialised to one).
  std::vector<bool> is_norm;

  // LoRA (model/lora.h): the base model's entries come first; adapters are appended after them.
  int base_entries = 0;
  // Per entry: the A [R, in] and B [out, R] entries of the Linear weight's adapter, -1 for none.
  std::vector<int> lora_a, lora_b;
  // Per entry: for an adapter entry, the Linear weight it adapts (-1 otherwise).
  std::vector<int> lora_base;
  // Per entry: a base tensor trained in full beside the adapters (PEFT's modules_to_save).
  std::vector<bool> lora_full;
  int64_t lora_rank = 0;
  float lora_scaling = 0.0f;  // s in y = x W^T + s * dropout(x) A^T B^T
  float lora_dropout = 0.0f;
  bool HasAdapters() const { return lora_rank > 0; }

  // Elements that take part in matrix products per token (for FLOP counts): every Linear weight
  // plus the tied LM head and the adapters; lookups (embeddings) and norms excluded.
  int64_t MatmulParams() const;
  bool IsMatmul(int entry) const;
};

ParamRegistry BuildParamRegistry(const Gemma4Config& cfg);

// The decoder layer of a registry name ("layers.<l>.…"), or -1 for the tensors outside the layers.
int64_t LayerOfName(const std::string& name);

// transformers' initialisation: Linear and Embedding weights ~ N(0, initializer_range) (padding
// row zeroed), RMSNorm weights and layer_scalar = 1. Deterministic in `seed`.
void InitParams(const Gemma4Config& cfg, const ParamRegistry& reg, float* params, uint64_t seed);

}  // namespace st
