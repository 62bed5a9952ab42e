#include "io/gguf_export.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/files.h"
#include "io/gguf.h"
#include "model/lora.h"
#include "model/params.h"

namespace st {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// llama_token_type (llama.cpp's include/llama.h).
constexpr int32_t kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5,
                  kTokenByte = 6;

// slicetrain's gemma-chat format (data/chat_template.h) as a Jinja template, for tokenizers that
// carry Gemma 4's turn markers but no template of their own.
constexpr const char* kGemmaChatTemplate =
    R"({{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<|turn>' + role + '\n' + (message['content'] | trim) + '<turn|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %})";

// A special token of tokenizer_config.json: a string or {"content": ...}.
std::string SpecialTokenText(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

StatusOr<json> ReadJsonFile(const std::string& path) {
  ST_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(StrCat(path, ": not a JSON object"));
  return j;
}

std::string SizeLabel(int64_t n) {
  const char* suffix[] = {"", "K", "M", "B", "T"};
  double v = static_cast<double>(n);
  int k = 0;
  while (v >= 1000.0 && k < 4) {
    v /= 1000.0;
    ++k;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, k == 0 ? "%.0f%s" : "%.1f%s", v, suffix[k]);
  return buf;
}

// general.file_type (llama_ftype) of a model whose matrices are `t`.
int64_t FileType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ4_K:
      return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M, the only Q4_K file we write
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

// The type a matrix with rows of `cols` values is stored in for --quant `want`: a row that is not
// a whole number of the format's blocks falls back as llama.cpp does, Q6_K to Q8_0 (llama-quantize)
// and anything else (Q8_0 then too) to F16 (its converter).
GgmlType StoredType(GgmlType want, int64_t cols) {
  if (cols % GgmlTypeOf(want).block_elems != 0) {
    if (want == GgmlType::kQ6_K) want = GgmlType::kQ8_0;
    if (want == GgmlType::kQ4_K) want = GgmlType::kQ5_0;
  }
  if (cols % GgmlTypeOf(want).block_elems != 0) want = GgmlType::kF16;
  return want;
}

// llama-quantize's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The type llama-quantize gives a matrix of a gemma4 file under Q4_K_M without an importance
// matrix (src/llama-quant.cpp, llama_tensor_get_type): `index` of `count` is the matrix's place
// among the attention values (attn_v) or the layers (ffn_down), in layer order.
//  - per_layer_model_proj is never quantized (it stays as the source has it: F32 here);
//  - the token tables (token_embd, tied to the output, and per_layer_token_embd) take the output's
//    rule: Q6_K, or Q8_0 when a row is not whole 256-value blocks;
//  - attn_v and ffn_down of the layers UseMoreBits picks: Q6_K;
//  - everything else Q4_K; then the shape fallback of StoredType (Q4_K to Q5_0, Q6_K to Q8_0).
GgmlType Q4KMType(const std::string& name, int64_t cols, int64_t index, int64_t count) {
  if (name == "per_layer_model_proj.weight") return GgmlType::kF32;
  GgmlType t = GgmlType::kQ4_K;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") {
    t = cols % GgmlTypeOf(GgmlType::kQ4_K).block_elems != 0 ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
  } else if (name.find("attn_v.weight") != std::string::npos ||
             name.find("ffn_down") != std::string::npos) {
    if (UseMoreBits(index, count)) t = GgmlType::kQ6_K;
  }
  return StoredType(t, cols);
}

// The layer of a "blk.<n>." name, -1 for the others (llama.cpp orders a file's tensors by it).
int64_t GgufLayer(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::strtoll(name.c_str() + 4, nullptr, 10);
}

}  // namespace

std::vector<GgmlType> GgufMatrixTypes(const ParamRegistry& reg, int64_t num_layers,
                                      const GgufQuant& quant) {
  std::vector<GgmlType> types(static_cast<size_t>(reg.layout.size()), GgmlType::kF32);
  // llama-quantize counts the attention values in its order (by layer, then by name).
  std::vector<int64_t> v_layers;
  for (int e = 0; e < reg.base_entries; ++e) {
    const std::string name = GgufTensorName(reg.layout.entry(e).name);
    if (name.find("attn_v.weight") != std::string::npos) v_layers.push_back(GgufLayer(name));
  }
  std::sort(v_layers.begin(), v_layers.end());
  for (int e = 0; e < reg.base_entries; ++e) {
    const ArenaEntry& en = reg.layout.entry(e);
    if (en.shape.size() < 2) continue;
    const int64_t cols = en.shape.back();
    GgmlType& t = types[static_cast<size_t>(e)];
    if (!quant.q4_k_m) {
      t = StoredType(quant.type, cols);
      continue;
    }
    const std::string name = GgufTensorName(en.name);
    const int64_t layer = GgufLayer(name);
    const bool v = name.find("attn_v.weight") != std::string::npos;
    const int64_t index =
        v ? std::lower_bound(v_layers.begin(), v_layers.end(), layer) - v_layers.begin() : layer;
    t = Q4KMType(name, cols, index, v ? static_cast<int64_t>(v_layers.size()) : num_layers);
  }
  return types;
}

