#include "io/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "io/files.h"
#include "io/hf_model.h"
#include "io/safetensors.h"
#include "model/vision/vision_tower.h"

namespace st {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// A PEFT option that slicetrain does not run is an error, never ignored: `field` set to anything
// but its default.
Status RefuseIfSet(const json& j, const std::string& path, const char* field, const char* what) {
  if (!j.contains(field)) return Status::Ok();
  const json& v = j[field];
  const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     ((v.is_object() || v.is_array()) && v.empty()) ||
                     (v.is_string() && (v == "none" || v.get<std::string>().empty()));
  if (unset) return Status::Ok();
  return InvalidArgument(StrCat(path, ": ", field, " = ", v.dump(), " (", what,
                                ") is not supported by slicetrain; use a plain LoRA adapter"));
}

// Reads the tensors of adapter_model.safetensors for the adapter entries of a registry.
class PeftAdapterWeights : public WeightSource {
 public:
  // The file's adapters of `tower_modules` (a vision tower's) and, when `saves_projection`, the
  // tower projection's copy are left to the tower (vision::VisionTower::LoadLora).
  static StatusOr<std::unique_ptr<PeftAdapterWeights>> Open(
      const std::string& dir, const ParamRegistry& reg, const std::string& text_prefix,
      const std::vector<std::string>& tower_modules, bool saves_projection) {
    const std::string path = (fs::path(dir) / kAdapterWeightsFile).string();
    ST_ASSIGN_OR_RETURN(SafeTensorsFile file, SafeTensorsFile::Open(path));
    std::unique_ptr<PeftAdapterWeights> w(new PeftAdapterWeights(reg));
    w->file_ = std::make_unique<SafeTensorsFile>(std::move(file));
    w->where_.assign(reg.layout.size(), nullptr);
    std::set<std::string> used;
    for (int i = 0; i < reg.layout.size(); ++i) {
      if (i < reg.base_entries && !reg.lora_full[static_cast<size_t>(i)]) continue;
      const ArenaEntry& e = reg.layout.entry(i);
      const std::string name = PeftTensorName(e.name, text_prefix);
      const SafeTensorInfo* t = w->file_->Find(name);
      if (!t)
        return DataLoss(StrCat(path, ": no tensor ", name,
                               "; the adapter does not match adapter_config.json and this model"));
      if (t->shape != e.shape)
        return DataLoss(StrCat(path, ": ", name, " has shape ", ShapeString(t->shape),
                               ", the model and adapter_config.json need ", ShapeString(e.shape)));
      if (!SafeTensorsFile::IsFloatDType(t->dtype))
        return DataLoss(StrCat(path, ": ", name, " has dtype ", t->dtype, ", not a float type"));
      w->where_[static_cast<size_t>(i)] = t;
      used.insert(name);
    }
    for (const std::string& m : tower_modules)
      for (const char* ab : {".lora_A.weight", ".lora_B.weight"})
        used.insert("base_model.model." + m + ab);
    // The projection's modules_to_save copy, the tower's too: only where adapter_config.json
    // lists it (a copy it does not name would be read by nobody).
    if (saves_projection)
      used.insert(StrCat("base_model.model.", vision::VisionTower::kProjectionModule, ".weight"));
    for (const SafeTensorInfo& t : w->file_->tensors())
      if (!used.count(t.name))
        return DataLoss(StrCat(path, ": tensor ", t.name,
                               " is not an adapter of the modules adapter_config.json targets "
                               "or saves in this model (other adapter types are not "
                               "supported)"));
    return w;
  }

  void Read(int entry, int64_t begin, int64_t count, float* dst) const override {
    const SafeTensorInfo* t = where_[static_cast<size_t>(entry)];
    ST_CHECK(t != nullptr) << "adapter file has no entry " << entry;
    file_->ReadF32Range(*t, begin, count, dst);
  }
  DType dtype() const override { return DType::kF32; }

