// Gemma 4's vision tower, forward (vision_tower.h). Reference-style fp32 code on the CPU backend's
// matrix product: correct first; its speed is not yet tuned (docs/vision.md).
#include "model/vision/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/hf_model.h"
#include "io/safetensors.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/gelu.h"

namespace st::vision {
namespace {

// rows [n, c] in place: x * (mean(x^2) + eps)^-0.5 [* w] (Gemma4RMSNorm), with the backend's
// kernel; `rstd` receives the n scales.
void RmsNormRows(float* x, int64_t n, int64_t c, const float* w, double eps,
                 std::vector<float>& rstd) {
  if (rstd.size() < size_t(n)) rstd.resize(size_t(n));
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
  return c;
}

StatusOr<std::unique_ptr<VisionTower>> VisionTower::Load(const std::string& model_dir) {
  ST_ASSIGN_OR_RETURN(const VisionConfig c, ReadVisionConfig(model_dir));
  ST_ASSIGN_OR_RETURN(const Tensors t, Tensors::Open(model_dir));
  std::unique_ptr<VisionTower> tower(new VisionTower());
  tower->cfg_ = c;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_out = int64_t(c.num_attention_heads) * D,
                kv_out = int64_t(c.num_key_value_heads) * D;
  const std::string pre = "model.vision_tower.";
  ST_RETURN_IF_ERROR(t.Read(pre + "patch_embedder.input_proj.weight",
                            {H, 3 * int64_t(c.patch_size) * c.patch_size}, &tower->input_proj_));
  ST_RETURN_IF_ERROR(t.Read(pre + "patch_embedder.position_embedding_table",
                            {2, c.position_embedding_size, H}, &tower->position_table_));
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = pre + "encoder.layers." + std::to_string(l) + ".";
    Layer L;
    ST_RETURN_IF_ERROR(t.Read(p + "input_layernorm.weight", {H}, &L.input_norm));
    ST_RETURN_IF_ERROR(t.Read(p + "post_attention_layernorm.weight", {H}, &L.post_attn_norm));
    ST_RETURN_IF_ERROR(t.Read(p + "pre_feedforward_layernorm.weight", {H}, &L.pre_ff_norm));
    ST_RETURN_IF_ERROR(t.Read(p + "post_feedforward_layernorm.weight", {H}, &L.post_ff_norm));
    ST_RETURN_IF_ERROR(t.Read(p + "self_attn.q_norm.weight", {D}, &L.q_norm));
    ST_RETURN_IF_ERROR(t.Read(p + "self_attn.k_norm.weight", {D}, &L.k_norm));
    struct Lin {
      const char* name;
      std::vector<float>* w;
      Clip* clip;
      Shape shape;
    };
    for (const Lin& lin : {Lin{"self_attn.q_proj", &L.q, &L.clip_q, {q_out, H}},
                           Lin{"self_attn.k_proj", &L.k, &L.clip_k, {kv_out, H}},
                           Lin{"self_attn.v_proj", &L.v, &L.clip_v, {kv_out, H}},
                           Lin{"self_attn.o_proj", &L.o, &L.clip_o, {H, q_out}},
                           Lin{"mlp.gate_proj", &L.gate, &L.clip_gate, {I, H}},
                           Lin{"mlp.up_proj", &L.up, &L.clip_up, {I, H}},
                           Lin{"mlp.down_proj", &L.down, &L.clip_down, {H, I}}}) {
      const std::string n = p + lin.name;
      ST_RETURN_IF_ERROR(t.Read(n + ".linear.weight", lin.shape, lin.w));
      *lin.clip = Clip{-kInf, kInf, -kInf, kInf};
      if (!c.use_clipped_linears) continue;
      ST_ASSIGN_OR_RETURN(lin.clip->in_min, t.Scalar(n + ".input_min", -kInf));
      ST_ASSIGN_OR_RETURN(lin.clip->in_max, t.Scalar(n + ".input_max", kInf));
      ST_ASSIGN_OR_RETURN(lin.clip->out_min, t.Scalar(n + ".output_min", -kInf));
      ST_ASSIGN_OR_RETURN(lin.clip->out_max, t.Scalar(n + ".output_max", kInf));
    }
    tower->layers_.push_back(std::move(L));
  }
  if (c.standardize) {
    ST_RETURN_IF_ERROR(t.Read(pre + "std_bias", {H}, &tower->std_bias_));
    ST_RETURN_IF_ERROR(t.Read(pre + "std_scale", {H}, &tower->std_scale_));
  }
  ST_RETURN_IF_ERROR(t.Read("model.embed_vision.embedding_projection.weight",
                            {c.text_hidden_size, H}, &tower->projection_));
  // inv_freq = 1 / theta^(2i / (head_dim / 2)), i < head_dim / 4, computed as torch does (fp32
  // exponent, the power in fp32).
  const int spatial = c.head_dim / 2;
  for (int i = 0; i < spatial; i += 2)
    tower->inv_freq_.push_back(
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(i) / spatial));
  return tower;
}

