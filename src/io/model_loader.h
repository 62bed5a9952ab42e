// Resolves --model-id into a config and a source of initial parameters: a built-in preset (seeded
// random initialisation, as transformers would build the model from its config), a local Hugging
// Face model directory (config.json + safetensors, memory-mapped) or a GGUF file of a gemma4 model
// (io/gguf_model.h). Nothing is materialised here:
// each rank reads the ranges it owns from `weights`. Lives in io/ because it reads files; hub ids
// are resolved to a local snapshot directory by io/hub.h first.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "io/hf_model.h"
#include "io/hub.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"
#include "model/weights.h"

namespace st {

struct LoadedModel {
  Gemma4Config config;
  ParamRegistry registry;
  std::unique_ptr<WeightSource> weights;
  std::string source;  // "preset gemma4-tiny (seed 42)" or the directory
  LoadReport report;   // a directory's: files, bytes, prefix
  LoraSpec lora;       // the adapters the registry carries (io/peft_adapter.h AttachLora)
};

// verify_checksums: a slicetrain checkpoint's files are hashed against its checksums.sha256 first
// (reading every byte once); `info` skips that, as it reads no weights.
StatusOr<LoadedModel> LoadModel(const std::string& model_id, uint64_t seed,
                                bool verify_checksums = true);

// The whole model as one fp32 arena (registry layout): for small models and single-process tools
// (`step`, benchmarks, tests); training and `evaluate` never do this.
AlignedBuffer MaterializeParams(const LoadedModel& m);

// --model-id as something LoadModel reads: a local directory, a file (a GGUF model) or a preset
// name unchanged; a hub id (org/name) is fetched into (or, offline, found in) the huggingface_hub
// cache and its snapshot directory returned. Anything else is returned unchanged for LoadModel to
// reject.
StatusOr<std::string> ResolveModelSource(const std::string& model_id, const HubOptions& hub);

}  // namespace st
