#include "io/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "io/gguf_export.h"
#include "model/params.h"

namespace st {
namespace {

const std::string kArch = "gemma4";

// A key's value: one number, or one per layer (`feed_forward_length`, `attention.head_count_kv`).
StatusOr<std::vector<int64_t>> PerLayer(const GgufFile& f, const std::string& key, int64_t L) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return InvalidArgument(StrCat(f.path(), ": no ", key, " in its metadata"));
  if (v->type == GgufValueType::kArray) {
    if (static_cast<int64_t>(v->ints.size()) != L)
      return InvalidArgument(
          StrCat(f.path(), ": ", key, " has ", v->ints.size(), " values for ", L, " layers"));
    return v->ints;
  }
  if (v->type == GgufValueType::kString || v->type == GgufValueType::kF32 ||
      v->type == GgufValueType::kF64)
    return InvalidArgument(StrCat(f.path(), ": ", key, " is not an integer"));
  return std::vector<int64_t>(static_cast<size_t>(L), v->i);
}

StatusOr<int64_t> Int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return InvalidArgument(StrCat(f.path(), ": no ", key, " in its metadata"));
  if (v->type == GgufValueType::kArray || v->type == GgufValueType::kString ||
      v->type == GgufValueType::kF32 || v->type == GgufValueType::kF64)
    return InvalidArgument(StrCat(f.path(), ": ", key, " is not an integer"));
  return v->i;
}

StatusOr<double> Float(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return InvalidArgument(StrCat(f.path(), ": no ", key, " in its metadata"));
  if (v->type != GgufValueType::kF32 && v->type != GgufValueType::kF64)
    return InvalidArgument(StrCat(f.path(), ": ", key, " is not a float"));
  return v->f;
}

}  // namespace

