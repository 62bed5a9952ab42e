// Resolves --model-id into a config and initial parameters: a built-in preset (seeded random
// initialisation, as transformers would build the model from its config) or a local Hugging Face
// model directory (config.json + safetensors). Lives in io/ because it reads files; hub ids are
// resolved to a local snapshot directory by io/hub.h first.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "io/hub.h"
#include "model/config.h"
#include "model/params.h"

namespace st {

struct LoadedModel {
  Gemma4Config config;
  ParamRegistry registry;
  AlignedBuffer params;
  std::string source;  // "preset gemma4-tiny (seed 42)" or the directory
};

StatusOr<LoadedModel> LoadModel(const std::string& model_id, uint64_t seed);

// --model-id as something LoadModel reads: a local directory or a preset name unchanged; a hub id
// (org/name) is fetched into (or, offline, found in) the huggingface_hub cache and its snapshot
// directory returned. Anything else is returned unchanged for LoadModel to reject.
StatusOr<std::string> ResolveModelSource(const std::string& model_id, const HubOptions& hub);

}  // namespace st
