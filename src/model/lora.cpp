#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>

#include "core/rng.h"

namespace st {

namespace {

// "layers.3.self_attn.q_proj.weight" -> "layers.3.self_attn.q_proj"
std::string ModuleOf(const std::string& name) {
  const std::string suffix = ".weight";
  return name.size() > suffix.size() &&
                 name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? name.substr(0, name.size() - suffix.size())
             : name;
}

}  // namespace

bool EndsWithModule(const std::string& module, const std::string& target) {
  if (module == target) return true;
  return module.size() > target.size() &&
         module.compare(module.size() - target.size(), target.size(), target) == 0 &&
         module[module.size() - target.size() - 1] == '.';
}

StatusOr<std::vector<int>> SelectModulesToSave(const ParamRegistry& reg,
                                               const std::vector<std::string>& names,
                                               const std::string& module_prefix,
                                               const std::vector<int>& adapted,
                                               const std::vector<std::string>& others) {
  std::vector<int> out;
  std::vector<bool> used(names.size(), false);
  for (int e = 0; e < reg.base_entries; ++e) {
    const std::string full = module_prefix + reg.layout.entry(e).name;
    // Every module containing the tensor: each prefix of its name that ends before a '.'.
    bool hit = false;
    for (size_t dot = full.find('.'); dot != std::string::npos; dot = full.find('.', dot + 1)) {
      const std::string module = full.substr(0, dot);
      for (size_t k = 0; k < names.size(); ++k)
        if (module.size() >= names[k].size() &&
            module.compare(module.size() - names[k].size(), names[k].size(), names[k]) == 0) {
          hit = true;
          used[k] = true;
        }
    }
    if (!hit || reg.is_buffer[static_cast<size_t>(e)]) continue;
    if (e == reg.embed_tokens)
      return InvalidArgument(
          "modules_to_save selects embed_tokens, which is tied to the LM head: PEFT would train an "
          "untied copy for the input lookups only, which slicetrain does not run; leave it out");
    if (std::find(adapted.begin(), adapted.end(), e) != adapted.end())
      return InvalidArgument(StrCat("modules_to_save selects ", reg.layout.entry(e).name,
                                    ", which also has a LoRA adapter; a module is either adapted "
                                    "or trained in full"));
    out.push_back(e);
  }
  for (size_t k = 0; k < names.size(); ++k)
    for (const std::string& m : others)
      used[k] = used[k] || (m.size() >= names[k].size() &&
                            m.compare(m.size() - names[k].size(), names[k].size(), names[k]) == 0);
  for (size_t k = 0; k < names.size(); ++k)
    if (!used[k])
      return InvalidArgument(StrCat("modules_to_save '", names[k],
                                    "' matches no module of this model (names such as norm, "
                                    "embed_tokens, input_layernorm, layers.3.mlp)"));
  return out;
}

std::vector<std::string> ModuleNames(const ParamRegistry& reg, const std::vector<int>& entries) {
  std::vector<std::string> out;
  for (int e : entries) out.push_back(ModuleOf(reg.layout.entry(e).name));
  return out;
}

LoraTargets DefaultLoraTargets() {
  return LoraTargets{{"q_proj", "v_proj"}, ""};
}

LoraTargets ParseLoraTargets(const std::string& flag) {
  LoraTargets t;
  std::stringstream in(flag);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) t.names.push_back(item);
  }
  return t;
}

std::string LoraTargetsString(const LoraTargets& t) {
  if (!t.regex.empty()) return t.regex;
  std::string s;
  for (const std::string& n : t.names) s += (s.empty() ? "" : ",") + n;
  return s;
}

