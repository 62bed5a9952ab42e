// Gemma 4's vision tower, forward and backward (vision_tower.h). Reference-style fp32 code on the
// CPU backend's matrix products and kernels: correct first; its speed is not yet tuned
// (docs/vision.md).
#include "model/vision/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "core/rng.h"
#include "io/hf_model.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/gelu.h"

namespace st::vision {
namespace {

// rows [n, c] in place: x * (mean(x^2) + eps)^-0.5 [* w] (Gemma4RMSNorm), with the backend's
// kernel; `rstd` receives the n scales.
void RmsNormRows(float* x, int64_t n, int64_t c, const float* w, double eps,
                 std::vector<float>& rstd) {
  if (rstd.size() < size_t(n)) rstd.resize(static_cast<size_t>(n));
  cpu::RmsNormForward(x, w, x, rstd.data(), n, c, static_cast<float>(eps));
}

// The tensors of a model directory, looked up by name across its safetensors files.
class Tensors {
 public:
  static StatusOr<Tensors> Open(const std::string& dir) {
    ST_ASSIGN_OR_RETURN(const std::vector<std::string> files, ModelWeightFiles(dir));
    Tensors t;
    for (const std::string& f : files) {
      ST_ASSIGN_OR_RETURN(SafeTensorsFile file, SafeTensorsFile::Open(f));
      t.files_.push_back(std::move(file));
    }
    return t;
  }
  Status Read(const std::string& name, const Shape& shape, std::vector<float>* out) const {
    for (const SafeTensorsFile& f : files_)
      if (f.Find(name)) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        out->resize(static_cast<size_t>(n));
        return f.ReadF32(name, out->data(), shape);
      }
    return NotFound(StrCat("tensor ", name, " is not in the model's files"));
  }
  // A scalar buffer (a clipping bound); absent means unbounded, as transformers initialises it.
  StatusOr<float> Scalar(const std::string& name, float fallback) const {
    for (const SafeTensorsFile& f : files_)
      if (const SafeTensorInfo* t = f.Find(name)) {
        int64_t n = 1;
        for (int64_t d : t->shape) n *= d;
        if (n != 1) return DataLoss(StrCat(f.path(), ": ", name, " holds ", n, " values, not one"));
        float v = 0;
        ST_RETURN_IF_ERROR(f.ReadF32(name, &v, {}));
        return v;
      }
    return fallback;
  }

 private:
  std::vector<SafeTensorsFile> files_;
};

StatusOr<int> Int(const nlohmann::json& j, const char* key, int fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > 1 << 20)
    return InvalidArgument(StrCat("vision_config.", key, " must be a positive integer"));
  return j[key].get<int>();
}

// row[0..n) = softmax(row), in fp32. The exponentials in a loop of their own, which GCC
// vectorises (FastExp, ~1 ulp); libm's expf here was a tenth of a LoRA step at E2B's widths.
void SoftmaxRow(float* row, int64_t n) {
  const float mx = *std::max_element(row, row + n);
  for (int64_t j = 0; j < n; ++j) row[j] = cpu::FastExp(row[j] - mx);
  float total = 0;
  for (int64_t j = 0; j < n; ++j) total += row[j];
  const float inv = 1.0f / total;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// (in, out) of linear `slot` (VisionTower::LinearModules' order).
std::pair<int64_t, int64_t> SlotShape(const VisionConfig& c, int slot) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_out = int64_t(c.num_attention_heads) * c.head_dim,
                kv_out = int64_t(c.num_key_value_heads) * c.head_dim;
  if (slot == 0) return {3 * int64_t(c.patch_size) * c.patch_size, H};
  if (slot == 7 * c.num_hidden_layers + 1) return {H, c.text_hidden_size};
  switch ((slot - 1) % 7) {
    case 0:
      return {H, q_out};
    case 1:
    case 2:
      return {H, kv_out};
    case 3:
      return {q_out, H};
    case 4:
    case 5:
      return {H, I};
    default:
      return {I, H};
  }
}

}  // namespace

StatusOr<VisionConfig> ReadVisionConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::ifstream f(path);
  if (!f) return NotFound(StrCat(path, ": cannot open"));
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(StrCat(path, ": not a JSON object"));
  if (!j.contains("vision_config") || j["vision_config"].is_null())
    return NotFound(StrCat(path, ": the model has no vision tower (no vision_config)"));
  const nlohmann::json& v = j["vision_config"];
  if (!v.is_object()) return DataLoss(StrCat(path, ": vision_config is not an object"));
  VisionConfig c;
  Status err;
  const auto get = [&](const char* key, int* field) {
    if (!err.ok()) return;
    StatusOr<int> x = Int(v, key, *field);
    if (x.ok())
      *field = *x;
    else
      err = x.status();
  };
  get("hidden_size", &c.hidden_size);
  get("intermediate_size", &c.intermediate_size);
  get("num_hidden_layers", &c.num_hidden_layers);
  get("num_attention_heads", &c.num_attention_heads);
  get("num_key_value_heads", &c.num_key_value_heads);
  get("head_dim", &c.head_dim);
  get("patch_size", &c.patch_size);
  get("position_embedding_size", &c.position_embedding_size);
  get("pooling_kernel_size", &c.pooling_kernel_size);
  if (err.ok() && v.contains("rms_norm_eps")) {
    if (v["rms_norm_eps"].is_number())
      c.rms_norm_eps = v["rms_norm_eps"].get<double>();
    else
      err = InvalidArgument("vision_config.rms_norm_eps must be a number");
  }
  if (err.ok() && v.contains("rope_parameters") && v["rope_parameters"].is_object()) {
    const nlohmann::json& r = v["rope_parameters"];
    if (r.contains("rope_type") && r["rope_type"] != "axial")
      err = Unimplemented(StrCat("vision_config.rope_parameters.rope_type ", r["rope_type"].dump(),
                                 " is not supported (Gemma 4's tower uses axial)"));
    else if (r.contains("rope_theta") && r["rope_theta"].is_number())
      c.rope_theta = r["rope_theta"].get<double>();
  }
  for (const char* key : {"use_clipped_linears", "standardize"}) {
    if (!err.ok() || !v.contains(key)) continue;
    if (!v[key].is_boolean()) {
      err = InvalidArgument(StrCat("vision_config.", key, " must be true or false"));
      break;
    }
    (std::string(key) == "standardize" ? c.standardize : c.use_clipped_linears) =
        v[key].get<bool>();
  }
  if (err.ok() && v.contains("hidden_activation") && v["hidden_activation"] != "gelu_pytorch_tanh")
    err = Unimplemented(StrCat("vision_config.hidden_activation ", v["hidden_activation"].dump(),
                               " is not supported (Gemma 4's tower uses gelu_pytorch_tanh)"));
  if (err.ok() && (c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim % 4 != 0))
    err = InvalidArgument(
        "vision_config: num_attention_heads must be a multiple of num_key_value_heads and head_dim "
        "a multiple of 4");
  if (err.ok()) {
    const nlohmann::json t = j.value("text_config", nlohmann::json::object());
    StatusOr<int> w = Int(t, "hidden_size", 0);
    if (!w.ok() || *w == 0)
      err =
          InvalidArgument("text_config.hidden_size is missing: the width soft tokens project into");
    else
      c.text_hidden_size = *w;
  }
  for (auto [key, field] :
       {std::pair{"boi_token_id", &c.boi_token_id}, std::pair{"image_token_id", &c.image_token_id},
        std::pair{"eoi_token_id", &c.eoi_token_id}}) {
    if (!err.ok() || !j.contains(key)) continue;
    StatusOr<int> id = Int(j, key, *field);
    if (!id.ok() || *id < 0)
      err = InvalidArgument(StrCat(key, " must be a token id"));
    else
      *field = *id;
  }
  if (!err.ok()) return err.WithContext(path);
  c.audio_tower = j.contains("audio_config") && j["audio_config"].is_object();
  return c;
}