void VisionTower::Linear(const float* x, int64_t rows, int64_t n_in, const std::vector<float>& w,
                         int64_t n_out, const Clip& clip, float* out) const {
  const float* in = x;
  std::vector<float> clipped;
  if (cfg_.use_clipped_linears) {
    clipped.assign(x, x + rows * n_in);
    for (float& v : clipped) v = std::clamp(v, clip.in_min, clip.in_max);
    in = clipped.data();
  }
  cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, rows, n_out, n_in, 1.0f, in, n_in,
            w.data(), n_in, 0.0f, out, n_out);
  if (cfg_.use_clipped_linears)
    for (int64_t i = 0; i < rows * n_out; ++i)
      out[i] = std::clamp(out[i], clip.out_min, clip.out_max);
}

void VisionTower::Encode(std::vector<float>& h, const std::vector<int32_t>& pos, int64_t n,
                         VisionTrace* trace, int image) const {
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int heads = cfg_.num_attention_heads, kv = cfg_.num_key_value_heads;
  const int64_t half = D / 2, quarter = D / 4;
  // cos/sin per patch: [n, D/2] for the column angles then the row angles, each of D/4.
  std::vector<float> cosv(size_t(n) * half), sinv(size_t(n) * half);
  for (int64_t p = 0; p < n; ++p)
    for (int axis = 0; axis < 2; ++axis)
      for (int64_t f = 0; f < quarter; ++f) {
        const float angle = static_cast<float>(pos[2 * p + axis]) * inv_freq_[f];
        cosv[p * half + axis * quarter + f] = std::cos(angle);
        sinv[p * half + axis * quarter + f] = std::sin(angle);
      }
  // Rotates each half of a head (D/2 values: pairs (i, i + D/4)) by that half's axis angles.
  const auto rope = [&](float* x, int64_t p) {
    for (int axis = 0; axis < 2; ++axis) {
      float* part = x + axis * half;
      const float* c = cosv.data() + p * half + axis * quarter;
      const float* s = sinv.data() + p * half + axis * quarter;
      for (int64_t i = 0; i < quarter; ++i) {
        const float a = part[i], b = part[i + quarter];
        part[i] = a * c[i] - b * s[i];
        part[i + quarter] = b * c[i] + a * s[i];
      }
    }
  };
  std::vector<float> x(size_t(n) * H), q(size_t(n) * heads * D), k(size_t(n) * kv * D),
      v(size_t(n) * kv * D), att(size_t(n) * heads * D), out(size_t(n) * H), gate(size_t(n) * I),
      up(size_t(n) * I), scores(static_cast<size_t>(n) * n), rstd;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    x = h;
    RmsNormRows(x.data(), n, H, L.input_norm.data(), cfg_.rms_norm_eps, rstd);
    Linear(x.data(), n, H, L.q, heads * D, L.clip_q, q.data());
    Linear(x.data(), n, H, L.k, kv * D, L.clip_k, k.data());
    Linear(x.data(), n, H, L.v, kv * D, L.clip_v, v.data());
    RmsNormRows(q.data(), n * heads, D, L.q_norm.data(), cfg_.rms_norm_eps, rstd);
    RmsNormRows(k.data(), n * kv, D, L.k_norm.data(), cfg_.rms_norm_eps, rstd);
    RmsNormRows(v.data(), n * kv, D, nullptr, cfg_.rms_norm_eps, rstd);
#pragma omp parallel for schedule(static) if (n > 64)
    for (int64_t p = 0; p < n; ++p) {
      for (int hd = 0; hd < heads; ++hd) rope(q.data() + (p * heads + hd) * D, p);
      for (int hd = 0; hd < kv; ++hd) rope(k.data() + (p * kv + hd) * D, p);
    }
    // Bidirectional attention over the image's real patches, scale 1: per head S = Q K^T,
    // row softmax, O = P V, as matrix products (a budget of 280 soft tokens is 2520 patches).
    const int group = heads / kv;
    for (int hd = 0; hd < heads; ++hd) {
      const int g = hd / group;
      cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, n, n, D, 1.0f,
                q.data() + hd * D, heads * D, k.data() + g * D, kv * D, 0.0f, scores.data(), n);
#pragma omp parallel for schedule(static) if (n * n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        float* row = scores.data() + i * n;
        const float m = *std::max_element(row, row + n);
        float total = 0;
        for (int64_t j = 0; j < n; ++j) {
          row[j] = std::exp(row[j] - m);
          total += row[j];
        }
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      }
      cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kNo, n, D, n, 1.0f, scores.data(), n,
                v.data() + g * D, kv * D, 0.0f, att.data() + hd * D, heads * D);
    }
    Linear(att.data(), n, heads * D, L.o, H, L.clip_o, out.data());
    RmsNormRows(out.data(), n, H, L.post_attn_norm.data(), cfg_.rms_norm_eps, rstd);
    for (size_t i = 0; i < h.size(); ++i) h[i] += out[i];
    x = h;
    RmsNormRows(x.data(), n, H, L.pre_ff_norm.data(), cfg_.rms_norm_eps, rstd);
    Linear(x.data(), n, H, L.gate, I, L.clip_gate, gate.data());
    Linear(x.data(), n, H, L.up, I, L.clip_up, up.data());