namespace {

// One planned tensor of the file.
struct Planned {
  std::string gguf_name;
  int entry = -1;  // registry entry; -1: rope_freqs (computed)
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::kF32;
};

// Reads an entry's values a chunk of rows at a time: from the source, or merged with its LoRA
// adapter (W + s B A, a layer matrix held whole only while it is being written).
class EntryRows {
 public:
  EntryRows(const ParamRegistry& reg, const WeightSource& source, const Planned& p)
      : source_(source), p_(p) {
    if (p.entry >= 0 && reg.lora_a.size() > static_cast<size_t>(p.entry) &&
        reg.lora_a[static_cast<size_t>(p.entry)] >= 0) {
      merged_.resize(static_cast<size_t>(p.rows * p.cols));
      MergeLora(reg, source, p.entry, merged_.data());
    }
  }
  // Rows [r0, r0 + n) into dst (n * cols floats).
  void Read(int64_t r0, int64_t n, float* dst) const {
    if (p_.entry < 0) {  // rope_freqs: one row
      for (int64_t i = 0; i < p_.cols; ++i) dst[i] = rope_[static_cast<size_t>(i)];
      return;
    }
    if (!merged_.empty()) {
      std::copy_n(merged_.data() + r0 * p_.cols, n * p_.cols, dst);
      return;
    }
    source_.Read(p_.entry, r0 * p_.cols, n * p_.cols, dst);
  }
  void Release(int64_t r0, int64_t n) const {
    if (p_.entry >= 0 && merged_.empty()) source_.Release(p_.entry, r0 * p_.cols, n * p_.cols);
  }
  void SetRope(std::vector<float> v) { rope_ = std::move(v); }

 private:
  const WeightSource& source_;
  const Planned& p_;
  std::vector<float> merged_, rope_;
};

// The largest |error| a value of a block may have after storing it as `t`, from the block's
// largest magnitude (Q8_0, Q4_0) or the value itself (F16, BF16): half a step of the format's grid,
// plus, for the block formats, what rounding the scale to fp16 moves the grid by. F32 is exact.
double ErrorBound(GgmlType t, double x, double block_amax) {
  constexpr double kHalfUlpF16 = 1.0 / 2048, kHalfUlpBF16 = 1.0 / 256, kF16MinStep = 0x1p-24;
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return std::max(std::fabs(x) * kHalfUlpF16, kF16MinStep / 2);
    case GgmlType::kBF16:
      return std::fabs(x) * kHalfUlpBF16 + 1e-45;
    case GgmlType::kQ8_0: {
      const double d = block_amax / 127;
      return 0.5 * d + 127 * (d * kHalfUlpF16 + kF16MinStep / 2) + 1e-6 * block_amax;
    }
    case GgmlType::kQ4_0: {
      // The side opposite the largest value ends one step short (q is capped at 15).
      const double d = block_amax / 8;
      return d + 8 * (d * kHalfUlpF16 + kF16MinStep / 2) + 1e-6 * block_amax;
    }
    case GgmlType::kQ5_0: {
      const double d = block_amax / 16;
      return d + 16 * (d * kHalfUlpF16 + kF16MinStep / 2) + 1e-6 * block_amax;
    }
    case GgmlType::kQ4_K:
      // Eight sub-blocks of 32 fitted with a scale and a minimum (15 steps over up to twice
      // max|x|), both rounded to 6 bits of the super-block's largest, and the search may clip a
      // sub-block's extremes. Measured worst (200 000 super-blocks of Gaussian, uniform,
      // Student-t, offset and sparse values, 12 orders of magnitude): max|x| / 7.8; fp16 d and
      // dmin of tiny tensors are subnormal, hence the absolute term as for Q6_K.
      return block_amax / 4 + 0x1p-12;
    case GgmlType::kQ6_K:
      // Sixteen sub-blocks whose int8 scales are relative to the super-block's largest: a sub-block
      // whose scale rounds down clips its extremes (up to about max|x| / 240 over half a step of
      // max|x| / 64); d, stored as fp16, is often subnormal, absolutely off by up to 2^-25, times
      // at most 128 x 32 levels.
      return block_amax / 24 + 0x1p-12;
    default:
      return 0;
  }
}

constexpr int64_t kChunkFloats = int64_t{1} << 22;  // 16 MiB of fp32 rows per read

}  // namespace