void VisionTensors::ForEach(
    const VisionConfig& c,
    const std::function<void(const std::string&, const std::vector<int64_t>&, std::vector<float>&)>&
        fn) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_out = int64_t(c.num_attention_heads) * D,
                kv_out = int64_t(c.num_key_value_heads) * D;
  const std::string pre = "model.vision_tower.";
  fn(pre + "patch_embedder.input_proj.weight", {H, 3 * int64_t(c.patch_size) * c.patch_size},
     input_proj);
  fn(pre + "patch_embedder.position_embedding_table", {2, c.position_embedding_size, H},
     position_table);
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string p = pre + "encoder.layers." + std::to_string(l) + ".";
    VisionLayerTensors& L = layers[l];
    fn(p + "input_layernorm.weight", {H}, L.input_norm);
    fn(p + "post_attention_layernorm.weight", {H}, L.post_attn_norm);
    fn(p + "pre_feedforward_layernorm.weight", {H}, L.pre_ff_norm);
    fn(p + "post_feedforward_layernorm.weight", {H}, L.post_ff_norm);
    fn(p + "self_attn.q_norm.weight", {D}, L.q_norm);
    fn(p + "self_attn.k_norm.weight", {D}, L.k_norm);
    fn(p + "self_attn.q_proj.linear.weight", {q_out, H}, L.q);
    fn(p + "self_attn.k_proj.linear.weight", {kv_out, H}, L.k);
    fn(p + "self_attn.v_proj.linear.weight", {kv_out, H}, L.v);
    fn(p + "self_attn.o_proj.linear.weight", {H, q_out}, L.o);
    fn(p + "mlp.gate_proj.linear.weight", {I, H}, L.gate);
    fn(p + "mlp.up_proj.linear.weight", {I, H}, L.up);
    fn(p + "mlp.down_proj.linear.weight", {H, I}, L.down);
  }
  fn("model.embed_vision.embedding_projection.weight", {c.text_hidden_size, H}, projection);
  const std::vector<std::string> modules = VisionTower::LinearModules(c);
  for (size_t slot = 0; slot < lora_a.size() && slot < modules.size(); ++slot) {
    if (lora_a[slot].empty()) continue;
    const auto [in, out] = SlotShape(c, static_cast<int>(slot));
    const int64_t rank = static_cast<int64_t>(lora_a[slot].size()) / in;
    fn(modules[slot] + ".lora_A.weight", {rank, in}, lora_a[slot]);
    fn(modules[slot] + ".lora_B.weight", {out, rank}, lora_b[slot]);
  }
}

VisionTensors VisionTensors::ZerosLike(bool base) const {
  // Sized as the originals (never copied: the base tensors are the tower's whole weight).
  const auto zeros = [base](const std::vector<float>& v) {
    return base ? std::vector<float>(v.size(), 0.0f) : std::vector<float>();
  };
  VisionTensors t;
  t.input_proj = zeros(input_proj);
  t.position_table = zeros(position_table);
  t.projection = zeros(projection);
  t.layers.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const VisionLayerTensors& from = layers[l];
    VisionLayerTensors& to = t.layers[l];
    for (auto member :
         {&VisionLayerTensors::input_norm, &VisionLayerTensors::post_attn_norm,
          &VisionLayerTensors::pre_ff_norm, &VisionLayerTensors::post_ff_norm,
          &VisionLayerTensors::q_norm, &VisionLayerTensors::k_norm, &VisionLayerTensors::q,
          &VisionLayerTensors::k, &VisionLayerTensors::v, &VisionLayerTensors::o,
          &VisionLayerTensors::gate, &VisionLayerTensors::up, &VisionLayerTensors::down})
      to.*member = zeros(from.*member);
  }
  for (const auto& [from, to] : {std::pair{&lora_a, &t.lora_a}, std::pair{&lora_b, &t.lora_b}})
    for (const std::vector<float>& v : *from) to->emplace_back(v.size(), 0.0f);
  return t;
}