 private:
  explicit PeftAdapterWeights(const ParamRegistry& reg) : WeightSource(reg) {}
  std::unique_ptr<SafeTensorsFile> file_;
  std::vector<const SafeTensorInfo*> where_;
};

}  // namespace

bool IsAdapterDir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kAdapterConfigFile, ec);
}

StatusOr<PeftAdapterConfig> ReadPeftAdapterConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigFile).string();
  std::ifstream in(path);
  if (!in)
    return NotFound(StrCat(path, ": cannot open; --adapter must name a PEFT adapter directory"));
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(StrCat(path, ": not a JSON object"));
  const std::string type = j.value("peft_type", std::string());
  if (type != "LORA")
    return InvalidArgument(
        StrCat(path, ": peft_type '", type, "' is not supported by slicetrain (LORA only)"));
  for (auto [field, what] : std::vector<std::pair<const char*, const char*>>{
           {"use_dora", "DoRA"},
           {"bias", "trained biases"},
           {"lora_bias", "a bias on lora_B"},
           {"fan_in_fan_out", "Conv1D-style weights"},
           {"rank_pattern", "per-module ranks"},
           {"alpha_pattern", "per-module alphas"},
           {"layers_to_transform", "a subset of layers"},
           {"layer_replication", "replicated layers"},
           {"exclude_modules", "excluded modules"},
           {"target_parameters", "adapters on parameters"},
           {"trainable_token_indices", "trainable token rows"},
           {"use_qalora", "QA-LoRA"},
           {"use_bdlora", "block-diagonal LoRA"}})
    ST_RETURN_IF_ERROR(RefuseIfSet(j, path, field, what));
  // PiSSA, OLoRA, CorDA and LoftQ change the base weights when they initialise the adapter; saved
  // without PEFT's conversion (init_lora_weights left as their name) the adapter needs that
  // changed base, which is not the model given.
  if (j.contains("init_lora_weights") && j["init_lora_weights"].is_string()) {
    const std::string init = j["init_lora_weights"].get<std::string>();
    for (const char* changes_base : {"pissa", "olora", "corda", "loftq"})
      if (init.rfind(changes_base, 0) == 0)
        return InvalidArgument(
            StrCat(path, ": init_lora_weights = \"", init,
                   "\" changed the base weights when the adapter was made; save it with PEFT's "
                   "path_initial_model_for_weight_conversion to get a plain LoRA adapter"));
  }
  PeftAdapterConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1)
    return DataLoss(StrCat(path, ": r must be a positive integer"));
  c.r = j["r"].get<int64_t>();
  c.lora_alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number()
                     ? j["lora_alpha"].get<double>()
                     : 8.0;  // PEFT's default
  c.lora_dropout = j.contains("lora_dropout") && j["lora_dropout"].is_number()
                       ? j["lora_dropout"].get<double>()
                       : 0.0;
  c.use_rslora =
      j.contains("use_rslora") && j["use_rslora"].is_boolean() && j["use_rslora"].get<bool>();
  const json& t = j.contains("target_modules") ? j["target_modules"] : json();
  if (t.is_string()) {
    // PEFT's string form is a regex, except its "all-linear" shorthand.
    if (t.get<std::string>() == "all-linear")
      c.targets.names = {"all-linear"};
    else
      c.targets.regex = t.get<std::string>();
  } else if (t.is_array() && !t.empty()) {
    for (const json& n : t) {
      if (!n.is_string()) return DataLoss(StrCat(path, ": target_modules holds a non-string"));
      c.targets.names.push_back(n.get<std::string>());
    }
  } else {
    return DataLoss(StrCat(path, ": target_modules must be a list of names or a regex"));
  }
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null()) {
    const json& m = j["modules_to_save"];
    if (!m.is_array()) return DataLoss(StrCat(path, ": modules_to_save must be a list of names"));
    for (const json& n : m) {
      if (!n.is_string()) return DataLoss(StrCat(path, ": modules_to_save holds a non-string"));
      c.modules_to_save.push_back(n.get<std::string>());
    }
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  return c;
}

