// LoRA adapters (Hu et al. 2021, as PEFT implements them) on the Linear weights of the Gemma 4
// text decoder: a targeted weight W [out, in] gets A [R, in] and B [out, R], and its layer computes
// y = x W^T + s * dropout(x) A^T B^T with s = alpha / R (alpha / sqrt(R) with rsLoRA).
// The adapters are ordinary registry entries appended after the base model's
// ("layers.3.self_attn.q_proj.lora_A.weight"): FSDP shards them, the optimizer steps them and
// checkpoints save them like any trainable tensor; only the engine's Linear and the PEFT files
// (io/peft_adapter.h) know what they are. Not the PEFT file format, not the CLI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/params.h"
#include "model/weights.h"

namespace st {

// PEFT's target_modules as given: names matched against the end of each module's name
// ("q_proj" matches "model.layers.0.self_attn.q_proj"), "all-linear", or (regex non-empty) one
// regular expression that must match a module's whole name, as PEFT's string form.
struct LoraTargets {
  std::vector<std::string> names;
  std::string regex;
};

// PEFT's default for Gemma: q_proj and v_proj of the language model.
LoraTargets DefaultLoraTargets();
// "q_proj,v_proj" or "all-linear" (the --lora-target-modules flag).
LoraTargets ParseLoraTargets(const std::string& flag);
std::string LoraTargetsString(const LoraTargets& t);
// PEFT's rule for a target name: it is the module's whole name or ends it at a dot ("q_proj"
// matches "model.layers.0.self_attn.q_proj", not "...self_attn.xq_proj").
bool EndsWithModule(const std::string& module, const std::string& target);

// Every Linear weight of the registry that `t` selects, as module names under `module_prefix`
// (where the text model sits in its Hugging Face class: "model." for Gemma4ForCausalLM,
// "model.language_model." for Gemma4ForConditionalGeneration). `others`: the LoRA-able modules of
// the model's other parts (a vision tower's, model/vision/vision_tower.h), which a name may select
// instead. InvalidArgument when the regex does not compile, a name selects nothing anywhere, or
// nothing in the text model is selected.
StatusOr<std::vector<int>> SelectLoraTargets(const ParamRegistry& reg, const LoraTargets& t,
                                             const std::string& module_prefix,
                                             const std::vector<std::string>& others = {});

// The base entries of PEFT's modules_to_save: every parameter of each module whose whole name
// (under `module_prefix`) ends with one of `names` (PEFT's plain suffix match: "norm" also
// matches "input_layernorm"); buffers are not trained. InvalidArgument when a name selects
// nothing, a selected tensor also has an adapter (`adapted`), or it is the tied embedding (PEFT
// would untie it: its trained copy serves the lookups, the head keeps the base's).
// `others`: module names of the model's other parts (a vision tower's linears and projection); a
// name that selects one of them and nothing in the text model is left to that part.
StatusOr<std::vector<int>> SelectModulesToSave(const ParamRegistry& reg,
                                               const std::vector<std::string>& names,
                                               const std::string& module_prefix,
                                               const std::vector<int>& adapted,
                                               const std::vector<std::string>& others = {});
// The module names (registry names without ".weight") of `entries`.
std::vector<std::string> ModuleNames(const ParamRegistry& reg, const std::vector<int>& entries);

// The registry's Linear weights (the tensors LoRA can adapt): every projection, not the
// embeddings (the tied LM head is excluded, as PEFT's all-linear excludes the output layer).
std::vector<int> LinearEntries(const ParamRegistry& reg);

// What adapters a model carries: the Linear entries (of the base registry) they adapt, their
// rank, scaling s and dropout probability. rank 0 = none.
struct LoraSpec {
  std::vector<int> targets;
  std::vector<int> full;  // base entries trained in full beside the adapters (modules_to_save)
  int64_t rank = 0;
  double scaling = 0;
  double dropout = 0;
  bool enabled() const { return rank > 0; }
};

// The spec of the adapters a registry carries (none: rank 0).
LoraSpec LoraSpecOf(const ParamRegistry& reg);

// Appends the adapters of `spec` to a base registry (nothing when !spec.enabled()).
void AddLoraAdapters(ParamRegistry* reg, const LoraSpec& spec);
// The base registry of cfg plus spec's adapters.
ParamRegistry BuildParamRegistry(const Gemma4Config& cfg, const LoraSpec& spec);

// s = alpha / R, or alpha / sqrt(R) with rsLoRA.
double LoraScaling(int64_t rank, double alpha, bool use_rslora);

// W + s B A for the adapted Linear `entry` of `reg` (its adapters read from `w`), into merged
// [out, in]: what PEFT's merge_and_unload leaves in the layer. Accumulated in fp32.
void MergeLora(const ParamRegistry& reg, const WeightSource& w, int entry, float* merged);

// The LoRA dropout mask of one adapted Linear's input in one step: element j (row-major [N, in])
// is kept when a counter-based hash of (seed, entry, j) is at least p * 2^32, and then scaled by
// 1 / (1 - p). A function of its arguments only, so the backward and a checkpointed recompute
// regenerate the forward's mask instead of storing it. Not torch's RNG: the masks differ from
// PEFT's, their statistics (each element dropped independently with probability p) do not.
struct LoraDropoutMask {
  uint64_t key = 0, threshold = 0;
  float scale = 1.0f;
  static LoraDropoutMask For(uint64_t seed, int entry, float p) {
    LoraDropoutMask m;
    m.key = seed * 0x100000001b3ull + static_cast<uint64_t>(entry) * 0x2545f4914f6cdd1dull;
    m.threshold = static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
    m.scale = 1.0f / (1.0f - p);
    return m;
  }
  bool Keep(int64_t j) const {
    uint64_t z = key + static_cast<uint64_t>(j) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z >> 32) >= threshold;
  }
};

// The weights of a registry with adapters: base entries from `base` (a source over the same
// registry without the adapters), adapter entries from `adapters` when given (a loaded PEFT
// adapter), else PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with
// a = sqrt(5)) from a counter-based stream per tensor (so any range reads the same values), B = 0.
class LoraWeights : public WeightSource {
 public:
  LoraWeights(const ParamRegistry& reg, std::unique_ptr<WeightSource> base, uint64_t seed,
              std::unique_ptr<WeightSource> adapters = nullptr);
  void Read(int entry, int64_t begin, int64_t count, float* dst) const override;
  void GatherRows(int entry, const int32_t* ids, int64_t n, float scale, float* out) const override;
  std::optional<Stored> StoredBytes(int entry) const override;
  void Release(int entry, int64_t begin = 0, int64_t count = -1) const override;
  DType dtype() const override { return base_->dtype(); }
  bool Generated() const override { return base_->Generated(); }
  const WeightSource& base() const { return *base_; }

 private:
  // Served by the base: a base entry not trained in full, or (no adapter file) any base entry.
  bool IsBase(int entry) const {
    return entry < reg_.base_entries && (!adapters_ || !reg_.lora_full[static_cast<size_t>(entry)]);
  }
  std::unique_ptr<WeightSource> base_, adapters_;
  uint64_t seed_;
};

}  // namespace st
