#include "model/params.h"

#include <string>

#include "model/weights.h"

namespace st {

ParamRegistry BuildParamRegistry(const Gemma4Config& cfg) {
  ParamRegistry r;
  ArenaLayout& l = r.layout;
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size, L = cfg.num_hidden_layers;
  const int64_t P = cfg.hidden_size_per_layer_input, H = cfg.num_attention_heads;
  std::vector<bool> buffer, norm;
  auto add = [&](const std::string& name, const Shape& shape, bool is_norm = false,
                 bool is_buffer = false) {
    int idx = l.Add(name, shape);
    buffer.push_back(is_buffer);
    norm.push_back(is_norm);
    return idx;
  };
  r.embed_tokens = add("embed_tokens.weight", {V, d});
  if (P > 0) {
    r.embed_tokens_per_layer = add("embed_tokens_per_layer.weight", {V, L * P});
    r.per_layer_model_projection = add("per_layer_model_projection.weight", {L * P, d});
    r.per_layer_projection_norm = add("per_layer_projection_norm.weight", {P}, true);
  }
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = cfg.HeadDim(i), kv = cfg.KvHeads(i), F = cfg.MlpWidth(i);
    LayerParams lp;
    lp.input_layernorm = add(p + "input_layernorm.weight", {d}, true);
    lp.q_proj = add(p + "self_attn.q_proj.weight", {H * D, d});
    lp.q_norm = add(p + "self_attn.q_norm.weight", {D}, true);
    if (!cfg.IsKvShared(i)) {
      lp.k_proj = add(p + "self_attn.k_proj.weight", {kv * D, d});
      lp.k_norm = add(p + "self_attn.k_norm.weight", {D}, true);
      lp.v_proj = add(p + "self_attn.v_proj.weight", {kv * D, d});
    }
    lp.o_proj = add(p + "self_attn.o_proj.weight", {d, H * D});
    lp.post_attention_layernorm = add(p + "post_attention_layernorm.weight", {d}, true);
    lp.pre_feedforward_layernorm = add(p + "pre_feedforward_layernorm.weight", {d}, true);
    lp.gate_proj = add(p + "mlp.gate_proj.weight", {F, d});
    lp.up_proj = add(p + "mlp.up_proj.weight", {F, d});
    lp.down_proj = add(p + "mlp.down_proj.weight", {d, F});
    lp.post_feedforward_layernorm = add(p + "post_feedforward_layernorm.weight", {d}, true);
    if (P > 0) {
      lp.per_layer_input_gate = add(p + "per_layer_input_gate.weight", {P, d});
      lp.per_layer_projection = add(p + "per_layer_projection.weight", {d, P});
      lp.post_per_layer_input_norm = add(p + "post_per_layer_input_norm.weight", {d}, true);
    }
    lp.layer_scalar = add(p + "layer_scalar", {1}, false, true);
    r.layers.push_back(lp);
  }
  r.norm = add("norm.weight", {d}, true);
  r.is_buffer = buffer;
  r.is_norm = norm;
  r.base_entries = l.size();
  r.lora_a.assign(l.size(), -1);
  r.lora_b.assign(l.size(), -1);
  r.lora_base.assign(l.size(), -1);
  r.lora_full.assign(l.size(), false);
  return r;
}

int64_t LayerOfName(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  const size_t dot = name.find('.', 7);
  return dot == std::string::npos ? -1 : std::stoll(name.substr(7, dot - 7));
}

bool ParamRegistry::IsMatmul(int i) const {
  // embed_tokens_per_layer is a lookup only; embed_tokens counts once: it is the LM head.
  return !is_norm[i] && !is_buffer[i] && i != embed_tokens_per_layer;
}

int64_t ParamRegistry::MatmulParams() const {
  int64_t n = 0;
  for (int i = 0; i < layout.size(); ++i)
    if (IsMatmul(i)) n += layout.entry(i).numel;
  return n;
}

void InitParams(const Gemma4Config& cfg, const ParamRegistry& reg, float* params, uint64_t seed) {
  const PresetWeights weights(cfg, reg, seed);
  for (int i = 0; i < reg.layout.size(); ++i)
    weights.ReadAll(i, params + reg.layout.entry(i).offset);
}

}  // namespace st