Status CheckLlamaCppKvSharing(const Gemma4Config& cfg) {
  if (cfg.num_kv_shared_layers == 0) return Status::Ok();
  // llama.cpp (src/llama-model.cpp, the gemma4 KV cache) gives a shared sliding layer the cache of
  // layer first_shared - 2 and a shared full layer that of first_shared - 1, which is where
  // transformers' rule (the last earlier layer of the same type) lands for the released models.
  const int64_t first = cfg.FirstKvSharedLayer();
  for (int64_t l = first; l < cfg.num_hidden_layers; ++l) {
    const bool swa = cfg.layer_types[l] == LayerType::kSliding;
    const int64_t llama_cpp = first - (swa ? 2 : 1);
    if (cfg.KvSourceLayer(l) != llama_cpp)
      return InvalidArgument(StrCat(
          "llama.cpp cannot run this model: its layer ", l, " (", swa ? "sliding" : "full",
          ") shares the KV cache of layer ", cfg.KvSourceLayer(l),
          ", but llama.cpp's gemma4 reads layer ", llama_cpp,
          " (it needs the last layer before the shared ones to be full-attention and the one "
          "before it sliding, as in Gemma 4 E2B and E4B)"));
  }
  return Status::Ok();
}

namespace {

// Writes the planned tensors (values from the model, rope_freqs computed), reopens the file and
// checks every value against the model within its format's bound, then renames it into place.
Status WriteChecked(const LoadedModel& m, GgufWriter& w, const std::vector<Planned>& plan,
                    const std::vector<float>& rope_freqs, const GgufExportOptions& o,
                    std::chrono::steady_clock::time_point t0, GgufExportReport& report) {
  const ParamRegistry& reg = m.registry;
  const WeightSource& source = *m.weights;
  auto last_progress = std::chrono::steady_clock::now();
  uint64_t bytes_done = 0;
  std::vector<float> rows;
  std::vector<uint8_t> out;
  const Status written = w.Write(o.output, [&](size_t i, const GgufWriter::PutFn& put) -> Status {
    const Planned& p = plan[i];
    EntryRows src(reg, source, p);
    if (p.entry < 0) src.SetRope(rope_freqs);
    const size_t row_bytes = GgmlRowBytes(p.type, p.cols);
    const int64_t chunk = std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(p.cols, 1));
    for (int64_t r0 = 0; r0 < p.rows; r0 += chunk) {
      const int64_t n = std::min(chunk, p.rows - r0);
      rows.resize(static_cast<size_t>(n * p.cols));
      out.resize(static_cast<size_t>(n) * row_bytes);
      src.Read(r0, n, rows.data());
      const int64_t values = n * p.cols;
      for (int64_t k = 0; k < values; ++k)
        if (!std::isfinite(rows[static_cast<size_t>(k)]))
          return InvalidArgument(
              StrCat("tensor ", reg.layout.entry(p.entry).name, " has a ",
                     std::isnan(rows[static_cast<size_t>(k)]) ? "NaN" : "infinite", " value (row ",
                     r0 + k / p.cols, "); the model is broken, nothing was written"));
      if (!GgmlTypeOf(p.type).quantize) {
        return Internal(StrCat("cannot store ", GgmlTypeOf(p.type).name, " rows"));
      }
      // The K-quant searches cost far more than reading: rows in parallel (each row's bytes are
      // its own, so the file is the same whatever the thread count).
#pragma omp parallel for schedule(dynamic, 16) if (values > (1 << 16))
      for (int64_t r = 0; r < n; ++r)
        QuantizeRow(p.type, rows.data() + r * p.cols, p.cols, out.data() + r * row_bytes);
      src.Release(r0, n);
      ST_RETURN_IF_ERROR(put(out.data(), out.size()));
      bytes_done += out.size();
    }
    const auto now = std::chrono::steady_clock::now();
    if (o.progress && now - last_progress > std::chrono::seconds(10)) {
      last_progress = now;
      std::fprintf(stderr, "export: %zu/%zu tensors written, %.2f GB (%.0f s)\n", i + 1,
                   plan.size(), static_cast<double>(bytes_done) / 1e9,
                   std::chrono::duration<double>(now - t0).count());
    }
    return Status::Ok();
  });
  ST_RETURN_IF_ERROR(written);

