// PEFT LoRA adapter directories, as peft.PeftModel.save_pretrained writes them and
// PeftModel.from_pretrained reads them: adapter_config.json (r, lora_alpha, target_modules, ...)
// and adapter_model.safetensors with the adapters under PEFT's names
// ("base_model.model.<text prefix>layers.0.self_attn.q_proj.lora_A.weight"). Reads adapters made by
// PEFT or by slicetrain, refusing what slicetrain cannot run (DoRA, other adapter types, biases,
// per-layer rank patterns) with one line; writes what a slicetrain run trained. Not the training
// state (the resume shards beside it) and not the model: the base stays where it was.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_loader.h"
#include "model/lora.h"

namespace st {

constexpr const char* kAdapterConfigFile = "adapter_config.json";
constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

struct PeftAdapterConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  bool use_rslora = false;
  LoraTargets targets;
  std::vector<std::string> modules_to_save;  // trained in full beside the adapters
  std::string base_model_name_or_path;
};

// A directory holds an adapter when it has adapter_config.json.
bool IsAdapterDir(const std::string& dir);
StatusOr<PeftAdapterConfig> ReadPeftAdapterConfig(const std::string& dir);
// PEFT's JSON for `c`: the fields PEFT 0.21 writes for a LoRA of a causal LM.
std::string PeftAdapterConfigJson(const PeftAdapterConfig& c);

// target_modules as an adapter_config.json for a model whose text decoder sits at `text_prefix`
// must say them: names (or all-linear) unchanged for a causal LM; for a multimodal model a regex
// limited to the language model (PEFT's own form for gemma4), so that PEFT does not also wrap the
// vision and audio towers' layers of the same names. `tower_modules`: the vision tower's modules
// that carry adapters too; the regex then also selects them (a second alternative under
// model.vision_tower / model.embed_vision). A regex target is returned as given (it selected the
// tower's modules by the same rule).
LoraTargets PeftTargetsFor(const LoraTargets& t, const std::string& text_prefix,
                           const std::vector<std::string>& tower_modules = {});
// modules_to_save likewise: PEFT matches them by plain suffix over every module of the model, so
// for a multimodal model each selected module is named with its "language_model." path.
// `vision_projection`: the vision tower's projection is trained in full too.
std::vector<std::string> PeftModulesToSaveFor(const std::vector<std::string>& names,
                                              const ParamRegistry& reg,
                                              const std::string& text_prefix,
                                              bool vision_projection = false);

// The name PEFT gives a registry adapter entry of a model whose text decoder sits at `prefix`.
std::string PeftTensorName(const std::string& registry_name, const std::string& text_prefix);

// The LoRA spec of a run on `model` (its base registry): targets selected under the model's
// text prefix, scaling from alpha and rsLoRA. `tower_modules`: the model's vision tower's LoRA-able
// modules (vision::LoraModulesOf), which targets may also name (the tower's adapters are not in
// the spec: vision::VisionTower holds them).
StatusOr<LoraSpec> LoraSpecFor(const Gemma4Config& config, const ParamRegistry& base,
                               const PeftAdapterConfig& c,
                               const std::vector<std::string>& tower_modules = {});

// Turns a loaded base model into one with adapters: the registry gains the adapters of `spec`
// and the weights serve them from PEFT's initialisation (seeded) or, with `adapter_dir`, from
// that directory's adapter_model.safetensors (every adapter tensor present with its shape, a float
// dtype; unknown LoRA tensors are an error).
Status AttachLora(LoadedModel* model, const LoraSpec& spec, uint64_t seed,
                  const std::string& adapter_dir = "");
// AttachLora with the spec and tensors of an adapter directory.
Status AttachPeftAdapter(LoadedModel* model, const std::string& adapter_dir);

// LoadModel(model_id, seed), then, unless `adapter_dir` is empty, that PEFT adapter attached (its
// files checked first against the directory's checksums where it lists them; errors name
// --adapter): how evaluate, generate and export load a model.
StatusOr<LoadedModel> LoadModelWithAdapter(const std::string& model_id,
                                           const std::string& adapter_dir, uint64_t seed = 42);

// What WriteMergedModel wrote beyond the text model.
struct MergedTowers {
  int64_t tensors = 0;                   // the towers' tensors (vision, audio, their projections)
  int merged_vision_linears = 0;         // of them, vision linears with the adapter's LoRA merged
  bool projection_from_adapter = false;  // the projection is the adapter's (modules_to_save)
};

// `slicetrain export`: the base model with its adapters merged (W + s B A, PEFT's
// merge_and_unload) as a Hugging Face model directory, streamed tensor by tensor: merged tensors
// in `dtype`, the others copied as the base stores them. `model` carries the adapters. A
// multimodal base (Gemma4ForConditionalGeneration) keeps its towers: every tensor of its files
// the text model does not name is copied as stored, except the vision linears that
// `adapter_dir` adapts, written merged in `dtype` (the tower is read whole, as fp32, for that).
StatusOr<MergedTowers> WriteMergedModel(const LoadedModel& model, const std::string& out_dir,
                                        DType dtype, uint64_t max_shard_bytes,
                                        const std::string& adapter_dir = "");

}  // namespace st