std::vector<std::string> VisionTower::LinearModules(const VisionConfig& c) {
  std::vector<std::string> m = {"model.vision_tower.patch_embedder.input_proj"};
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (const char* name : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                             "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      m.push_back(StrCat("model.vision_tower.encoder.layers.", l, ".", name, ".linear"));
  m.push_back("model.embed_vision.embedding_projection");
  return m;
}

StatusOr<std::vector<int>> VisionTower::SelectLoraSlots(const VisionConfig& c,
                                                        const LoraTargets& targets) {
  const std::vector<std::string> modules = LinearModules(c);
  std::optional<std::regex> re;
  if (!targets.regex.empty()) {
    try {
      re.emplace(targets.regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgument(StrCat("LoRA target_modules '", targets.regex,
                                    "' is not a regular expression: ", e.what()));
    }
  }
  std::vector<int> slots;
  for (size_t slot = 0; slot < modules.size(); ++slot) {
    const std::string& m = modules[slot];
    bool hit = re && std::regex_match(m, *re);
    for (const std::string& t : targets.names)
      hit = hit || t == "all-linear" || EndsWithModule(m, t);
    if (hit) slots.push_back(static_cast<int>(slot));
  }
  return slots;
}

StatusOr<std::vector<std::string>> VisionTower::EnableLora(const LoraTargets& targets, int64_t rank,
                                                           double scaling, uint64_t seed) {
  if (rank <= 0) return InvalidArgument("the LoRA rank must be positive");
  const std::vector<std::string> modules = LinearModules(cfg_);
  ST_ASSIGN_OR_RETURN(const std::vector<int> slots, SelectLoraSlots(cfg_, targets));
  const auto selected = [&](const std::string& m) {
    for (int s : slots)
      if (modules[size_t(s)] == m) return true;
    return false;
  };
  w_.lora_a.assign(modules.size(), {});
  w_.lora_b.assign(modules.size(), {});
  std::vector<std::string> chosen;
  for (size_t slot = 0; slot < modules.size(); ++slot) {
    if (!selected(modules[slot])) continue;
    const auto [in, out] = SlotShape(cfg_, static_cast<int>(slot));
    std::vector<float>& a = w_.lora_a[slot];
    a.resize(static_cast<size_t>(rank * in));
    // kaiming_uniform_(a = sqrt(5)): bound 1 / sqrt(fan_in), as PEFT initialises lora_A.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    Rng rng(seed * 0x100000001b3ull + slot * 0x9e3779b97f4a7c15ull + 0x56695341);
    for (float& v : a) v = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
    w_.lora_b[slot].assign(static_cast<size_t>(out * rank), 0.0f);
    chosen.push_back(modules[slot]);
  }
  if (chosen.empty()) {
    w_.lora_a.clear();
    w_.lora_b.clear();
    return InvalidArgument(StrCat("LoRA target_modules ", LoraTargetsString(targets),
                                  " select none of the vision tower's linears (",
                                  "q_proj.linear, ..., down_proj.linear, input_proj, "
                                  "embedding_projection, or all-linear)"));
  }
  lora_rank_ = rank;
  lora_scaling_ = static_cast<float>(scaling);
  return chosen;
}

StatusOr<bool> VisionTower::SavesProjection(const VisionConfig& c,
                                            const std::vector<std::string>& names) {
  const auto ends = [](const std::string& module, const std::string& name) {
    return module.size() >= name.size() &&
           module.compare(module.size() - name.size(), name.size(), name) == 0;
  };
  bool projection = false;
  const std::vector<std::string> modules = LinearModules(c);
  for (const std::string& name : names) {
    if (name.empty()) continue;
    projection = projection || ends(kProjectionModule, name);
    if (c.audio_tower && ends("model.embed_audio.embedding_projection", name) &&
        ends(kProjectionModule, name))
      return InvalidArgument(StrCat("modules_to_save '", name,
                                    "' selects the audio tower's projection too, which stays "
                                    "read-only: name embed_vision.embedding_projection"));
    for (size_t slot = 0; slot + 1 < modules.size(); ++slot) {
      const std::string& m = modules[slot];
      const std::string wrapper =
          ends(m, ".linear") ? m.substr(0, m.size() - std::string(".linear").size()) : m;
      if (ends(m, name) || ends(wrapper, name))
        return InvalidArgument(StrCat("modules_to_save '", name, "' selects ", m,
                                      " in the vision tower, which is trained only through LoRA "
                                      "(--lora-target-modules); of the tower only "
                                      "embed_vision.embedding_projection is trained in full"));
    }
  }
  return projection;
}

StatusOr<VisionTower::AdaptedParts> VisionTower::PartsOf(
    const VisionConfig& c, const LoraTargets& targets,
    const std::vector<std::string>& modules_to_save) {
  AdaptedParts p;
  ST_ASSIGN_OR_RETURN(p.slots, SelectLoraSlots(c, targets));
  ST_ASSIGN_OR_RETURN(p.projection, SavesProjection(c, modules_to_save));
  return p;
}

int64_t VisionTower::LoraValues(const VisionConfig& c, const std::vector<int>& slots,
                                int64_t rank) {
  int64_t n = 0;
  for (int slot : slots) {
    const auto [in, out] = SlotShape(c, slot);
    n += rank * (in + out);
  }
  return n;
}

std::vector<int> VisionTower::LoraSlots() const {
  std::vector<int> slots;
  for (size_t slot = 0; slot < w_.lora_a.size(); ++slot)
    if (!w_.lora_a[slot].empty()) slots.push_back(static_cast<int>(slot));
  return slots;
}

const std::vector<float>& VisionTower::SlotWeight(int slot) const {
  if (slot == 0) return w_.input_proj;
  if (slot == ProjectionSlot()) return w_.projection;
  const VisionLayerTensors& L = w_.layers[size_t((slot - 1) / 7)];
  const std::vector<float>* by_kind[] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
  return *by_kind[(slot - 1) % 7];
}

std::vector<float> VisionTower::MergedWeight(int slot) const {
  std::vector<float> w = SlotWeight(slot);
  if (size_t(slot) >= w_.lora_a.size() || w_.lora_a[size_t(slot)].empty()) return w;
  const auto [in, out] = SlotShape(cfg_, slot);
  // W [out, in] += s * B [out, r] A [r, in]
  cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, out, in, lora_rank_, lora_scaling_,
            w_.lora_b[size_t(slot)].data(), lora_rank_, w_.lora_a[size_t(slot)].data(), in, 1.0f,
            w.data(), in);
  return w;
}

std::vector<std::string> LoraModulesOf(const std::string& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) return {};
  const StatusOr<VisionConfig> c = ReadVisionConfig(model_dir);
  return c.ok() ? VisionTower::LinearModules(c.value()) : std::vector<std::string>{};
}