StatusOr<Gemma4Config> Gemma4ConfigFromGguf(const GgufFile& f) {
  const GgufValue* arch = f.Find("general.architecture");
  if (arch == nullptr || arch->type != GgufValueType::kString)
    return InvalidArgument(StrCat(f.path(), ": no general.architecture; not a model file"));
  if (arch->s != kArch)
    return InvalidArgument(StrCat(f.path(), ": a '", arch->s,
                                  "' model; slicetrain runs Gemma 4 ('gemma4') files only"));
  if (const GgufValue* type = f.Find("general.type");
      type != nullptr && type->type == GgufValueType::kString && type->s == "adapter")
    return InvalidArgument(StrCat(f.path(),
                                  " is a LoRA adapter, not a model: pass its base model, or the "
                                  "PEFT adapter directory as --adapter"));
  auto key = [](const char* k) { return StrCat(kArch, ".", k); };
  Gemma4Config c;
  c.model_type = "gemma4_text";
  ST_ASSIGN_OR_RETURN(c.num_hidden_layers, Int(f, key("block_count")));
  const int64_t L = c.num_hidden_layers;
  if (L <= 0 || L > 4096)
    return InvalidArgument(StrCat(f.path(), ": ", key("block_count"), " is ", L));
  ST_ASSIGN_OR_RETURN(c.max_position_embeddings, Int(f, key("context_length")));
  ST_ASSIGN_OR_RETURN(c.hidden_size, Int(f, key("embedding_length")));
  ST_ASSIGN_OR_RETURN(c.num_attention_heads, Int(f, key("attention.head_count")));
  ST_ASSIGN_OR_RETURN(c.num_kv_shared_layers, Int(f, key("attention.shared_kv_layers")));
  ST_ASSIGN_OR_RETURN(c.sliding_window, Int(f, key("attention.sliding_window")));
  ST_ASSIGN_OR_RETURN(c.hidden_size_per_layer_input,
                      Int(f, key("embedding_length_per_layer_input")));
  ST_ASSIGN_OR_RETURN(c.head_dim, Int(f, key("attention.key_length_swa")));
  ST_ASSIGN_OR_RETURN(c.global_head_dim, Int(f, key("attention.key_length")));
  ST_ASSIGN_OR_RETURN(const int64_t value_swa, Int(f, key("attention.value_length_swa")));
  ST_ASSIGN_OR_RETURN(const int64_t value_full, Int(f, key("attention.value_length")));
  if (value_swa != c.head_dim || value_full != c.global_head_dim)
    return InvalidArgument(StrCat(f.path(), ": value heads differ from key heads (",
                                  key("attention.value_length"), "); Gemma 4 has equal ones"));
  ST_ASSIGN_OR_RETURN(c.rms_norm_eps, Float(f, key("attention.layer_norm_rms_epsilon")));
  ST_ASSIGN_OR_RETURN(c.rope_full.theta, Float(f, key("rope.freq_base")));
  ST_ASSIGN_OR_RETURN(c.rope_sliding.theta, Float(f, key("rope.freq_base_swa")));
  c.final_logit_softcapping = 0;
  if (f.Find(key("final_logit_softcapping")) != nullptr) {
    ST_ASSIGN_OR_RETURN(c.final_logit_softcapping, Float(f, key("final_logit_softcapping")));
  }

  const GgufValue* pattern = f.Find(key("attention.sliding_window_pattern"));
  if (pattern == nullptr || pattern->type != GgufValueType::kArray ||
      static_cast<int64_t>(pattern->ints.size()) != L)
    return InvalidArgument(StrCat(f.path(), ": ", key("attention.sliding_window_pattern"),
                                  " is missing or not one value per layer"));
  c.layer_types.clear();
  for (int64_t s : pattern->ints)
    c.layer_types.push_back(s ? LayerType::kSliding : LayerType::kFull);

  // The MLP widths: one, or per layer with the KV-shared layers' double (use_double_wide_mlp).
  ST_ASSIGN_OR_RETURN(const std::vector<int64_t> ff, PerLayer(f, key("feed_forward_length"), L));
  c.intermediate_size = ff[0];
  c.use_double_wide_mlp = false;
  for (int64_t l = 0; l < L; ++l) {
    const bool doubled = ff[static_cast<size_t>(l)] == 2 * ff[0] && l >= L - c.num_kv_shared_layers;
    if (ff[static_cast<size_t>(l)] != ff[0] && !doubled)
      return InvalidArgument(StrCat(f.path(), ": ", key("feed_forward_length"), " of layer ", l,
                                    " is ", ff[static_cast<size_t>(l)],
                                    "; Gemma 4 widens only the KV-shared layers, to twice ",
                                    ff[0]));
    c.use_double_wide_mlp |= doubled;
  }
  ST_ASSIGN_OR_RETURN(const std::vector<int64_t> kv,
                      PerLayer(f, key("attention.head_count_kv"), L));
  c.num_key_value_heads = kv[0];
  if (std::any_of(kv.begin(), kv.end(), [&](int64_t h) { return h != kv[0]; }))
    c.layer_kv_heads = kv;

  // The vocabularies from the tables' shapes; untied output heads are not Gemma 4's.
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->ne.size() != 2)
    return InvalidArgument(StrCat(f.path(), ": no 2-D token_embd.weight tensor"));
  c.vocab_size = embd->ne[1];
  if (f.FindTensor("output.weight") != nullptr)
    return InvalidArgument(StrCat(f.path(),
                                  ": an untied output.weight; Gemma 4 ties its head to "
                                  "token_embd, and slicetrain runs tied heads only"));
  c.tie_word_embeddings = true;
  if (c.hidden_size_per_layer_input > 0) {
    const GgufTensorInfo* ple = f.FindTensor("per_layer_token_embd.weight");
    if (ple == nullptr || ple->ne.size() != 2)
      return InvalidArgument(StrCat(f.path(), ": no 2-D per_layer_token_embd.weight tensor"));
    c.vocab_size_per_layer_input = ple->ne[1];
  }

  // The full layers' rotation: rope_freqs holds 1 for each rotated frequency pair and a huge
  // factor (no rotation) for the rest; its share of ones is the partial rotary factor.
  c.rope_sliding = RopeParams{"default", c.rope_sliding.theta, 1.0};
  c.rope_full.rope_type = "proportional";
  if (const GgufTensorInfo* rf = f.FindTensor("rope_freqs.weight")) {
    if (rf->ne.size() != 1 || rf->ne[0] != c.global_head_dim / 2)
      return InvalidArgument(StrCat(f.path(), ": rope_freqs.weight has ", rf->Elements(),
                                    " values, not ", c.global_head_dim / 2));
    std::vector<float> freqs(static_cast<size_t>(rf->Elements()));
    f.ReadF32(*rf, freqs.data());
    int64_t rotated = 0;
    for (float v : freqs) rotated += v == 1.0f;
    c.rope_full.partial_rotary_factor =
        static_cast<double>(rotated) / static_cast<double>(freqs.size());
  } else {
    c.rope_full.partial_rotary_factor = 1.0;
  }

  auto token = [&](const char* k, int64_t* id) -> Status {
    const std::string name = StrCat("tokenizer.ggml.", k);
    if (f.Find(name) == nullptr) return Status::Ok();
    ST_ASSIGN_OR_RETURN(*id, Int(f, name));
    return Status::Ok();
  };
  ST_RETURN_IF_ERROR(token("bos_token_id", &c.bos_token_id));
  ST_RETURN_IF_ERROR(token("eos_token_id", &c.eos_token_id));
  ST_RETURN_IF_ERROR(token("padding_token_id", &c.pad_token_id));
  ST_RETURN_IF_ERROR(c.Validate().WithContext(f.path()));
  c.original = c.ToTextJson();
  return c;
}