  // Reload what was written and check every tensor against the model's values.
  ST_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(w.temporary_path()));
  if (f.tensors().size() != plan.size())
    return DataLoss(StrCat(w.temporary_path(), ": ", f.tensors().size(), " tensors read back, ",
                           plan.size(), " written"));
  std::vector<float> back;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Planned& p = plan[i];
    const GgufTensorInfo& t = f.tensors()[i];
    if (t.name != p.gguf_name || t.type != p.type || t.ne != p.ne)
      return DataLoss(StrCat(w.temporary_path(), ": tensor ", i, " reads back as ", t.name,
                             " and not as written (", p.gguf_name, ")"));
    EntryRows src(reg, source, p);
    if (p.entry < 0) src.SetRope(rope_freqs);
    const size_t row_bytes = GgmlRowBytes(p.type, p.cols);
    const int64_t block = GgmlTypeOf(p.type).block_elems;
    const bool blocked = GgmlTypeOf(p.type).block_elems > 1;
    const int64_t chunk = std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(p.cols, 1));
    double err2 = 0, val2 = 0;
    for (int64_t r0 = 0; r0 < p.rows; r0 += chunk) {
      const int64_t n = std::min(chunk, p.rows - r0);
      rows.resize(static_cast<size_t>(n * p.cols));
      back.resize(rows.size());
      src.Read(r0, n, rows.data());
      for (int64_t r = 0; r < n; ++r)
        DequantizeRow(p.type, f.Data(t) + (r0 + r) * row_bytes, p.cols, back.data() + r * p.cols);
      for (int64_t r = 0; r < n; ++r) {
        const float* x = rows.data() + r * p.cols;
        const float* y = back.data() + r * p.cols;
        for (int64_t b0 = 0; b0 < p.cols; b0 += block) {
          double amax = 0;
          if (blocked)
            for (int64_t c = b0; c < b0 + block; ++c)
              amax = std::max(amax, std::fabs(double{x[c]}));
          for (int64_t c = b0; c < b0 + block; ++c) {
            const double e = std::fabs(double{y[c]} - double{x[c]});
            err2 += e * e;
            val2 += double{x[c]} * double{x[c]};
            if (!(e <= ErrorBound(p.type, x[c], amax))) {
              if (p.type == GgmlType::kF16 && std::fabs(x[c]) > 65504)
                return InvalidArgument(
                    StrCat("tensor ", p.gguf_name, " has the value ", x[c],
                           ", beyond fp16's range; export with --quant bf16 (or f32) instead"));
              return DataLoss(StrCat(w.temporary_path(), ": tensor ", p.gguf_name, " element ",
                                     (r0 + r) * p.cols + c, " reads back as ", y[c], " for ", x[c],
                                     ", beyond the ", GgmlTypeOf(p.type).name,
                                     " bound; nothing was written"));
            }
          }
        }
      }
      src.Release(r0, n);
      f.Release(t, static_cast<size_t>(r0) * row_bytes, static_cast<size_t>(n) * row_bytes);
    }
    const double rel = val2 > 0 ? std::sqrt(err2 / val2) : 0;
    if (rel >= report.worst_relative_rms_error) {
      report.worst_relative_rms_error = rel;
      report.worst_tensor = StrCat(p.gguf_name, " (", GgmlTypeOf(p.type).name, ")");
    }
  }
  ST_RETURN_IF_ERROR(w.Commit());

  std::map<GgmlType, int64_t> per_type;
  for (const Planned& p : plan) ++per_type[p.type];
  report.tensors_per_type.assign(per_type.begin(), per_type.end());
  report.tensors = static_cast<int64_t>(plan.size());
  report.file_bytes = fs::file_size(o.output);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

}  // namespace

