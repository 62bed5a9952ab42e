// Hugging Face model directories for Gemma 4: config.json plus model.safetensors (or shards listed
// in model.safetensors.index.json), read into and written from a ParamRegistry-laid arena.
// Tensor names may carry the multimodal prefix `model.language_model.` or the text-only `model.`;
// a missing `lm_head.weight` (tied) and unused K/V tensors of KV-shared layers are tolerated,
// vision/audio tensors are ignored. Not a hub client: the directory must already exist locally.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace st {

struct LoadReport {
  std::string prefix;  // the text-model prefix found in the files
  int64_t tensors_loaded = 0;
  int64_t tensors_ignored = 0;    // vision/audio, lm_head, shared-layer k/v, ...
  int64_t scalars_defaulted = 0;  // layer_scalar buffers absent from the files (set to 1)
};

// The .safetensors files of a model directory: the shards of model.safetensors.index.json, or
// model.safetensors.
StatusOr<std::vector<std::string>> ModelWeightFiles(const std::string& dir);

// Fills params (registry layout) from the files. Every registry tensor must be present with the
// registry's shape, except layer_scalar (defaults to 1, counted in the report).
StatusOr<LoadReport> LoadParams(const std::vector<std::string>& files, const Gemma4Config& cfg,
                                const ParamRegistry& reg, float* params);

// Writes config.json and model.safetensors into dir (created if needed), with the prefix the
// config's model_type implies ("gemma4": model.language_model., "gemma4_text": model.).
Status SaveHfModel(const std::string& dir, const Gemma4Config& cfg, const ParamRegistry& reg,
                   const float* params, DType dtype);

std::string TextPrefixFor(const Gemma4Config& cfg);

}  // namespace st