StatusOr<int> VisionTower::LoadLora(const std::string& adapter_dir) {
  ST_ASSIGN_OR_RETURN(const PeftAdapterConfig c, ReadPeftAdapterConfig(adapter_dir));
  ST_ASSIGN_OR_RETURN(const AdaptedParts parts, PartsOf(cfg_, c.targets, c.modules_to_save));
  if (!parts.any()) return 0;
  const std::vector<int>& slots = parts.slots;
  const bool projection = parts.projection;
  const std::string path = (std::filesystem::path(adapter_dir) / kAdapterWeightsFile).string();
  ST_ASSIGN_OR_RETURN(const SafeTensorsFile f, SafeTensorsFile::Open(path));
  if (projection) {
    const std::string name = StrCat("base_model.model.", kProjectionModule, ".weight");
    if (!f.Find(name))
      return DataLoss(StrCat(path, ": no tensor ", name,
                             ", which adapter_config.json's modules_to_save select"));
    ST_RETURN_IF_ERROR(f.ReadF32(name, w_.projection.data(),
                                 {int64_t(cfg_.text_hidden_size), int64_t(cfg_.hidden_size)}));
    projection_from_adapter_ = true;
  }
  if (slots.empty()) return 0;
  ST_RETURN_IF_ERROR(
      EnableLora(c.targets, c.r, LoraScaling(c.r, c.lora_alpha, c.use_rslora), 0).status());
  const std::vector<std::string> modules = LinearModules(cfg_);
  for (int slot : slots) {
    const auto [in, out] = SlotShape(cfg_, slot);
    for (const bool is_b : {false, true}) {
      const std::string name = StrCat("base_model.model.", modules[size_t(slot)],
                                      is_b ? ".lora_B" : ".lora_A", ".weight");
      if (!f.Find(name))
        return DataLoss(StrCat(path, ": no tensor ", name, ", which adapter_config.json's ",
                               "target_modules select in the vision tower"));
      std::vector<float>& dst = is_b ? w_.lora_b[size_t(slot)] : w_.lora_a[size_t(slot)];
      ST_RETURN_IF_ERROR(f.ReadF32(name, dst.data(), is_b ? Shape{out, c.r} : Shape{c.r, in}));
    }
  }
  return static_cast<int>(slots.size());
}

StatusOr<std::unique_ptr<VisionTower>> VisionTower::Load(const std::string& model_dir) {
  ST_ASSIGN_OR_RETURN(const VisionConfig c, ReadVisionConfig(model_dir));
  ST_ASSIGN_OR_RETURN(const Tensors t, Tensors::Open(model_dir));
  std::unique_ptr<VisionTower> tower(new VisionTower());
  tower->cfg_ = c;
  tower->w_.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  Status read;
  tower->w_.ForEach(
      c, [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& v) {
        if (read.ok()) read = t.Read(name, Shape(shape.begin(), shape.end()), &v);
      });
  ST_RETURN_IF_ERROR(read);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::string pre = "model.vision_tower.";
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = pre + "encoder.layers." + std::to_string(l) + ".";
    LayerClips C;
    for (const auto& [name, clip] :
         {std::pair{"self_attn.q_proj", &C.q}, std::pair{"self_attn.k_proj", &C.k},
          std::pair{"self_attn.v_proj", &C.v}, std::pair{"self_attn.o_proj", &C.o},
          std::pair{"mlp.gate_proj", &C.gate}, std::pair{"mlp.up_proj", &C.up},
          std::pair{"mlp.down_proj", &C.down}}) {
      *clip = Clip{-kInf, kInf, -kInf, kInf, c.use_clipped_linears};
      if (!c.use_clipped_linears) continue;
      const std::string n = p + name;
      ST_ASSIGN_OR_RETURN(clip->in_min, t.Scalar(n + ".input_min", -kInf));
      ST_ASSIGN_OR_RETURN(clip->in_max, t.Scalar(n + ".input_max", kInf));
      ST_ASSIGN_OR_RETURN(clip->out_min, t.Scalar(n + ".output_min", -kInf));
      ST_ASSIGN_OR_RETURN(clip->out_max, t.Scalar(n + ".output_max", kInf));
    }
    tower->clips_.push_back(C);
  }
  const int64_t H = c.hidden_size;
  if (c.standardize) {
    ST_RETURN_IF_ERROR(t.Read(pre + "std_bias", {H}, &tower->std_bias_));
    ST_RETURN_IF_ERROR(t.Read(pre + "std_scale", {H}, &tower->std_scale_));
  }
  // inv_freq = 1 / theta^(2i / (head_dim / 2)), i < head_dim / 4, computed as torch does (fp32
  // exponent, the power in fp32).
  const int spatial = c.head_dim / 2;
  for (int i = 0; i < spatial; i += 2)
    tower->inv_freq_.push_back(
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(i) / spatial));
  return tower;
}

// An image's axial RoPE: per patch head_dim / 2 angles, the column's (head_dim / 4) then the
// row's. Each half of a head (head_dim / 2 values, pairs (i, i + head_dim / 4)) rotates by its
// axis' angles.
struct VisionTower::Rope {
  int64_t half = 0, quarter = 0;
  std::vector<float> cos, sin;  // [patches, head_dim / 2]
  Rope(const std::vector<int32_t>& pos, int64_t n, int64_t head_dim,
       const std::vector<float>& inv_freq)
      : half(head_dim / 2), quarter(head_dim / 4) {
    cos.resize(size_t(n) * half);
    sin.resize(size_t(n) * half);
    for (int64_t p = 0; p < n; ++p)
      for (int axis = 0; axis < 2; ++axis)
        for (int64_t f = 0; f < quarter; ++f) {
          const float angle = static_cast<float>(pos[2 * p + axis]) * inv_freq[size_t(f)];
          cos[p * half + axis * quarter + f] = std::cos(angle);
          sin[p * half + axis * quarter + f] = std::sin(angle);
        }
  }
  // x [n, heads, head_dim] in place; inverse rotates back (the backward).
  void Apply(float* x, int64_t n, int64_t heads, bool inverse) const {
    const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (n > 64)
    for (int64_t p = 0; p < n; ++p)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int axis = 0; axis < 2; ++axis) {
          float* part = x + (p * heads + hd) * 2 * half + axis * half;
          const float* c = cos.data() + p * half + axis * quarter;
          const float* s = sin.data() + p * half + axis * quarter;
          for (int64_t i = 0; i < quarter; ++i) {
            const float a = part[i], b = part[i + quarter], si = sign * s[i];
            part[i] = a * c[i] - b * si;
            part[i + quarter] = b * c[i] + a * si;
          }
        }
  }
};