std::vector<int> LinearEntries(const ParamRegistry& reg) {
  std::vector<int> out;
  if (reg.per_layer_model_projection >= 0) out.push_back(reg.per_layer_model_projection);
  for (const LayerParams& lp : reg.layers)
    for (int e : {lp.q_proj, lp.k_proj, lp.v_proj, lp.o_proj, lp.gate_proj, lp.up_proj,
                  lp.down_proj, lp.per_layer_input_gate, lp.per_layer_projection})
      if (e >= 0) out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// A target that names the vision or audio tower (or their projections) of a model whose other
// modules are `others`: why it selects nothing.
std::string TowerNote(const LoraTargets& t, const std::vector<std::string>& others) {
  const std::string all = LoraTargetsString(t);
  if (all.find("audio") != std::string::npos)
    return " (LoRA reaches the text model and the vision tower: the audio tower stays frozen)";
  if (all.find("vision") != std::string::npos && others.empty())
    return " (this model has no vision tower)";
  if (!others.empty())
    return "; in the vision tower q_proj.linear,k_proj.linear,v_proj.linear,o_proj.linear,"
           "gate_proj.linear,up_proj.linear,down_proj.linear,input_proj,embedding_projection";
  return "";
}

// Text targets, none, but the tower's selected: refused (LoRA needs a text adapter here).
Status TowerOnly(const LoraTargets& t) {
  return InvalidArgument(StrCat("LoRA target_modules '", LoraTargetsString(t),
                                "' select only the vision tower's linears: add a text target ",
                                "(e.g. q_proj,v_proj or all-linear); LoRA on the tower alone is "
                                "not supported"));
}

}  // namespace

StatusOr<std::vector<int>> SelectLoraTargets(const ParamRegistry& reg, const LoraTargets& t,
                                             const std::string& module_prefix,
                                             const std::vector<std::string>& others) {
  const std::vector<int> linear = LinearEntries(reg);
  std::vector<int> out;
  bool others_hit = false;
  if (!t.regex.empty()) {
    std::regex re;
    try {
      re = std::regex(t.regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgument(StrCat("LoRA target_modules '", t.regex,
                                    "' is not a valid regular expression: ", e.what()));
    }
    for (int e : linear)
      if (std::regex_match(module_prefix + ModuleOf(reg.layout.entry(e).name), re))
        out.push_back(e);
    for (const std::string& m : others) others_hit = others_hit || std::regex_match(m, re);
  } else {
    const bool all = std::find(t.names.begin(), t.names.end(), "all-linear") != t.names.end();
    if (all && t.names.size() > 1)
      return InvalidArgument("--lora-target-modules all-linear cannot be combined with names");
    for (const std::string& name : t.names) {
      if (all) break;
      bool found = false, elsewhere = false;
      for (int e : linear)
        if (EndsWithModule(module_prefix + ModuleOf(reg.layout.entry(e).name), name)) found = true;
      for (const std::string& m : others) elsewhere = elsewhere || EndsWithModule(m, name);
      others_hit = others_hit || elsewhere;
      if (!found && !elsewhere)
        return InvalidArgument(StrCat(
            "LoRA target module '", name,
            "' matches no Linear layer of this model; use names such as q_proj,k_proj,v_proj,"
            "o_proj,gate_proj,up_proj,down_proj,per_layer_input_gate,per_layer_projection,"
            "per_layer_model_projection, or all-linear",
            TowerNote(t, others)));
    }
    for (int e : linear) {
      const std::string module = module_prefix + ModuleOf(reg.layout.entry(e).name);
      bool hit = all;
      for (const std::string& name : t.names) hit = hit || EndsWithModule(module, name);
      if (hit) out.push_back(e);
    }
  }
  if (out.empty() && others_hit) return TowerOnly(t);
  if (out.empty())
    return InvalidArgument(StrCat("LoRA target_modules '", LoraTargetsString(t),
                                  "' selects no Linear layer of this model", TowerNote(t, others)));
  return out;
}

double LoraScaling(int64_t rank, double alpha, bool use_rslora) {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                    : alpha / static_cast<double>(rank);
}

LoraSpec LoraSpecOf(const ParamRegistry& reg) {
  LoraSpec s;
  if (!reg.HasAdapters()) return s;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (reg.lora_a[static_cast<size_t>(e)] >= 0) s.targets.push_back(e);
    if (reg.lora_full[static_cast<size_t>(e)]) s.full.push_back(e);
  }
  s.rank = reg.lora_rank;
  s.scaling = reg.lora_scaling;
  s.dropout = reg.lora_dropout;
  return s;
}

ParamRegistry BuildParamRegistry(const Gemma4Config& cfg, const LoraSpec& spec) {
  ParamRegistry reg = BuildParamRegistry(cfg);
  AddLoraAdapters(&reg, spec);
  return reg;
}