std::string PeftAdapterConfigJson(const PeftAdapterConfig& c) {
  json j = json::object();
  j["alpha_pattern"] = json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["exclude_modules"] = nullptr;
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = c.lora_alpha;
  j["lora_bias"] = false;
  j["lora_dropout"] = c.lora_dropout;
  j["modules_to_save"] = c.modules_to_save.empty() ? json(nullptr) : json(c.modules_to_save);
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = json::object();
  j["revision"] = nullptr;
  if (!c.targets.regex.empty()) {
    j["target_modules"] = c.targets.regex;
  } else if (c.targets.names.size() == 1 && c.targets.names[0] == "all-linear") {
    j["target_modules"] = "all-linear";
  } else {
    std::set<std::string> sorted(c.targets.names.begin(), c.targets.names.end());
    j["target_modules"] = json(std::vector<std::string>(sorted.begin(), sorted.end()));
  }
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = c.use_rslora;
  return j.dump(2) + "\n";
}

LoraTargets PeftTargetsFor(const LoraTargets& t, const std::string& text_prefix,
                           const std::vector<std::string>& tower_modules) {
  if (!t.regex.empty() || (text_prefix == "model." && tower_modules.empty())) return t;
  const bool all = t.names.size() == 1 && t.names[0] == "all-linear";
  const std::vector<std::string> names =
      all ? std::vector<std::string>{"q_proj",
                                     "k_proj",
                                     "v_proj",
                                     "o_proj",
                                     "gate_proj",
                                     "up_proj",
                                     "down_proj",
                                     "per_layer_input_gate",
                                     "per_layer_projection",
                                     "per_layer_model_projection"}
          : t.names;
  // Appends `name` with its dots escaped.
  const auto append_escaped = [](std::string& out, const std::string& name) {
    for (char ch : name) {
      if (ch == '.') out.push_back('\\');
      out.push_back(ch);
    }
  };
  LoraTargets out;
  out.regex = text_prefix == "model." ? std::string() : R"(.*language_model\.(.*\.)?()";
  if (!out.regex.empty()) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (i) out.regex.push_back('|');
      append_escaped(out.regex, names[i]);
    }
    out.regex += ")";
  }
  // The tower: the names that select its adapted modules.
  const std::vector<std::string> tower_names =
      all ? std::vector<std::string>{"q_proj.linear",    "k_proj.linear",    "v_proj.linear",
                                     "o_proj.linear",    "gate_proj.linear", "up_proj.linear",
                                     "down_proj.linear", "input_proj",       "embedding_projection"}
          : t.names;
  std::string tower;
  for (const std::string& name : tower_names) {
    bool hit = false;
    for (const std::string& m : tower_modules) hit = hit || EndsWithModule(m, name);
    if (!hit) continue;
    if (!tower.empty()) tower.push_back('|');
    append_escaped(tower, name);
  }
  if (!tower.empty()) {
    if (!out.regex.empty()) out.regex.push_back('|');
    out.regex.append(R"(model\.(vision_tower|embed_vision)\.(.*\.)?()").append(tower).append(")");
  }
  return out;
}