#pragma omp parallel for schedule(static) if (gate.size() > (1 << 16))
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = GeluTanh(gate[i]) * up[i];
    Linear(gate.data(), n, I, L.down, H, L.clip_down, out.data());
    RmsNormRows(out.data(), n, H, L.post_ff_norm.data(), cfg_.rms_norm_eps, rstd);
    for (size_t i = 0; i < h.size(); ++i) h[i] += out[i];
    if (trace) trace->layers[l][image] = h;
  }
}

StatusOr<std::vector<float>> VisionTower::Forward(const float* pixel_values,
                                                  const int32_t* positions, int images,
                                                  int max_patches, VisionTrace* trace) const {
  const int64_t H = cfg_.hidden_size, P = 3 * int64_t(cfg_.patch_size) * cfg_.patch_size;
  const int k = cfg_.pooling_kernel_size;
  if (max_patches % (k * k) != 0)
    return InvalidArgument(StrCat(max_patches, " patches per image do not pool by ", k, "x", k));
  if (trace) {
    trace->patch_embeddings.assign(images, {});
    trace->layers.assign(layers_.size(), std::vector<std::vector<float>>(images));
    trace->tower.clear();
  }
  std::vector<float> soft;  // [tokens, text width]
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
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, n, H, P, 1.0f, x.data(), P,
              input_proj_.data(), P, 0.0f, h.data(), H);
    for (int64_t i = 0; i < n; ++i) {
      const float* ex = position_table_.data() + int64_t(p[2 * i]) * H;
      const float* ey =
          position_table_.data() + (int64_t(cfg_.position_embedding_size) + p[2 * i + 1]) * H;
      for (int64_t c = 0; c < H; ++c) h[i * H + c] += ex[c] + ey[c];
    }
    if (trace) trace->patch_embeddings[img] = h;
    Encode(h, p, n, trace, img);
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
    // Into the text width: RMSNorm without weights, then the projection.
    std::vector<float> rstd;
    RmsNormRows(pooled.data(), tokens, H, nullptr, cfg_.rms_norm_eps, rstd);
    const size_t at = soft.size();
    soft.resize(at + size_t(tokens) * cfg_.text_hidden_size);
    cpu::Gemm(Precision::kFp32, cpu::Trans::kNo, cpu::Trans::kYes, tokens, cfg_.text_hidden_size, H,
              1.0f, pooled.data(), H, projection_.data(), H, 0.0f, soft.data() + at,
              cfg_.text_hidden_size);
  }
  return soft;
}

}  // namespace st::vision