// One encoder layer's forward values. A projection's `*_pre` is its output before the output
// clip, kept only with clipped linears (otherwise empty: the clipped output is the same).
struct VisionTower::Acts {
  std::vector<float> x1, rstd1;                        // input norm
  std::vector<float> q_pre, k_pre, v_pre, qc, kc, vc;  // projections
  std::vector<float> rq, rk, rv, q, k, v;              // per-head norms; q and k roped
  std::vector<float> att;                              // [n, heads * head_dim]
  std::vector<float> o_pre, oc, rstd_pa;               // output projection, post-attention norm
  std::vector<float> h2;                               // the residual after attention
  std::vector<float> x2, rstd2;                        // pre-feedforward norm
  std::vector<float> g_pre, gc, u_pre, uc, m;          // gate, up, gelu(gate) * up
  std::vector<float> d_pre, dc, rstd_pff;              // down, post-feedforward norm
  std::vector<float> scores, tmp;                      // scratch
};

void VisionTower::Linear(int slot, const float* x, int64_t rows, int64_t n_in,
                         const std::vector<float>& w, int64_t n_out, const Clip& clip, float* pre,
                         float* out) const {
  const float* in = x;
  std::vector<float> clipped;
  if (clip.active) {
    clipped.assign(x, x + rows * n_in);
    for (float& v : clipped) v = std::clamp(v, clip.in_min, clip.in_max);
    in = clipped.data();
  }
  cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, rows, n_out, n_in, 1.0f, in, n_in,
            w.data(), n_in, 0.0f, pre, n_out);
  if (size_t(slot) < w_.lora_a.size() && !w_.lora_a[size_t(slot)].empty()) {
    const int64_t r = lora_rank_;
    std::vector<float> t(static_cast<size_t>(rows * r));
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, rows, r, n_in, 1.0f, in, n_in,
              w_.lora_a[size_t(slot)].data(), n_in, 0.0f, t.data(), r);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, rows, n_out, r, lora_scaling_,
              t.data(), r, w_.lora_b[size_t(slot)].data(), r, 1.0f, pre, n_out);
  }
  if (clip.active)
    for (int64_t i = 0; i < rows * n_out; ++i)
      out[i] = std::clamp(pre[i], clip.out_min, clip.out_max);
  else if (out != pre)
    std::copy(pre, pre + rows * n_out, out);
}

void VisionTower::LinearBackward(int slot, const float* x, const float* pre, float* dy,
                                 int64_t rows, int64_t n_in, const std::vector<float>& w,
                                 int64_t n_out, const Clip& clip, std::vector<float>& dw,
                                 VisionTensors& g, float* dx, bool accumulate_dx) const {
  const bool clipped = clip.active;
  const float* in = x;
  std::vector<float> in_c, d_in;
  if (clipped) {
    // torch.clamp passes the gradient where min <= value <= max.
    for (int64_t i = 0; i < rows * n_out; ++i)
      if (!(pre[i] >= clip.out_min && pre[i] <= clip.out_max)) dy[i] = 0.0f;
    in_c.assign(x, x + rows * n_in);
    for (float& v : in_c) v = std::clamp(v, clip.in_min, clip.in_max);
    in = in_c.data();
  }
  // d(clipped input): straight into dx without clipping, else masked into it below.
  float* d = nullptr;
  bool accumulate = false;
  if (dx != nullptr && !clipped) {
    d = dx;
    accumulate = accumulate_dx;
  } else if (dx != nullptr) {
    d_in.resize(static_cast<size_t>(rows * n_in));
    d = d_in.data();
  }
  if (d != nullptr || !dw.empty())
    cpu::LinearBackward(in, w.data(), dy, d, dw.empty() ? nullptr : dw.data(), rows, n_in, n_out,
                        1.0f, accumulate);
  if (size_t(slot) < w_.lora_a.size() && !w_.lora_a[size_t(slot)].empty()) {
    // t = c(x) A^T, u = dy B: dB += s dy^T t, dA += s u^T c(x), d(c(x)) += s u A.
    const int64_t r = lora_rank_;
    const std::vector<float>&a = w_.lora_a[size_t(slot)], &b = w_.lora_b[size_t(slot)];
    std::vector<float> t(static_cast<size_t>(rows * r)), u(static_cast<size_t>(rows * r));
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, rows, r, n_in, 1.0f, in, n_in,
              a.data(), n_in, 0.0f, t.data(), r);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, rows, r, n_out, 1.0f, dy, n_out,
              b.data(), r, 0.0f, u.data(), r);
    if (size_t(slot) < g.lora_b.size() && !g.lora_b[size_t(slot)].empty())
      cpu::Gemm(Precision::kFp32, cpu::Trans::kYes, cpu::Trans::kNo, n_out, r, rows, lora_scaling_,
                dy, n_out, t.data(), r, 1.0f, g.lora_b[size_t(slot)].data(), r);
    if (size_t(slot) < g.lora_a.size() && !g.lora_a[size_t(slot)].empty())
      cpu::Gemm(Precision::kFp32, cpu::Trans::kYes, cpu::Trans::kNo, r, n_in, rows, lora_scaling_,
                u.data(), r, in, n_in, 1.0f, g.lora_a[size_t(slot)].data(), n_in);
    if (d != nullptr)
      cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, rows, n_in, r, lora_scaling_,
                u.data(), r, a.data(), n_in, 1.0f, d, n_in);
  }
  if (dx != nullptr && clipped)
    for (int64_t i = 0; i < rows * n_in; ++i) {
      const float gi = (x[i] >= clip.in_min && x[i] <= clip.in_max) ? d_in[size_t(i)] : 0.0f;
      dx[i] = accumulate_dx ? dx[i] + gi : gi;
    }
}

