// The micro Gemma 4 model and batch the engine tests share (test_model, test_lora).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/config.h"
#include "model/gemma4.h"

namespace st::test {

// A micro config exercising every feature: both layer types, GQA, PLE, KV sharing of both types,
// double-wide MLP, proportional RoPE, softcap, a window shorter than the sequence.
inline Gemma4Config MicroConfig(double initializer_range = 0.3) {
  Gemma4Config c;
  c.vocab_size = c.vocab_size_per_layer_input = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 5;
  c.layer_types = {LayerType::kSliding, LayerType::kFull, LayerType::kSliding, LayerType::kSliding,
                   LayerType::kFull};
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.global_head_dim = 16;
  c.hidden_size_per_layer_input = 4;
  c.num_kv_shared_layers = 3;
  c.use_double_wide_mlp = true;
  c.sliding_window = 3;
  c.final_logit_softcapping = 30.0;
  c.initializer_range = initializer_range;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  return c;
}

struct MicroBatch {
  std::vector<int32_t> ids, labels;
  std::vector<uint8_t> mask;
  Batch Get(int64_t B, int64_t T) const { return {ids.data(), mask.data(), labels.data(), B, T}; }
};

inline MicroBatch MakeBatch(const Gemma4Config& c, int64_t B, int64_t T, uint64_t seed) {
  MicroBatch mb;
  Rng rng(seed);
  mb.ids.resize(B * T);
  mb.mask.assign(B * T, 1);
  for (auto& id : mb.ids) id = 1 + static_cast<int32_t>(rng.Below(c.vocab_size - 1));
  // Row 1 right-padded by 2, row 2 (if any) left-padded by 2.
  for (int64_t t = T - 2; t < T && B > 1; ++t) mb.mask[1 * T + t] = 0;
  for (int64_t t = 0; t < 2 && B > 2; ++t) mb.mask[2 * T + t] = 0;
  mb.labels = mb.ids;
  for (int64_t i = 0; i < B * T; ++i)
    if (!mb.mask[i]) {
      mb.ids[i] = 0;
      mb.labels[i] = -100;
    }
  return mb;
}

}  // namespace st::test