StatusOr<MergedTowers> WriteMergedModel(const LoadedModel& model, const std::string& out_dir,
                                        DType dtype, uint64_t max_shard_bytes,
                                        const std::string& adapter_dir) {
  const ParamRegistry& reg = model.registry;
  const ParamRegistry base = BuildParamRegistry(model.config);
  const WeightSource& source = *model.weights;
  std::vector<DType> dtypes(static_cast<size_t>(base.layout.size()), dtype);
  for (int i = 0; i < base.layout.size(); ++i)
    if (reg.lora_a[static_cast<size_t>(i)] < 0)  // modules_to_save come from the adapter: none
      if (std::optional<WeightSource::Stored> s = source.StoredBytes(i)) dtypes[i] = s->dtype;
  // A multimodal base's towers, copied as stored except the vision linears the adapter adapts.
  ST_ASSIGN_OR_RETURN(const TowerTensors towers,
                      TowerTensors::Open(model.source, model.config, base));
  std::vector<TensorSpec> extra = towers.specs();
  std::vector<int> slot_of_extra(extra.size(), -1);
  std::unique_ptr<vision::VisionTower> tower;
  MergedTowers report;
  report.tensors = static_cast<int64_t>(extra.size());
  // The tower is read (fp32, 0.7 GB at E2B's widths) only for an adapter that changes it.
  bool adapts_tower = false;
  if (!extra.empty() && !adapter_dir.empty()) {
    StatusOr<vision::VisionConfig> vc = vision::ReadVisionConfig(model.source);
    StatusOr<PeftAdapterConfig> c = ReadPeftAdapterConfig(adapter_dir);
    if (vc.ok() && c.ok()) {
      StatusOr<vision::VisionTower::AdaptedParts> parts =
          vision::VisionTower::PartsOf(*vc, c->targets, c->modules_to_save);
      // (a config LoadLora would refuse is read there, to say why)
      adapts_tower = !parts.ok() || parts->any();
    }
  }
  if (adapts_tower) {
    ST_ASSIGN_OR_RETURN(tower, vision::VisionTower::Load(model.source));
    StatusOr<int> adapted = tower->LoadLora(adapter_dir);
    if (!adapted.ok()) return adapted.status().WithContext("--adapter " + adapter_dir);
    report.merged_vision_linears = adapted.value();
    const std::vector<std::string> modules = vision::VisionTower::LinearModules(tower->config());
    std::vector<int> slots = tower->LoraSlots();
    const int projection = static_cast<int>(modules.size()) - 1;  // its modules_to_save copy
    if (tower->projection_from_adapter() &&
        std::find(slots.begin(), slots.end(), projection) == slots.end())
      slots.push_back(projection);
    report.projection_from_adapter = tower->projection_from_adapter();
    for (int slot : slots)
      for (size_t k = 0; k < extra.size(); ++k)
        if (extra[k].name == modules[size_t(slot)] + ".weight") {
          slot_of_extra[k] = slot;
          extra[k].dtype = dtype;  // merged, as the text model's merged tensors
        }
  }
  ST_ASSIGN_OR_RETURN(
      std::unique_ptr<HfModelWriter> out,
      HfModelWriter::Create(out_dir, model.config, base, dtypes, dtype, max_shard_bytes, extra));
  std::vector<float> merged;
  for (int i = 0; i < base.layout.size(); ++i) {
    if (reg.lora_a[static_cast<size_t>(i)] < 0) {  // as the base (or modules_to_save) has it
      ST_RETURN_IF_ERROR(out->AppendFromSource(i, source));
      continue;
    }
    const int64_t numel = base.layout.entry(i).numel;
    merged.resize(static_cast<size_t>(numel));
    MergeLora(reg, source, i, merged.data());
    ST_RETURN_IF_ERROR(out->AppendF32(i, merged.data(), numel));
    source.Release(i);
  }
  for (size_t k = 0; k < extra.size(); ++k) {
    const int entry = base.layout.size() + static_cast<int>(k);
    if (slot_of_extra[k] < 0) {
      ST_RETURN_IF_ERROR(towers.CopyTo(k, entry, *out));
      continue;
    }
    const std::vector<float> w = tower->MergedWeight(slot_of_extra[k]);
    ST_RETURN_IF_ERROR(out->AppendF32(entry, w.data(), static_cast<int64_t>(w.size())));
  }
  ST_RETURN_IF_ERROR(out->Finish());
  return report;
}

std::vector<std::string> PeftModulesToSaveFor(const std::vector<std::string>& names,
                                              const ParamRegistry& reg,
                                              const std::string& text_prefix,
                                              bool vision_projection) {
  if (text_prefix == "model." || names.empty()) return names;
  std::set<std::string> modules;  // "language_model.layers.0.input_layernorm"
  for (int e = 0; e < reg.base_entries; ++e)
    if (reg.lora_full[static_cast<size_t>(e)])
      modules.insert(text_prefix.substr(6) + ModuleNames(reg, {e})[0]);
  if (vision_projection) modules.insert("embed_vision.embedding_projection");
  return std::vector<std::string>(modules.begin(), modules.end());
}