void VisionTower::LayerForward(size_t l, const Rope& rope, int64_t n, std::vector<float>& h,
                               Acts& a) const {
  const VisionLayerTensors& L = w_.layers[l];
  const LayerClips& C = clips_[l];
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t heads = cfg_.num_attention_heads, kv = cfg_.num_key_value_heads;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bool clipped = cfg_.use_clipped_linears;
  const auto sized = [](std::vector<float>& v, int64_t count) {
    v.resize(static_cast<size_t>(count));
    return v.data();
  };
  const int base = 1 + 7 * static_cast<int>(l);  // the layer's first linear slot
  const auto linear = [&](int j, const float* x, int64_t n_in, const std::vector<float>& w,
                          int64_t n_out, const Clip& clip, std::vector<float>& pre,
                          std::vector<float>& out) {
    float* o = sized(out, n * n_out);
    if (clipped)
      Linear(base + j, x, n, n_in, w, n_out, clip, sized(pre, n * n_out), o);
    else
      Linear(base + j, x, n, n_in, w, n_out, clip, o, o);
  };
  cpu::RmsNormForward(h.data(), L.input_norm.data(), sized(a.x1, n * H), sized(a.rstd1, n), n, H,
                      eps);
  linear(0, a.x1.data(), H, L.q, heads * D, C.q, a.q_pre, a.qc);
  linear(1, a.x1.data(), H, L.k, kv * D, C.k, a.k_pre, a.kc);
  linear(2, a.x1.data(), H, L.v, kv * D, C.v, a.v_pre, a.vc);
  cpu::RmsNormForward(a.qc.data(), L.q_norm.data(), sized(a.q, n * heads * D),
                      sized(a.rq, n * heads), n * heads, D, eps);
  cpu::RmsNormForward(a.kc.data(), L.k_norm.data(), sized(a.k, n * kv * D), sized(a.rk, n * kv),
                      n * kv, D, eps);
  cpu::RmsNormForward(a.vc.data(), nullptr, sized(a.v, n * kv * D), sized(a.rv, n * kv), n * kv, D,
                      eps);
  rope.Apply(a.q.data(), n, heads, false);
  rope.Apply(a.k.data(), n, kv, false);
  // Bidirectional attention over the image's real patches, scale 1: per head S = Q K^T,
  // row softmax, O = P V, as matrix products (a budget of 280 soft tokens is 2520 patches).
  float* scores = sized(a.scores, n * n);
  sized(a.att, n * heads * D);
  const int64_t group = heads / kv;
  for (int64_t hd = 0; hd < heads; ++hd) {
    const int64_t g = hd / group;
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, n, n, D, 1.0f,
              a.q.data() + hd * D, heads * D, a.k.data() + g * D, kv * D, 0.0f, scores, n);
#pragma omp parallel for schedule(static) if (n * n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) SoftmaxRow(scores + i * n, n);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, n, D, n, 1.0f, scores, n,
              a.v.data() + g * D, kv * D, 0.0f, a.att.data() + hd * D, heads * D);
  }
  linear(3, a.att.data(), heads * D, L.o, H, C.o, a.o_pre, a.oc);
  float* out = sized(a.tmp, n * H);
  cpu::RmsNormForward(a.oc.data(), L.post_attn_norm.data(), out, sized(a.rstd_pa, n), n, H, eps);
  for (int64_t i = 0; i < n * H; ++i) h[size_t(i)] += out[i];
  a.h2 = h;
  cpu::RmsNormForward(h.data(), L.pre_ff_norm.data(), sized(a.x2, n * H), sized(a.rstd2, n), n, H,
                      eps);
  linear(4, a.x2.data(), H, L.gate, I, C.gate, a.g_pre, a.gc);
  linear(5, a.x2.data(), H, L.up, I, C.up, a.u_pre, a.uc);
  cpu::GeluMulForward(a.gc.data(), a.uc.data(), sized(a.m, n * I), n * I);
  linear(6, a.m.data(), I, L.down, H, C.down, a.d_pre, a.dc);
  cpu::RmsNormForward(a.dc.data(), L.post_ff_norm.data(), out, sized(a.rstd_pff, n), n, H, eps);
  for (int64_t i = 0; i < n * H; ++i) h[size_t(i)] += out[i];
}