void AddLoraAdapters(ParamRegistry* reg, const LoraSpec& spec) {
  if (!spec.enabled()) return;
  const int64_t rank = spec.rank;
  ST_CHECK(!reg->HasAdapters()) << "adapters added twice";
  ST_CHECK(reg->layout.size() == reg->base_entries) << "adapters must follow the base entries";
  ArenaLayout& l = reg->layout;
  for (int e : spec.targets) {
    const ArenaEntry base = l.entry(e);  // a copy: Add may move the entries
    ST_CHECK(base.shape.size() == 2) << base.name << " is not a Linear weight";
    const std::string module = ModuleOf(base.name);
    const int a = l.Add(module + ".lora_A.weight", {rank, base.shape[1]});
    const int b = l.Add(module + ".lora_B.weight", {base.shape[0], rank});
    reg->lora_a[static_cast<size_t>(e)] = a;
    reg->lora_b[static_cast<size_t>(e)] = b;
    for (int k = 0; k < 2; ++k) {
      reg->is_buffer.push_back(false);
      reg->is_norm.push_back(false);
      reg->lora_a.push_back(-1);
      reg->lora_b.push_back(-1);
      reg->lora_base.push_back(e);
      reg->lora_full.push_back(false);
    }
  }
  for (int e : spec.full) reg->lora_full[static_cast<size_t>(e)] = true;
  reg->lora_rank = rank;
  reg->lora_scaling = static_cast<float>(spec.scaling);
  reg->lora_dropout = static_cast<float>(spec.dropout);
}

void MergeLora(const ParamRegistry& reg, const WeightSource& w, int entry, float* merged) {
  const ArenaEntry& e = reg.layout.entry(entry);
  const int64_t rows = e.shape[0], cols = e.shape[1], R = reg.lora_rank;
  w.ReadAll(entry, merged);
  std::vector<float> A(static_cast<size_t>(R * cols)), B(static_cast<size_t>(rows * R));
  w.ReadAll(reg.lora_a[static_cast<size_t>(entry)], A.data());
  w.ReadAll(reg.lora_b[static_cast<size_t>(entry)], B.data());
  const double s = reg.lora_scaling;
#pragma omp parallel for schedule(static) if (rows * cols * R > (1 << 18))
  for (int64_t o = 0; o < rows; ++o) {
    float* out = merged + o * cols;
    for (int64_t r = 0; r < R; ++r) {
      const float b = static_cast<float>(s * B[static_cast<size_t>(o * R + r)]);
      const float* a = A.data() + r * cols;
      for (int64_t i = 0; i < cols; ++i) out[i] += b * a[i];
    }
  }
}

LoraWeights::LoraWeights(const ParamRegistry& reg, std::unique_ptr<WeightSource> base,
                         uint64_t seed, std::unique_ptr<WeightSource> adapters)
    : WeightSource(reg), base_(std::move(base)), adapters_(std::move(adapters)), seed_(seed) {
  ST_CHECK(base_ != nullptr) << "LoRA weights without a base";
}

void LoraWeights::Read(int entry, int64_t begin, int64_t count, float* dst) const {
  if (IsBase(entry)) return base_->Read(entry, begin, count, dst);
  if (adapters_) return adapters_->Read(entry, begin, count, dst);  // adapters, modules_to_save
  const ArenaEntry& e = reg_.layout.entry(entry);
  const int base = reg_.lora_base[static_cast<size_t>(entry)];
  if (entry == reg_.lora_b[static_cast<size_t>(base)]) {  // B starts at zero
    std::fill(dst, dst + count, 0.0f);
    return;
  }
  // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(e.shape[1]));
  const uint64_t stream =
      seed_ * 0x100000001b3ull + static_cast<uint64_t>(entry) * 0x9e3779b97f4a7c15ull + 0x4c6f5241;
  Rng rng(stream);
  rng.Skip(static_cast<uint64_t>(begin));
  for (int64_t j = 0; j < count; ++j)
    dst[j] = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
}

void LoraWeights::GatherRows(int entry, const int32_t* ids, int64_t n, float scale,
                             float* out) const {
  if (IsBase(entry)) return base_->GatherRows(entry, ids, n, scale, out);
  WeightSource::GatherRows(entry, ids, n, scale, out);
}

std::optional<WeightSource::Stored> LoraWeights::StoredBytes(int entry) const {
  if (IsBase(entry)) return base_->StoredBytes(entry);
  return adapters_ ? adapters_->StoredBytes(entry) : std::nullopt;
}

void LoraWeights::Release(int entry, int64_t begin, int64_t count) const {
  if (IsBase(entry)) return base_->Release(entry, begin, count);
  if (adapters_) adapters_->Release(entry, begin, count);
}

}  // namespace st