std::string PeftTensorName(const std::string& registry_name, const std::string& text_prefix) {
  return kPeftPrefix + text_prefix + registry_name;
}

StatusOr<LoraSpec> LoraSpecFor(const Gemma4Config& config, const ParamRegistry& base,
                               const PeftAdapterConfig& c,
                               const std::vector<std::string>& tower_modules) {
  if (c.r < 1) return InvalidArgument("the LoRA rank must be at least 1");
  if (c.lora_dropout < 0 || c.lora_dropout >= 1)
    return InvalidArgument(StrCat("the LoRA dropout must be in [0, 1), got ", c.lora_dropout));
  LoraSpec spec;
  ST_ASSIGN_OR_RETURN(spec.targets,
                      SelectLoraTargets(base, c.targets, TextPrefixFor(config), tower_modules));
  if (!c.modules_to_save.empty()) {
    ST_ASSIGN_OR_RETURN(
        spec.full, SelectModulesToSave(base, c.modules_to_save, TextPrefixFor(config), spec.targets,
                                       tower_modules));
  }
  spec.rank = c.r;
  spec.scaling = LoraScaling(c.r, c.lora_alpha, c.use_rslora);
  spec.dropout = c.lora_dropout;
  return spec;
}

Status AttachLora(LoadedModel* model, const LoraSpec& spec, uint64_t seed,
                  const std::string& adapter_dir) {
  ST_CHECK(!model->registry.HasAdapters()) << "adapters attached twice";
  ParamRegistry reg = model->registry;
  AddLoraAdapters(&reg, spec);
  std::unique_ptr<WeightSource> adapters;
  if (!adapter_dir.empty()) {
    const std::vector<std::string> tower_modules = vision::LoraModulesOf(model->source);
    bool saves_projection = false;
    if (!tower_modules.empty()) {
      ST_ASSIGN_OR_RETURN(const vision::VisionConfig vc, vision::ReadVisionConfig(model->source));
      ST_ASSIGN_OR_RETURN(const PeftAdapterConfig c, ReadPeftAdapterConfig(adapter_dir));
      ST_ASSIGN_OR_RETURN(saves_projection,
                          vision::VisionTower::SavesProjection(vc, c.modules_to_save));
    }
    ST_ASSIGN_OR_RETURN(adapters,
                        PeftAdapterWeights::Open(adapter_dir, reg, TextPrefixFor(model->config),
                                                 tower_modules, saves_projection));
  }
  model->weights =
      std::make_unique<LoraWeights>(reg, std::move(model->weights), seed, std::move(adapters));
  model->registry = std::move(reg);
  model->lora = spec;
  return Status::Ok();
}

Status AttachPeftAdapter(LoadedModel* model, const std::string& adapter_dir) {
  ST_ASSIGN_OR_RETURN(PeftAdapterConfig c, ReadPeftAdapterConfig(adapter_dir));
  StatusOr<LoraSpec> spec =
      LoraSpecFor(model->config, model->registry, c, vision::LoraModulesOf(model->source));
  if (!spec.ok()) return spec.status().WithContext(adapter_dir);
  return AttachLora(model, spec.value(), 0, adapter_dir);
}

StatusOr<LoadedModel> LoadModelWithAdapter(const std::string& model_id,
                                           const std::string& adapter_dir, uint64_t seed) {
  ST_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(model_id, seed));
  if (adapter_dir.empty()) return m;
  ST_RETURN_IF_ERROR(VerifyChecksumsIfListed(adapter_dir, {kAdapterConfigFile, kAdapterWeightsFile})
                         .WithContext("--adapter " + adapter_dir));
  ST_RETURN_IF_ERROR(AttachPeftAdapter(&m, adapter_dir));
  return m;
}

}  // namespace st