std::string GgufTensorName(const std::string& n) {
  static const std::map<std::string, std::string> kTop = {
      {"embed_tokens.weight", "token_embd.weight"},
      {"embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
      {"per_layer_model_projection.weight", "per_layer_model_proj.weight"},
      {"per_layer_projection_norm.weight", "per_layer_proj_norm.weight"},
      {"norm.weight", "output_norm.weight"},
  };
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"layer_scalar", "layer_output_scale.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"per_layer_input_gate.weight", "inp_gate.weight"},
      {"per_layer_projection.weight", "proj.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"post_per_layer_input_norm.weight", "post_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
  };
  if (auto it = kTop.find(n); it != kTop.end()) return it->second;
  static const std::regex kLayerName(R"(layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(n, m, kLayerName)) return "";
  auto it = kLayer.find(m[2].str());
  if (it == kLayer.end()) return "";
  return StrCat("blk.", m[1].str(), ".", it->second);
}

StatusOr<GgufQuant> ParseGgufQuant(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  auto one = [](GgmlType t) { return GgufQuant{t, false}; };
  if (s == "f32" || s == "fp32") return one(GgmlType::kF32);
  if (s == "f16" || s == "fp16") return one(GgmlType::kF16);
  if (s == "bf16") return one(GgmlType::kBF16);
  if (s == "q8_0") return one(GgmlType::kQ8_0);
  if (s == "q4_0") return one(GgmlType::kQ4_0);
  if (s == "q6_k") return one(GgmlType::kQ6_K);
  if (s == "q4_k_m") return GgufQuant{GgmlType::kQ4_K, true};
  if (s == "q4_k_s" || s == "q4_k" || s == "q5_k_m" || s == "q5_k_s" || s == "q3_k_m" ||
      s == "q2_k")
    return InvalidArgument(
        StrCat("--quant ", name,
               ": this K-quant mixture is not written; use q4_k_m, q6_k, q8_0 or q4_0 (or bf16 "
               "and llama.cpp's llama-quantize)"));
  return InvalidArgument(
      StrCat("--quant ", name, ": unknown; use one of f32, f16, bf16, q8_0, q6_k, q4_k_m, q4_0"));
}

namespace {

StatusOr<GgufVocab> ReadGgufVocabOrThrow(const std::string& dir, int64_t vocab_size);

}  // namespace

StatusOr<GgufVocab> ReadGgufVocab(const std::string& dir, int64_t vocab_size) {
  // A field of an unexpected JSON type (an id given as a string, say) throws in nlohmann's
  // accessors: one error line naming the files, never an abort.
  try {
    return ReadGgufVocabOrThrow(dir, vocab_size);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(StrCat(dir,
                                  ": tokenizer.json or tokenizer_config.json has a field of "
                                  "an unexpected type (",
                                  e.what(), ")"));
  }
}

namespace {

StatusOr<GgufVocab> ReadGgufVocabOrThrow(const std::string& dir, int64_t vocab_size) {
  const std::string tj_path = (fs::path(dir) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::exists(tj_path, ec))
    return NotFound(StrCat(dir,
                           " has no tokenizer.json; GGUF export needs the model's Hugging Face "
                           "tokenizer (give its directory with --tokenizer)"));
  ST_ASSIGN_OR_RETURN(const json tj, ReadJsonFile(tj_path));
  const json& model = tj.value("model", json::object());
  if (model.value("type", std::string()) != "BPE" || !model.value("byte_fallback", false))
    return InvalidArgument(StrCat(tj_path, ": a ", model.value("type", std::string("?")),
                                  " tokenizer without byte fallback; llama.cpp's gemma4 tokenizer "
                                  "reads Gemma's BPE with byte fallback only"));
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return InvalidArgument(StrCat(tj_path, ": model.vocab is missing"));

  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return InvalidArgument(StrCat(tj_path, ": token '", text, "' has no valid id"));
    by_id[id.get<int64_t>()] = text;
  }
  std::set<int64_t> special, added;
  for (const json& a : tj.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("id") || !a.contains("content")) continue;
    const int64_t id = a["id"].get<int64_t>();
    by_id[id] = a["content"].get<std::string>();
    added.insert(id);
    if (a.value("special", false)) special.insert(id);
  }
  const int64_t n = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  if (n > vocab_size)
    return InvalidArgument(StrCat(tj_path, " has ", n, " tokens but the model has ", vocab_size,
                                  " embedding rows; give the model's own tokenizer"));

  json cfg = json::object();
  const std::string tc_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (fs::exists(tc_path, ec)) {
    ST_ASSIGN_OR_RETURN(cfg, ReadJsonFile(tc_path));
  }
  std::map<std::string, int64_t> ids;
  for (const auto& [id, text] : by_id) ids.emplace(text, id);
  auto id_of = [&](const std::string& text) -> int64_t {
    auto it = ids.find(text);
    return it == ids.end() ? -1 : it->second;
  };

  GgufVocab v;
  v.bos = id_of(SpecialTokenText(cfg, "bos_token"));
  v.eos = id_of(SpecialTokenText(cfg, "eos_token"));
  v.unk = id_of(SpecialTokenText(cfg, "unk_token"));
  if (v.unk < 0 && model.contains("unk_token") && model["unk_token"].is_string())
    v.unk = id_of(model["unk_token"].get<std::string>());
  v.pad = id_of(SpecialTokenText(cfg, "pad_token"));
  v.mask = id_of(SpecialTokenText(cfg, "mask_token"));
  for (int64_t id : {v.bos, v.eos, v.unk, v.pad, v.mask})
    if (id >= 0) special.insert(id);
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
    v.has_add_eos = true;
    v.add_eos = cfg["add_eos_token"].get<bool>();
  }

  // Markers llama.cpp's converter keeps visible (USER_DEFINED) so that its chat parser reads them.
  static const std::set<std::string> kVisible = {
      "<|channel>",       "<channel|>",       "<|tool_call>", "<tool_call|>",
      "<|tool_response>", "<tool_response|>", "<|\"|>"};
  static const std::regex kByte("<0x[0-9A-Fa-f]{2}>");
  v.tokens.resize(static_cast<size_t>(vocab_size));
  v.types.resize(static_cast<size_t>(vocab_size));
  for (int64_t id = 0; id < vocab_size; ++id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      v.tokens[id] = StrCat("[PAD", id, "]");
      v.types[id] = kTokenUnused;
      if (id >= n) ++v.padding_tokens;
      continue;
    }
    const std::string& text = it->second;
    v.tokens[id] = text;
    if (text.find('\n') != std::string::npos && text.find_first_not_of('\n') != std::string::npos)
      ++v.newline_joining_tokens;
    if (kVisible.count(text))
      v.types[id] = kTokenUserDefined;
    else if (std::regex_match(text, kByte))
      v.types[id] = kTokenByte;
    else if (special.count(id))
      v.types[id] = kTokenControl;
    else if (added.count(id))
      v.types[id] = kTokenUserDefined;
    else
      v.types[id] = kTokenNormal;
  }
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string())
      v.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      return InvalidArgument(StrCat(tj_path, ": a merge that is neither \"a b\" nor [a, b]"));
  }

  // The chat template: chat_template.jinja (newer transformers), tokenizer_config.json's, else
  // gemma-chat for a tokenizer with Gemma 4's turn markers.
  const std::string jinja = (fs::path(dir) / "chat_template.jinja").string();
  if (fs::exists(jinja, ec)) {
    ST_ASSIGN_OR_RETURN(v.chat_template, ReadTextFile(jinja));
    v.chat_template_source = jinja;
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    v.chat_template = cfg["chat_template"].get<std::string>();
    v.chat_template_source = tc_path;
  } else if (id_of("<|turn>") >= 0 && id_of("<turn|>") >= 0) {
    v.chat_template = kGemmaChatTemplate;
    v.chat_template_source = "gemma-chat (built in)";
  }
  return v;
}

}  // namespace