void VisionTower::LayerBackward(size_t l, const Rope& rope, int64_t n,
                                const std::vector<float>& h_in, const Acts& a,
                                std::vector<float>& dh, VisionTensors& grads) const {
  const VisionLayerTensors& L = w_.layers[l];
  VisionLayerTensors& g = grads.layers[l];
  const LayerClips& C = clips_[l];
  const int base = 1 + 7 * static_cast<int>(l);  // the layer's first linear slot
  // A norm's weight gradient, or null when the base is frozen.
  const auto gw = [](std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t heads = cfg_.num_attention_heads, kv = cfg_.num_key_value_heads;
  const auto pre = [](const std::vector<float>& p, const std::vector<float>& out) {
    return p.empty() ? out.data() : p.data();
  };
  // Feed-forward branch: h3 = h2 + norm(down(gelu(gate(x2)) * up(x2))), x2 = norm(h2).
  std::vector<float> d_out(static_cast<size_t>(n * H)), dm(static_cast<size_t>(n * I)),
      dg(static_cast<size_t>(n * I)), du(static_cast<size_t>(n * I)),
      dx(static_cast<size_t>(n * H));
  cpu::RmsNormBackward(a.dc.data(), L.post_ff_norm.data(), a.rstd_pff.data(), dh.data(),
                       d_out.data(), gw(g.post_ff_norm), n, H, false);
  LinearBackward(base + 6, a.m.data(), pre(a.d_pre, a.dc), d_out.data(), n, I, L.down, H, C.down,
                 g.down, grads, dm.data(), false);
  cpu::GeluMulBackward(a.gc.data(), a.uc.data(), dm.data(), dg.data(), du.data(), n * I);
  LinearBackward(base + 4, a.x2.data(), pre(a.g_pre, a.gc), dg.data(), n, H, L.gate, I, C.gate,
                 g.gate, grads, dx.data(), false);
  LinearBackward(base + 5, a.x2.data(), pre(a.u_pre, a.uc), du.data(), n, H, L.up, I, C.up, g.up,
                 grads, dx.data(), true);
  cpu::RmsNormBackward(a.h2.data(), L.pre_ff_norm.data(), a.rstd2.data(), dx.data(), dh.data(),
                       gw(g.pre_ff_norm), n, H, true);
  // Attention branch: h2 = h_in + norm(o(attention(q, k, v))).
  std::vector<float> d_att(static_cast<size_t>(n * heads * D));
  cpu::RmsNormBackward(a.oc.data(), L.post_attn_norm.data(), a.rstd_pa.data(), dh.data(),
                       d_out.data(), gw(g.post_attn_norm), n, H, false);
  LinearBackward(base + 3, a.att.data(), pre(a.o_pre, a.oc), d_out.data(), n, heads * D, L.o, H,
                 C.o, g.o, grads, d_att.data(), false);
  // Per head, recomputing P: dV += P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K,
  // dK += dS^T Q.
  std::vector<float> dq(static_cast<size_t>(n * heads * D)), dk(size_t(n * kv * D), 0.0f),
      dv(size_t(n * kv * D), 0.0f), p(static_cast<size_t>(n * n)), dp(static_cast<size_t>(n * n));
  const int64_t group = heads / kv;
  for (int64_t hd = 0; hd < heads; ++hd) {
    const int64_t gi = hd / group;
    const float* qh = a.q.data() + hd * D;
    const float* kh = a.k.data() + gi * D;
    const float* vh = a.v.data() + gi * D;
    const float* oh = a.att.data() + hd * D;
    const float* doh = d_att.data() + hd * D;
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, n, n, D, 1.0f, qh, heads * D, kh,
              kv * D, 0.0f, p.data(), n);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, n, n, D, 1.0f, doh, heads * D,
              vh, kv * D, 0.0f, dp.data(), n);
#pragma omp parallel for schedule(static) if (n * n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      float* row = p.data() + i * n;
      SoftmaxRow(row, n);
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += doh[i * heads * D + d] * oh[i * heads * D + d];
      float* drow = dp.data() + i * n;
      for (int64_t j = 0; j < n; ++j) drow[j] = row[j] * (drow[j] - dot);
    }
    cpu::Gemm(Precision::kFp32, cpu::Trans::kYes, cpu::Trans::kNo, n, D, n, 1.0f, p.data(), n, doh,
              heads * D, 1.0f, dv.data() + gi * D, kv * D);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, n, D, n, 1.0f, dp.data(), n, kh,
              kv * D, 0.0f, dq.data() + hd * D, heads * D);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kYes, cpu::Trans::kNo, n, D, n, 1.0f, dp.data(), n, qh,
              heads * D, 1.0f, dk.data() + gi * D, kv * D);
  }
  rope.Apply(dq.data(), n, heads, true);
  rope.Apply(dk.data(), n, kv, true);
  std::vector<float> dqc(dq.size()), dkc(dk.size()), dvc(dv.size());
  cpu::RmsNormBackward(a.qc.data(), L.q_norm.data(), a.rq.data(), dq.data(), dqc.data(),
                       gw(g.q_norm), n * heads, D, false);
  cpu::RmsNormBackward(a.kc.data(), L.k_norm.data(), a.rk.data(), dk.data(), dkc.data(),
                       gw(g.k_norm), n * kv, D, false);
  cpu::RmsNormBackward(a.vc.data(), nullptr, a.rv.data(), dv.data(), dvc.data(), nullptr, n * kv, D,
                       false);
  LinearBackward(base + 0, a.x1.data(), pre(a.q_pre, a.qc), dqc.data(), n, H, L.q, heads * D, C.q,
                 g.q, grads, dx.data(), false);
  LinearBackward(base + 1, a.x1.data(), pre(a.k_pre, a.kc), dkc.data(), n, H, L.k, kv * D, C.k, g.k,
                 grads, dx.data(), true);
  LinearBackward(base + 2, a.x1.data(), pre(a.v_pre, a.vc), dvc.data(), n, H, L.v, kv * D, C.v, g.v,
                 grads, dx.data(), true);
  cpu::RmsNormBackward(h_in.data(), L.input_norm.data(), a.rstd1.data(), dx.data(), dh.data(),
                       gw(g.input_norm), n, H, true);
}

StatusOr<std::vector<float>> VisionTower::Forward(const float* pixel_values,
                                                  const int32_t* positions, int images,
                                                  int max_patches, VisionTrace* trace,
                                                  VisionSaved* saved) const {
  const int64_t H = cfg_.hidden_size, P = 3 * int64_t(cfg_.patch_size) * cfg_.patch_size;
  const int k = cfg_.pooling_kernel_size;
  const Clip kNoClip{-kInfinity, kInfinity, -kInfinity, kInfinity, false};
  if (max_patches % (k * k) != 0)
    return InvalidArgument(StrCat(max_patches, " patches per image do not pool by ", k, "x", k));
  if (trace) {
    trace->patch_embeddings.assign(images, {});
    trace->layers.assign(w_.layers.size(), std::vector<std::vector<float>>(images));
    trace->tower.clear();
  }
  if (saved) saved->images.assign(static_cast<size_t>(images), {});
  std::vector<float> soft;  // [tokens, text width]
  Acts acts;
  for (int img = 0; img < images; ++img) {
    const float* px = pixel_values + int64_t(img) * max_patches * P;
    const int32_t* pos = positions + int64_t(img) * max_patches * 2;
    // The real patches: the processor puts them first, padding after.
    int64_t n = 0;
    int32_t cols = 0;
    while (n < max_patches && !(pos[2 * n] == -1 && pos[2 * n + 1] == -1)) {
      for (int a = 0; a < 2; ++a)
        if (pos[2 * n + a] < 0 || pos[2 * n + a] >= cfg_.position_embedding_size)
          return InvalidArgument(StrCat("image ", img, ": patch position ", pos[2 * n + a],
                                        " is outside the tower's ", cfg_.position_embedding_size,
                                        " positions (a smaller --max-soft-tokens or a less "
                                        "elongated image fits)"));
      cols = std::max(cols, pos[2 * n] + 1);
      ++n;
    }
    for (int64_t i = n; i < max_patches; ++i)
      if (pos[2 * i] != -1 || pos[2 * i + 1] != -1)
        return InvalidArgument(StrCat("image ", img, ": a real patch after padding"));
    if (n == 0 || n % (int64_t(k) * k) != 0 || cols % k != 0)
      return InvalidArgument(StrCat("image ", img, ": ", n, " patches in ", cols,
                                    " columns do not pool by ", k, "x", k));
    const std::vector<int32_t> p(pos, pos + 2 * n);
    std::vector<float> x(size_t(n) * P), h(size_t(n) * H);
    for (int64_t i = 0; i < n * P; ++i) x[i] = 2.0f * (px[i] - 0.5f);
    Linear(0, x.data(), n, P, w_.input_proj, H, kNoClip, h.data(), h.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* ex = w_.position_table.data() + int64_t(p[2 * i]) * H;
      const float* ey =
          w_.position_table.data() + (int64_t(cfg_.position_embedding_size) + p[2 * i + 1]) * H;
      for (int64_t c = 0; c < H; ++c) h[i * H + c] += ex[c] + ey[c];
    }
    if (trace) trace->patch_embeddings[img] = h;
    VisionSaved::Image* keep = saved ? &saved->images[size_t(img)] : nullptr;
    const Rope rope(p, n, cfg_.head_dim, inv_freq_);
    for (size_t l = 0; l < w_.layers.size(); ++l) {
      if (keep) keep->layer_in.push_back(h);
      LayerForward(l, rope, n, h, acts);
      if (trace) trace->layers[l][img] = h;
    }
    // Pool k x k blocks (row-major over the pooled grid), scale by sqrt(hidden), standardize.
    const int64_t tokens = n / (int64_t(k) * k), pooled_cols = cols / k;
    std::vector<float> pooled(size_t(tokens) * H, 0.0f);
    const float w = 1.0f / static_cast<float>(k * k);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = p[2 * i] / k + pooled_cols * (p[2 * i + 1] / k);
      for (int64_t c = 0; c < H; ++c) pooled[t * H + c] += w * h[i * H + c];
    }
    const float root = static_cast<float>(std::sqrt(double(H)));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < H; ++c) {
        float& v = pooled[t * H + c];
        v *= root;
        if (cfg_.standardize) v = (v - std_bias_[c]) * std_scale_[c];
      }
    if (trace) trace->tower.insert(trace->tower.end(), pooled.begin(), pooled.end());
    if (keep) {
      keep->patches = n;
      keep->columns = cols;
      keep->positions = p;
      keep->input = std::move(x);
      keep->layer_in.push_back(h);
      keep->pooled = pooled;
    }
    // Into the text width: RMSNorm without weights, then the projection.
    std::vector<float> rstd;
    RmsNormRows(pooled.data(), tokens, H, nullptr, cfg_.rms_norm_eps, rstd);
    const size_t at = soft.size();
    soft.resize(at + size_t(tokens) * cfg_.text_hidden_size);
    Linear(ProjectionSlot(), pooled.data(), tokens, H, w_.projection, cfg_.text_hidden_size,
           kNoClip, soft.data() + at, soft.data() + at);
  }
  return soft;
}