GgufWeights::GgufWeights(GgufFile file, const ParamRegistry& reg)
    : WeightSource(reg), file_(std::move(file)) {}

StatusOr<std::unique_ptr<GgufWeights>> GgufWeights::Open(GgufFile file, const ParamRegistry& reg) {
  std::unique_ptr<GgufWeights> w(new GgufWeights(std::move(file), reg));
  w->tensor_.assign(static_cast<size_t>(reg.layout.size()), nullptr);
  int64_t bf16 = 0, matrices = 0;
  for (int e = 0; e < reg.base_entries; ++e) {
    const ArenaEntry& a = reg.layout.entry(e);
    const std::string name = GgufTensorName(a.name);
    const GgufTensorInfo* t = name.empty() ? nullptr : w->file_.FindTensor(name);
    if (t == nullptr)
      return InvalidArgument(StrCat(w->file_.path(), ": no tensor ", name.empty() ? a.name : name,
                                    " (the model's ", a.name, ")"));
    if (t->TorchShape() != a.shape) {
      std::string want, got;
      for (int64_t d : a.shape) want += StrCat(want.empty() ? "" : ", ", d);
      for (int64_t d : t->TorchShape()) got += StrCat(got.empty() ? "" : ", ", d);
      return InvalidArgument(StrCat(w->file_.path(), ": tensor ", name, " is [", got,
                                    "] but the metadata's config needs [", want, "]"));
    }
    w->tensor_[static_cast<size_t>(e)] = t;
    if (a.shape.size() == 2) {
      matrices += a.numel;
      if (t->type == GgmlType::kBF16) bf16 += a.numel;
    }
  }
  w->dtype_ = 2 * bf16 > matrices ? DType::kBF16 : DType::kF32;
  return w;
}

void GgufWeights::Read(int entry, int64_t begin, int64_t count, float* dst) const {
  if (count <= 0) return;
  const GgufTensorInfo& t = *tensor_[static_cast<size_t>(entry)];
  const uint8_t* data = file_.Data(t);
  if (t.type == GgmlType::kF32) {
    std::memcpy(dst, data + begin * 4, static_cast<size_t>(count) * 4);
    return;
  }
  // Whole rows are converted (blocks never cross a row); a range's partial first and last rows
  // go through a row of scratch.
  const int64_t cols = t.ne[0];
  const size_t row_bytes = GgmlRowBytes(t.type, cols);
  std::vector<float> row;
  for (int64_t at = begin, end = begin + count; at < end;) {
    const int64_t r = at / cols, c0 = at % cols, n = std::min(cols - c0, end - at);
    if (c0 == 0 && n == cols) {
      DequantizeRow(t.type, data + static_cast<size_t>(r) * row_bytes, cols, dst + (at - begin));
    } else {
      row.resize(static_cast<size_t>(cols));
      DequantizeRow(t.type, data + static_cast<size_t>(r) * row_bytes, cols, row.data());
      std::memcpy(dst + (at - begin), row.data() + c0, static_cast<size_t>(n) * sizeof(float));
    }
    at += n;
  }
}

std::optional<WeightSource::StoredBlocks> GgufWeights::StoredGgml(int entry) const {
  const GgufTensorInfo* t = tensor_[static_cast<size_t>(entry)];
  if (t == nullptr) return std::nullopt;
  return StoredBlocks{file_.Data(*t), t->type};
}

void GgufWeights::Release(int entry, int64_t begin, int64_t count) const {
  const GgufTensorInfo* t = tensor_[static_cast<size_t>(entry)];
  if (t == nullptr) return;
  const int64_t cols = t->ne[0];
  const size_t row_bytes = GgmlRowBytes(t->type, cols);
  if (count < 0) count = t->Elements() - begin;
  // The rows wholly inside the range (a neighbour's row may still be read).
  const int64_t r0 = (begin + cols - 1) / cols, r1 = (begin + count) / cols;
  if (r1 > r0)
    file_.Release(*t, static_cast<size_t>(r0) * row_bytes,
                  static_cast<size_t>(r1 - r0) * row_bytes);
}

StatusOr<LoadedModel> LoadGgufModel(const std::string& path) {
  ST_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  LoadedModel m;
  ST_ASSIGN_OR_RETURN(m.config, Gemma4ConfigFromGguf(f));
  m.registry = BuildParamRegistry(m.config);
  ST_ASSIGN_OR_RETURN(std::unique_ptr<GgufWeights> w, GgufWeights::Open(std::move(f), m.registry));
  m.weights = std::move(w);
  m.source = path;
  return m;
}

}  // namespace st