StatusOr<GgufExportReport> ExportGguf(const LoadedModel& m, const GgufExportOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const Gemma4Config& cfg = m.config;
  if (cfg.enable_moe_block)
    return Unimplemented("GGUF export of Gemma 4's mixture-of-experts models is not written yet");
  if (!cfg.tie_word_embeddings)
    return Unimplemented("GGUF export of a model with an untied LM head is not written yet");
  const int64_t L = cfg.num_hidden_layers, P = cfg.hidden_size_per_layer_input;
  if (P > 0 && cfg.vocab_size_per_layer_input != cfg.vocab_size)
    return InvalidArgument(StrCat("vocab_size_per_layer_input (", cfg.vocab_size_per_layer_input,
                                  ") differs from vocab_size (", cfg.vocab_size,
                                  "); llama.cpp's gemma4 needs them equal"));
  int64_t first_full = -1;
  for (int64_t l = 0; l < L; ++l)
    if (cfg.layer_types[l] == LayerType::kFull && first_full < 0) first_full = l;
  if (first_full >= 0 && cfg.rope_full.rope_type != "proportional")
    return InvalidArgument(StrCat("full-attention layers use '", cfg.rope_full.rope_type,
                                  "' RoPE; llama.cpp's gemma4 reads the proportional kind only"));
  const int64_t head_dim_full = first_full >= 0 ? cfg.HeadDim(first_full) : cfg.global_head_dim;
  ST_RETURN_IF_ERROR(CheckLlamaCppKvSharing(cfg));

  GgufExportReport report;
  ST_ASSIGN_OR_RETURN(report.vocab, ReadGgufVocab(o.tokenizer_dir, cfg.vocab_size));
  const GgufVocab& vocab = report.vocab;

  // The tensors, in the order llama.cpp's converter writes them: rope_freqs, then the model's
  // tensors sorted by name.
  const ParamRegistry base = BuildParamRegistry(cfg);
  const std::vector<GgmlType> types = GgufMatrixTypes(base, L, {o.weight_type, o.q4_k_m});
  std::vector<Planned> plan;
  {
    Planned rope;
    rope.gguf_name = "rope_freqs.weight";
    rope.rows = 1;
    rope.cols = head_dim_full / 2;
    rope.ne = {rope.cols};
    if (first_full >= 0) plan.push_back(rope);
  }
  std::vector<int> order(static_cast<size_t>(base.layout.size()));
  for (int i = 0; i < base.layout.size(); ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return base.layout.entry(a).name < base.layout.entry(b).name; });
  for (int e : order) {
    const ArenaEntry& en = base.layout.entry(e);
    Planned p;
    p.entry = e;
    p.gguf_name = GgufTensorName(en.name);
    if (p.gguf_name.empty()) return Internal(StrCat("no GGUF name for the tensor ", en.name));
    p.cols = en.shape.back();
    p.rows = en.numel / std::max<int64_t>(p.cols, 1);
    p.ne.assign(en.shape.rbegin(), en.shape.rend());
    report.parameters += en.numel;
    p.type = types[static_cast<size_t>(e)];
    plan.push_back(std::move(p));
  }

  GgufWriter w;
  using VT = GgufValueType;
  auto u32 = [](int64_t v) { return GgufValue::Int(VT::kU32, v); };
  auto f32 = [](double v) { return GgufValue::Float(VT::kF32, v); };
  const std::string arch = "gemma4";
  auto key = [&](const char* k) { return StrCat(arch, ".", k); };
  w.Set("general.architecture", GgufValue::String(arch));
  w.Set("general.type", GgufValue::String("model"));
  w.Set("general.name", GgufValue::String(o.name));
  w.Set("general.size_label", GgufValue::String(SizeLabel(report.parameters)));
  w.Set(key("block_count"), u32(L));
  w.Set(key("context_length"), u32(cfg.max_position_embeddings));
  w.Set(key("embedding_length"), u32(cfg.hidden_size));
  if (cfg.use_double_wide_mlp) {
    std::vector<int64_t> ff;
    for (int64_t l = 0; l < L; ++l) ff.push_back(cfg.MlpWidth(l));
    w.Set(key("feed_forward_length"), GgufValue::IntArray(VT::kI32, ff));
  } else {
    w.Set(key("feed_forward_length"), u32(cfg.intermediate_size));
  }
  w.Set(key("attention.head_count"), u32(cfg.num_attention_heads));
  bool kv_per_layer = false;
  std::vector<int64_t> kv;
  for (int64_t l = 0; l < L; ++l) {
    kv.push_back(cfg.KvHeads(l));
    kv_per_layer |= kv.back() != cfg.num_key_value_heads;
  }
  w.Set(key("attention.head_count_kv"),
        kv_per_layer ? GgufValue::IntArray(VT::kI32, kv) : u32(cfg.num_key_value_heads));
  w.Set(key("rope.freq_base"), f32(cfg.rope_full.theta));
  w.Set(key("rope.freq_base_swa"), f32(cfg.rope_sliding.theta));
  w.Set(key("attention.layer_norm_rms_epsilon"), f32(cfg.rms_norm_eps));
  w.Set(key("attention.key_length"), u32(head_dim_full));
  w.Set(key("attention.value_length"), u32(head_dim_full));
  w.Set("general.file_type", u32(FileType(o.weight_type)));
  if (cfg.final_logit_softcapping > 0)
    w.Set(key("final_logit_softcapping"), f32(cfg.final_logit_softcapping));
  w.Set(key("attention.sliding_window"), u32(cfg.sliding_window));
  w.Set(key("attention.shared_kv_layers"), u32(cfg.num_kv_shared_layers));
  w.Set(key("embedding_length_per_layer_input"), u32(P));
  std::vector<int64_t> swa;
  for (int64_t l = 0; l < L; ++l) swa.push_back(cfg.layer_types[l] == LayerType::kSliding);
  w.Set(key("attention.sliding_window_pattern"), GgufValue::IntArray(VT::kBool, swa));
  w.Set(key("attention.key_length_swa"), u32(cfg.head_dim));
  w.Set(key("attention.value_length_swa"), u32(cfg.head_dim));
  w.Set(key("rope.dimension_count"), u32(head_dim_full));
  w.Set(key("rope.dimension_count_swa"),
        u32(static_cast<int64_t>(cfg.head_dim * cfg.rope_sliding.partial_rotary_factor)));
  w.Set("general.quantization_version", u32(2));
  w.Set("tokenizer.ggml.model", GgufValue::String("gemma4"));
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(vocab.tokens));
  w.Set("tokenizer.ggml.scores",
        GgufValue::FloatArray(VT::kF32, std::vector<double>(vocab.tokens.size(), -1000.0)));
  w.Set(
      "tokenizer.ggml.token_type",
      GgufValue::IntArray(VT::kI32, std::vector<int64_t>(vocab.types.begin(), vocab.types.end())));
  if (!vocab.merges.empty()) w.Set("tokenizer.ggml.merges", GgufValue::StringArray(vocab.merges));
  const std::pair<const char*, int64_t> ids[] = {{"bos_token_id", vocab.bos},
                                                 {"eos_token_id", vocab.eos},
                                                 {"unknown_token_id", vocab.unk},
                                                 {"padding_token_id", vocab.pad},
                                                 {"mask_token_id", vocab.mask}};
  for (const auto& [k, id] : ids)
    if (id >= 0) w.Set(StrCat("tokenizer.ggml.", k), u32(id));
  w.Set("tokenizer.ggml.add_bos_token", GgufValue::Int(VT::kBool, 1));
  if (vocab.has_add_eos)
    w.Set("tokenizer.ggml.add_eos_token", GgufValue::Int(VT::kBool, vocab.add_eos));
  if (!vocab.chat_template.empty())
    w.Set("tokenizer.chat_template", GgufValue::String(vocab.chat_template));
  w.Set("tokenizer.ggml.add_space_prefix", GgufValue::Int(VT::kBool, 0));

  for (const Planned& p : plan) ST_RETURN_IF_ERROR(w.AddTensor(p.gguf_name, p.ne, p.type));

  // rope_freqs: 1 for the rotated pairs of a full layer's head, 1e30 (no rotation) for the rest.
  std::vector<float> rope_freqs;
  if (first_full >= 0) {
    const int64_t rotated =
        static_cast<int64_t>(head_dim_full * cfg.rope_full.partial_rotary_factor / 2);
    rope_freqs.assign(static_cast<size_t>(head_dim_full / 2), 1e30f);
    std::fill_n(rope_freqs.begin(), std::min<int64_t>(rotated, head_dim_full / 2), 1.0f);
  }

  ST_RETURN_IF_ERROR(WriteChecked(m, w, plan, rope_freqs, o, t0, report));
  return report;
}