Status VisionTower::Backward(const VisionSaved& saved, const float* d_soft,
                             VisionTensors* grads) const {
  const int64_t H = cfg_.hidden_size, P = 3 * int64_t(cfg_.patch_size) * cfg_.patch_size;
  const int64_t W = cfg_.text_hidden_size, k = cfg_.pooling_kernel_size;
  const Clip kNoClip{-kInfinity, kInfinity, -kInfinity, kInfinity, false};
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (grads->layers.size() != w_.layers.size() || grads->lora_a.size() != w_.lora_a.size())
    return InvalidArgument("the tower's gradients are not shaped as its weights (ZerosLike)");
  // Whether anything below the projection has a gradient to compute.
  bool below = !grads->input_proj.empty() || !grads->position_table.empty();
  for (size_t slot = 0; slot + 1 < grads->lora_a.size(); ++slot)
    below = below || !grads->lora_a[slot].empty();
  for (const VisionLayerTensors& L : grads->layers) below = below || !L.q.empty();
  Acts acts;
  int64_t at = 0;  // the image's first soft token
  for (const VisionSaved::Image& im : saved.images) {
    const int64_t n = im.patches, tokens = n / (k * k), pooled_cols = im.columns / k;
    if (im.layer_in.size() != w_.layers.size() + 1)
      return InvalidArgument("the saved forward does not match the tower");
    const float* ds = d_soft + at * W;
    at += tokens;
    // Projection: soft = norm(pooled) Wp^T.
    std::vector<float> normed(static_cast<size_t>(tokens * H)), rstd(static_cast<size_t>(tokens)),
        dnormed(static_cast<size_t>(tokens * H)), dpooled(static_cast<size_t>(tokens * H));
    cpu::RmsNormForward(im.pooled.data(), nullptr, normed.data(), rstd.data(), tokens, H, eps);
    std::vector<float> dy(ds, ds + tokens * W);
    LinearBackward(ProjectionSlot(), normed.data(), nullptr, dy.data(), tokens, H, w_.projection, W,
                   kNoClip, grads->projection, *grads, dnormed.data(), false);
    if (!below) continue;  // only the projection trains
    cpu::RmsNormBackward(im.pooled.data(), nullptr, rstd.data(), dnormed.data(), dpooled.data(),
                         nullptr, tokens, H, false);
    // Standardization and the sqrt(hidden) scale, then the mean over each block.
    const float root = static_cast<float>(std::sqrt(double(H)));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < H; ++c)
        dpooled[size_t(t * H + c)] *= root * (cfg_.standardize ? std_scale_[size_t(c)] : 1.0f);
    std::vector<float> dh(static_cast<size_t>(n * H));
    const float w = 1.0f / static_cast<float>(k * k);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t =
          im.positions[size_t(2 * i)] / k + pooled_cols * (im.positions[size_t(2 * i + 1)] / k);
      for (int64_t c = 0; c < H; ++c) dh[size_t(i * H + c)] = w * dpooled[size_t(t * H + c)];
    }
    // The encoder layers in reverse, each recomputed from its saved input.
    const Rope rope(im.positions, n, cfg_.head_dim, inv_freq_);
    std::vector<float> h;
    for (size_t l = w_.layers.size(); l-- > 0;) {
      h = im.layer_in[l];
      LayerForward(l, rope, n, h, acts);
      LayerBackward(l, rope, n, im.layer_in[l], acts, dh, *grads);
    }
    // Patch embedding: h = x Wi^T + table[x position] + table[size + y position].
    LinearBackward(0, im.input.data(), nullptr, dh.data(), n, P, w_.input_proj, H, kNoClip,
                   grads->input_proj, *grads, nullptr, false);
    for (int64_t i = 0; i < n && !grads->position_table.empty(); ++i) {
      float* gx = grads->position_table.data() + int64_t(im.positions[size_t(2 * i)]) * H;
      float* gy = grads->position_table.data() +
                  (int64_t(cfg_.position_embedding_size) + im.positions[size_t(2 * i + 1)]) * H;
      for (int64_t c = 0; c < H; ++c) {
        gx[c] += dh[size_t(i * H + c)];
        gy[c] += dh[size_t(i * H + c)];
      }
    }
  }
  return Status::Ok();
}

}  // namespace st::vision