StatusOr<GgufExportReport> ExportGgufLora(const LoadedModel& m, const GgufExportOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const ParamRegistry& reg = m.registry;
  if (!reg.HasAdapters()) return InvalidArgument("--format gguf-lora needs --adapter");
  for (int e = 0; e < reg.base_entries; ++e)
    if (reg.lora_full[static_cast<size_t>(e)])
      return InvalidArgument(StrCat(
          "the adapter trains ", reg.layout.entry(e).name,
          " in full (modules_to_save); a llama.cpp LoRA holds low-rank pairs only: export the "
          "merged model with --format gguf instead"));
  // llama.cpp's gemma4 multiplies by per_layer_model_proj with a plain product (no LoRA hook): an
  // adapter there would be loaded and silently ignored.
  if (reg.per_layer_model_projection >= 0 &&
      reg.lora_a[static_cast<size_t>(reg.per_layer_model_projection)] >= 0)
    return InvalidArgument(
        "the adapter adapts per_layer_model_projection, which llama.cpp's gemma4 applies without "
        "LoRA (it would ignore that pair): export the merged model with --format gguf instead");
  std::vector<Planned> plan;
  for (int e = 0; e < reg.base_entries; ++e) {
    const int a = reg.lora_a[static_cast<size_t>(e)], b = reg.lora_b[static_cast<size_t>(e)];
    if (a < 0) continue;
    const std::string name = GgufTensorName(reg.layout.entry(e).name);
    if (name.empty()) return Internal(StrCat("no GGUF name for ", reg.layout.entry(e).name));
    for (const auto& [entry, suffix] :
         {std::pair<int, const char*>{a, ".lora_a"}, {b, ".lora_b"}}) {
      const ArenaEntry& en = reg.layout.entry(entry);  // A [R, in], B [out, R]
      Planned p;
      p.entry = entry;
      p.gguf_name = name + suffix;
      p.cols = en.shape.back();
      p.rows = en.numel / p.cols;
      p.ne.assign(en.shape.rbegin(), en.shape.rend());
      p.type = StoredType(o.weight_type, p.cols);
      plan.push_back(std::move(p));
    }
  }
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("gemma4"));
  w.Set("general.type", GgufValue::String("adapter"));
  w.Set("adapter.type", GgufValue::String("lora"));
  w.Set("general.name", GgufValue::String(o.name));
  // llama.cpp scales by alpha / rank; alpha = scaling * rank gives PEFT's scaling for rsLoRA too.
  w.Set(
      "adapter.lora.alpha",
      GgufValue::Float(GgufValueType::kF32, reg.lora_scaling * static_cast<double>(reg.lora_rank)));
  w.Set("general.quantization_version", GgufValue::Int(GgufValueType::kU32, 2));
  for (const Planned& p : plan) ST_RETURN_IF_ERROR(w.AddTensor(p.gguf_name, p.ne, p.type));
  GgufExportReport report;
  for (const Planned& p : plan) report.parameters += p.rows * p.cols;
  ST_RETURN_IF_ERROR(WriteChecked(m, w, plan, {}, o, t0, report));
  return report;
}

std::string OllamaModelfile(const std::string& gguf_file, const GgufVocab& vocab) {
  std::string s =
      StrCat("# Ollama: ollama create <name> -f Modelfile (written by slicetrain export)\n",
             "FROM ./", gguf_file, "\n");
  const bool gemma_chat =
      std::find(vocab.tokens.begin(), vocab.tokens.end(), "<|turn>") != vocab.tokens.end();
  if (gemma_chat) {
    // Gemma 4's turns in Go template syntax; Ollama adds <bos> itself (add_bos_token).
    s += "TEMPLATE \"\"\"{{- range .Messages }}<|turn>";
    s += "{{ if eq .Role \"assistant\" }}model{{ else }}{{ .Role }}{{ end }}\n";
    s += "{{ .Content }}<turn|>\n{{ end }}<|turn>model\n\"\"\"\n";
    s += "PARAMETER stop \"<turn|>\"\n";
  }
  if (vocab.eos >= 0) s += StrCat("PARAMETER stop \"", vocab.tokens[vocab.eos], "\"\n");
  return s;
}

}  // namespace st
