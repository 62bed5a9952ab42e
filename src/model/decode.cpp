#include "model/decode.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/quant.h"
#include "model/lora.h"

namespace st {

namespace {

bool IsRowsOnly(const ParamRegistry& reg, int e) {
  return e == reg.embed_tokens_per_layer;
}

}  // namespace

double DecodeWeights::Bytes(const ParamRegistry& reg, DType storage) {
  double n = 0;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (IsRowsOnly(reg, e)) continue;
    const ArenaEntry& a = reg.layout.entry(e);
    n += static_cast<double>(a.numel) *
         (storage == DType::kBF16 && a.shape.size() == 2 ? sizeof(uint16_t) : sizeof(float));
  }
  return n;
}

double DecodeWeights::Bytes(const ParamRegistry& reg, const BlockStorage& blocks) {
  double n = 0;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (IsRowsOnly(reg, e)) continue;
    const ArenaEntry& a = reg.layout.entry(e);
    n += a.shape.size() == 2 ? static_cast<double>(GgmlRowBytes(blocks.of(e), a.shape[1])) *
                                   static_cast<double>(a.shape[0])
                             : static_cast<double>(a.numel) * sizeof(float);
  }
  return n;
}

DecodeWeights::DecodeWeights(const ParamRegistry& reg, const WeightSource& source,
                             const BlockStorage& blocks)
    : storage_(DType::kF32) {
  const size_t entries = static_cast<size_t>(reg.layout.size());
  std::vector<int64_t> offset(entries, -1), block_offset(entries, -1);
  block_types_.assign(entries, GgmlType::kF32);
  int64_t total = 0, bytes = 0;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (IsRowsOnly(reg, e)) continue;
    const ArenaEntry& a = reg.layout.entry(e);
    const GgmlType type = a.shape.size() == 2 ? blocks.of(e) : GgmlType::kF32;
    if (type != GgmlType::kF32) {
      ST_CHECK(cpu::HasInt8BlockProduct(type))
          << a.name << ": block storage has no product for " << GgmlTypeOf(type).name;
      ST_CHECK(GgmlRowBytes(type, a.shape[1]) > 0)
          << a.name << ": rows of " << a.shape[1] << " values are not whole "
          << GgmlTypeOf(type).name << " blocks";
      block_types_[static_cast<size_t>(e)] = type;
      block_offset[static_cast<size_t>(e)] = bytes;
      bytes += static_cast<int64_t>(GgmlRowBytes(type, a.shape[1])) * a.shape[0];
    } else {
      offset[static_cast<size_t>(e)] = total;
      total += (a.numel + 15) / 16 * 16;
    }
  }
  buffer_ = AlignedBuffer(std::max<int64_t>(total, 1));
  blocks_.resize(static_cast<size_t>(bytes));
  f32_.assign(entries, nullptr);
  bf16_.assign(entries, nullptr);
  q_.assign(entries, nullptr);
  rows_.assign(entries, nullptr);
  // A matrix goes through fp32 in chunks of whole rows, or whole when an adapter is merged into it.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> tmp;
  for (int e = 0; e < reg.base_entries; ++e) {
    const size_t i = static_cast<size_t>(e);
    if (IsRowsOnly(reg, e)) {
      rows_[i] = &source;
      continue;
    }
    const ArenaEntry& a = reg.layout.entry(e);
    if (offset[i] >= 0) {
      f32_[i] = buffer_.data() + offset[i];
      source.ReadAll(e, buffer_.data() + offset[i]);
      source.Release(e);
      continue;
    }
    const int64_t rows = a.shape[0], cols = a.shape[1];
    const GgmlType type = block_types_[i];
    const size_t row_bytes = GgmlRowBytes(type, cols);
    uint8_t* dst = blocks_.data() + block_offset[i];
    const bool merge = reg.lora_a[i] >= 0;
    // Rows already stored in this type (a GGUF file's) are taken as they are: rounding their
    // values again could change them (the K-quants' searches are not idempotent).
    if (const std::optional<WeightSource::StoredBlocks> stored = source.StoredGgml(e);
        stored && stored->type == type && !merge) {
      std::memcpy(dst, stored->data, static_cast<size_t>(rows) * row_bytes);
      q_[i] = dst;
      source.Release(e);
      continue;
    }
    const int64_t chunk_rows = merge ? rows : std::max<int64_t>(1, kChunk / cols);
    tmp.resize(static_cast<size_t>(std::min(rows, chunk_rows) * cols));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      if (merge)
        MergeLora(reg, source, e, tmp.data());
      else
        source.Read(e, r0 * cols, n * cols, tmp.data());
#pragma omp parallel for schedule(static) if (n * cols > (1 << 16))
      for (int64_t r = 0; r < n; ++r)
        QuantizeRow(type, tmp.data() + r * cols, cols,
                    dst + static_cast<size_t>(r0 + r) * row_bytes);
    }
    q_[i] = dst;
    source.Release(e);
  }
}

DType DecodeWeights::DefaultStorage(const ParamRegistry& reg, const WeightSource& source) {
  return source.dtype() == DType::kBF16 && !reg.HasAdapters() ? DType::kBF16 : DType::kF32;
}

namespace {
constexpr int64_t kFillChunk = int64_t{1} << 20;  // bf16 storage: values converted at a time
}  // namespace

DecodeWeights::DecodeWeights(const ParamRegistry& reg, const WeightSource& source, DType storage)
    : storage_(storage) {
  ST_CHECK(storage == DType::kF32 || storage == DType::kBF16)
      << "decode weights are fp32 or bf16, not " << DTypeName(storage);
  const size_t entries = static_cast<size_t>(reg.layout.size());
  auto half = [&](int e) {
    return storage == DType::kBF16 && reg.layout.entry(e).shape.size() == 2;
  };
  offset_.assign(entries, -1);
  // A bf16 matrix goes through fp32 in chunks of kFillChunk elements, or whole when an adapter is
  // merged into it (the merge needs the tensor): the fp32 scratch is the larger of the two.
  int64_t total = 0, halves = 0;
  scratch_ = kFillChunk;
  for (int e = 0; e < reg.base_entries; ++e) {
    if (IsRowsOnly(reg, e)) continue;
    const int64_t numel = reg.layout.entry(e).numel;
    if (half(e) && reg.lora_a[static_cast<size_t>(e)] >= 0) scratch_ = std::max(scratch_, numel);
    if (half(e)) {
      offset_[static_cast<size_t>(e)] = halves;
      halves += numel;
    } else {
      offset_[static_cast<size_t>(e)] = total;
      total += (numel + 15) / 16 * 16;  // 16-float alignment, as the arenas have
    }
  }
  buffer_ = AlignedBuffer(std::max<int64_t>(total, 1));
  half_.resize(static_cast<size_t>(halves));
  f32_.assign(entries, nullptr);
  bf16_.assign(entries, nullptr);
  rows_.assign(entries, nullptr);
  Fill(reg, source);
}

void DecodeWeights::Refill(const ParamRegistry& reg, const WeightSource& source) {
  ST_CHECK(!quantized() && offset_.size() == static_cast<size_t>(reg.layout.size()))
      << "Refill of the registry the weights were made for, in fp32 or bf16";
  Fill(reg, source);
}

void DecodeWeights::Fill(const ParamRegistry& reg, const WeightSource& source) {
  const bool bf16 = storage_ == DType::kBF16;
  std::vector<float> tmp(bf16 ? static_cast<size_t>(scratch_) : 0);
  auto to_bf16 = [](const float* src, uint16_t* h, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t j = 0; j < n; ++j) h[j] = FloatToBF16(src[j]);
  };
  for (int e = 0; e < reg.base_entries; ++e) {
    const size_t i = static_cast<size_t>(e);
    if (offset_[i] < 0) {
      rows_[i] = &source;
      continue;
    }
    const int64_t n = reg.layout.entry(e).numel;
    const bool merge = reg.lora_a[i] >= 0;
    const bool half = bf16 && reg.layout.entry(e).shape.size() == 2;
    if (!half) {
      float* dst = buffer_.data() + offset_[i];
      if (merge)
        MergeLora(reg, source, e, dst);
      else
        source.ReadAll(e, dst);
      f32_[i] = dst;
    } else if (merge) {
      MergeLora(reg, source, e, tmp.data());
      to_bf16(tmp.data(), half_.data() + offset_[i], n);
      bf16_[i] = half_.data() + offset_[i];
    } else {
      for (int64_t j = 0; j < n; j += kFillChunk) {
        const int64_t c = std::min(kFillChunk, n - j);
        source.Read(e, j, c, tmp.data());
        to_bf16(tmp.data(), half_.data() + offset_[i] + j, c);
      }
      bf16_[i] = half_.data() + offset_[i];
    }
    source.Release(e);
  }
}

double DecodeFlopsPerToken(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t context) {
  double n = 0;
  for (int e = 0; e < reg.base_entries; ++e)
    if (reg.IsMatmul(e)) n += static_cast<double>(reg.layout.entry(e).numel);
  double attn = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const int64_t keys = cfg.layer_types[i] == LayerType::kSliding
                             ? std::min(context + 1, cfg.sliding_window)
                             : context + 1;
    attn += 4.0 * static_cast<double>(cfg.num_attention_heads * cfg.HeadDim(i) * keys);
  }
  return 2.0 * n + attn;
}

namespace {
// The most query heads sharing one kv head in any layer (DecodeAttention's scores per task).
int64_t MaxQueryGroup(const Gemma4Config& cfg) {
  int64_t g = 1;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    g = std::max(g, cfg.num_attention_heads / cfg.KvHeads(i));
  return g;
}
}  // namespace

double Gemma4Decoder::Bytes(const Gemma4Config& cfg, int64_t capacity, int64_t chunk,
                            int64_t batch) {
  double n = 0;
  chunk = std::min(chunk, capacity);
  int64_t widest = 0, Dmax = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const int64_t D = cfg.HeadDim(i);
    widest = std::max(widest, cfg.MlpWidth(i));
    Dmax = std::max(Dmax, D);
    if (cfg.IsKvShared(i)) continue;
    const int64_t slots = cfg.layer_types[i] == LayerType::kSliding
                              ? std::min(capacity, cfg.sliding_window + chunk)
                              : capacity;
    n += 2.0 * static_cast<double>(batch * slots * cfg.KvHeads(i) * D);
  }
  const int64_t rows = std::max(chunk, batch);
  const int64_t H = cfg.num_attention_heads, d = cfg.hidden_size;
  const int64_t LP = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input;
  n += 2.0 * static_cast<double>(capacity) * static_cast<double>(Dmax);  // RoPE tables
  n += static_cast<double>(rows) *
       static_cast<double>(3 * d + 4 * H * Dmax + 2 * widest + 3 * LP + d + H + 8);
  if (batch > 1) n += static_cast<double>(batch * cfg.vocab_size);  // a step's logits
  n += static_cast<double>(omp_get_max_threads() * MaxQueryGroup(cfg)) *
       static_cast<double>(capacity);  // attention scores
  n += static_cast<double>(cpu::Bf16ScratchFloats(std::max({d, H * Dmax, widest})));
  return n * sizeof(float);
}

Gemma4Decoder::Gemma4Decoder(const Gemma4Config& cfg, const ParamRegistry& reg,
                             const DecodeWeights& weights, int64_t capacity, int64_t chunk,
                             Precision precision, int64_t batch)
    : cfg_(cfg),
      reg_(reg),
      w_(weights),
      capacity_(capacity),
      chunk_(std::min(chunk, capacity)),
      rows_(std::max(chunk_, batch)),
      lengths_(static_cast<size_t>(batch), 0),
      precision_(precision) {
  ST_CHECK(capacity >= 1 && chunk >= 1 && batch >= 1)
      << "decoder capacity, chunk and batch must be positive";
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_attention_heads, d = cfg_.hidden_size;
  const int64_t P = cfg_.hidden_size_per_layer_input;
  slots_.assign(L, 0);
  k_off_.assign(L, -1);
  v_off_.assign(L, -1);
  int64_t total = 0, Dmax = 0, widest = 0, Ds = 0, Df = 0;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t D = cfg_.HeadDim(i);
    Dmax = std::max(Dmax, D);
    widest = std::max(widest, cfg_.MlpWidth(i));
    (cfg_.layer_types[i] == LayerType::kFull ? Df : Ds) = D;
    if (cfg_.IsKvShared(i)) continue;
    slots_[i] = cfg_.layer_types[i] == LayerType::kSliding
                    ? std::min(capacity_, cfg_.sliding_window + chunk_)
                    : capacity_;
    const int64_t n = batch * slots_[i] * cfg_.KvHeads(i) * D;
    k_off_[i] = total;
    v_off_[i] = total + n;
    total += 2 * n;
  }
  for (int64_t i = 0; i < L; ++i)
    if (cfg_.IsKvShared(i)) slots_[i] = slots_[cfg_.KvSourceLayer(i)];
  cache_ = AlignedBuffer(std::max<int64_t>(total, 1));
  if (Ds) RopeTable(cfg_.rope_sliding, Ds, capacity_, &cos_s_, &sin_s_);
  if (Df) RopeTable(cfg_.rope_full, Df, capacity_, &cos_f_, &sin_f_);
  const size_t c = static_cast<size_t>(rows_);
  x_.resize(c * d);
  h_.resize(c * d);
  a_.resize(c * std::max(d, H * Dmax));
  q_.resize(c * H * Dmax);
  k_.resize(c * H * Dmax);
  v_.resize(c * H * Dmax);
  o_.resize(c * H * Dmax);
  gate_.resize(c * widest);
  up_.resize(c * widest);
  ple_.resize(c * L * P);
  proj_.resize(c * L * P);
  ple_tok_.resize(c * L * P);
  rstd_.resize(c * std::max(L, H));
  pg_.resize(c * std::max<int64_t>(P, 1));
  scores_.resize(static_cast<size_t>(omp_get_max_threads() * MaxQueryGroup(cfg_) * capacity_));
  kv_rows_.resize(static_cast<size_t>(2 * rows_));
  if (w_.storage() == DType::kBF16)
    widen_.resize(static_cast<size_t>(
        cpu::Bf16ScratchFloats(std::max({d, H * Dmax, widest, std::max<int64_t>(P, 1)}))));
  if (precision_ == Precision::kBf16 && w_.storage() == DType::kBF16)
    x16_.resize(c * static_cast<size_t>(std::max({d, H * Dmax, widest, L * P})));
  pos_.resize(c);
  seq_.resize(c);
}

float* Gemma4Decoder::Keys(int64_t i, int64_t b) {
  const int64_t src = cfg_.KvSourceLayer(i);
  return cache_.data() + k_off_[src] + b * slots_[src] * cfg_.KvHeads(src) * cfg_.HeadDim(src);
}

float* Gemma4Decoder::Values(int64_t i, int64_t b) {
  const int64_t src = cfg_.KvSourceLayer(i);
  return cache_.data() + v_off_[src] + b * slots_[src] * cfg_.KvHeads(src) * cfg_.HeadDim(src);
}

Status Gemma4Decoder::Check(int64_t seq, int64_t n, std::span<const int32_t> ids) const {
  ST_CHECK(seq >= 0 && seq < batch()) << "sequence " << seq << " of a decoder of " << batch();
  const int64_t length = lengths_[static_cast<size_t>(seq)];
  if (length + n > capacity_)
    return ResourceExhausted(StrCat("the sequence would hold ", length + n,
                                    " tokens, more than the decoder's capacity of ", capacity_,
                                    "; raise --max-seq-len or start a new conversation"));
  for (int32_t id : ids)
    if (id < 0 || id >= cfg_.vocab_size)
      return InvalidArgument(
          StrCat("token id ", id, " is outside the model's vocabulary of ", cfg_.vocab_size));
  return Status::Ok();
}

void Gemma4Decoder::Fork(int64_t from, int64_t to) {
  ST_CHECK(from >= 0 && from < batch() && to >= 0 && to < batch()) << "Fork out of range";
  if (from == to) return;
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    if (cfg_.IsKvShared(i)) continue;
    const size_t bytes =
        static_cast<size_t>(slots_[i] * cfg_.KvHeads(i) * cfg_.HeadDim(i)) * sizeof(float);
    std::memcpy(Keys(i, to), Keys(i, from), bytes);
    std::memcpy(Values(i, to), Values(i, from), bytes);
  }
  lengths_[static_cast<size_t>(to)] = lengths_[static_cast<size_t>(from)];
}

Status Gemma4Decoder::Append(int64_t seq, std::span<const int32_t> ids, float* logits) {
  return Append(seq, ids, logits, SoftTokens{});
}

Status Gemma4Decoder::Append(int64_t seq, std::span<const int32_t> ids, float* logits,
                             const SoftTokens& soft) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) return InvalidArgument("nothing to feed: no token ids");
  // Soft-token positions read the pad token's rows (transformers' Gemma4Model), then their own.
  std::vector<int32_t> mapped;
  std::span<const int32_t> table_ids = ids;
  if (soft.count > 0) {
    mapped.assign(ids.begin(), ids.end());
    int64_t found = 0;
    for (int32_t& id : mapped)
      if (id == soft.id) id = static_cast<int32_t>(cfg_.pad_token_id), ++found;
    if (found != soft.count)
      return InvalidArgument(
          StrCat(found, " image token positions for ", soft.count, " soft tokens"));
    table_ids = mapped;
  }
  ST_RETURN_IF_ERROR(Check(seq, n, table_ids));
  int64_t& length = lengths_[static_cast<size_t>(seq)];
  SoftTokens rest = soft;
  for (int64_t s = 0; s < n; s += chunk_) {
    const int64_t m = std::min(chunk_, n - s);
    for (int64_t t = 0; t < m; ++t) {
      pos_[static_cast<size_t>(t)] = static_cast<int32_t>(length + t);
      seq_[static_cast<size_t>(t)] = seq;
    }
    Rows(table_ids.data() + s, m, s + m == n ? logits : nullptr, false, ids.data() + s,
         rest.count > 0 ? &rest : nullptr);
    length += m;
  }
  return Status::Ok();
}

Status Gemma4Decoder::Step(std::span<const int64_t> seqs, std::span<const int32_t> ids,
                           float* logits) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  ST_CHECK(n == static_cast<int64_t>(ids.size()) && n <= batch()) << "Step: " << n << " tokens";
  if (n == 0) return Status::Ok();
  for (int64_t j = 0; j < n; ++j) {
    ST_RETURN_IF_ERROR(
        Check(seqs[static_cast<size_t>(j)], 1, ids.subspan(static_cast<size_t>(j), 1)));
    for (int64_t k = 0; k < j; ++k)
      ST_CHECK(seqs[static_cast<size_t>(k)] != seqs[static_cast<size_t>(j)])
          << "Step: sequence " << seqs[static_cast<size_t>(j)] << " twice";
  }
  for (int64_t j = 0; j < n; ++j) {
    seq_[static_cast<size_t>(j)] = seqs[static_cast<size_t>(j)];
    pos_[static_cast<size_t>(j)] = static_cast<int32_t>(length(seqs[static_cast<size_t>(j)]));
  }
  Rows(ids.data(), n, logits, true);
  for (int64_t b : seqs) ++lengths_[static_cast<size_t>(b)];
  return Status::Ok();
}

void Gemma4Decoder::Rows(const int32_t* ids, int64_t n, float* logits, bool all_logits,
                         const int32_t* raw_ids, SoftTokens* soft) {
  const int64_t d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t P = cfg_.hidden_size_per_layer_input;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float sd = std::sqrt(static_cast<float>(d));
  if (const float* e = w_.f32(reg_.embed_tokens)) {
    cpu::EmbeddingForward(ids, e, x_.data(), n, d, sd);
  } else if (const uint8_t* q = w_.blocks(reg_.embed_tokens)) {
    const GgmlType type = w_.block_type(reg_.embed_tokens);
    const size_t row_bytes = GgmlRowBytes(type, d);
    for (int64_t t = 0; t < n; ++t) {
      float* row = x_.data() + t * d;
      DequantizeRow(type, q + static_cast<size_t>(ids[t]) * row_bytes, d, row);
      for (int64_t c = 0; c < d; ++c) row[c] *= sd;
    }
  } else {
    const uint16_t* e16 = w_.bf16(reg_.embed_tokens);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < d; ++c)
        x_[static_cast<size_t>(t * d + c)] = BF16ToFloat(e16[int64_t{ids[t]} * d + c]) * sd;
  }
  if (soft != nullptr)  // consumes the rows it places (the next chunk goes on from there)
    for (int64_t t = 0; t < n && soft->count > 0; ++t)
      if (raw_ids[t] == soft->id) {
        std::memcpy(x_.data() + t * d, soft->rows, static_cast<size_t>(d) * sizeof(float));
        soft->rows += d;
        --soft->count;
      }
  if (P > 0) {
    // ple[l] = (norm(x0 Wplmp^T / sqrt(d)) + Epl[ids] * sqrt(P)) / sqrt(2), stored [L, n, P].
    float* proj = proj_.data();   // [n, L*P]
    float* tk = ple_tok_.data();  // [n, L*P]
    Linear(reg_.per_layer_model_projection, x_.data(), proj, n, d, L * P, 1.0f / sd);
    cpu::RmsNormForward(proj, w_.f32(reg_.per_layer_projection_norm), proj, rstd_.data(), n * L, P,
                        eps);
    const int ple_table = reg_.embed_tokens_per_layer;
    const float sp = std::sqrt(static_cast<float>(P));
    w_.rows(ple_table)->GatherRows(ple_table, ids, n, sp, tk);
    const float s = static_cast<float>(std::pow(2.0, -0.5));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t p = 0; p < P; ++p)
          ple_[(l * n + t) * P + p] = (proj[(t * L + l) * P + p] + tk[(t * L + l) * P + p]) * s;
  }
  for (int64_t i = 0; i < L; ++i) Layer(i, n);
  if (logits == nullptr) return;
  const int64_t first = all_logits ? 0 : n - 1, m = n - first;
  cpu::RmsNormForward(x_.data() + first * d, w_.f32(reg_.norm), h_.data(), rstd_.data(), m, d, eps);
  Head(h_.data(), logits, m);
}

void Gemma4Decoder::Layer(int64_t i, int64_t n) {
  const LayerParams& lp = reg_.layers[i];
  const int64_t d = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.HeadDim(i);
  const int64_t Hkv = cfg_.KvHeads(i), P = cfg_.hidden_size_per_layer_input;
  const int64_t F = cfg_.MlpWidth(i);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bool full = cfg_.layer_types[i] == LayerType::kFull;
  const float* cos_t = full ? cos_f_.data() : cos_s_.data();
  const float* sin_t = full ? sin_f_.data() : sin_s_.data();
  auto W = [&](int idx) { return w_.f32(idx); };
  float* rstd = rstd_.data();
  float* x = x_.data();
  float* h = h_.data();

  cpu::RmsNormForward(x, W(lp.input_layernorm), h, rstd, n, d, eps);
  Linear(lp.q_proj, h, q_.data(), n, d, H * D);
  cpu::RmsNormForward(q_.data(), W(lp.q_norm), q_.data(), rstd, n * H, D, eps);
  cpu::Rope(q_.data(), cos_t, sin_t, pos_.data(), 1, n, H, D, false);
  if (!cfg_.IsKvShared(i)) {
    float* k = k_.data();
    float* v = v_.data();
    Linear(lp.k_proj, h, k, n, d, Hkv * D);
    cpu::RmsNormForward(k, W(lp.k_norm), k, rstd, n * Hkv, D, eps);
    cpu::Rope(k, cos_t, sin_t, pos_.data(), 1, n, Hkv, D, false);
    Linear(lp.v_proj, h, v, n, d, Hkv * D);
    cpu::RmsNormForward(v, nullptr, v, rstd, n * Hkv, D, eps);
    const size_t row = static_cast<size_t>(Hkv * D);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = pos_[static_cast<size_t>(t)] % slots_[i];
      const int64_t b = seq_[static_cast<size_t>(t)];
      std::memcpy(Keys(i, b) + slot * Hkv * D, k + t * Hkv * D, row * sizeof(float));
      std::memcpy(Values(i, b) + slot * Hkv * D, v + t * Hkv * D, row * sizeof(float));
    }
  }
  Attend(i, q_.data(), o_.data(), n);
  float* a = a_.data();
  Linear(lp.o_proj, o_.data(), a, n, H * D, d);
  cpu::RmsNormForward(a, W(lp.post_attention_layernorm), a, rstd, n, d, eps);
  cpu::Add(x, a, n * d);

  cpu::RmsNormForward(x, W(lp.pre_feedforward_layernorm), h, rstd, n, d, eps);
  Linear(lp.gate_proj, h, gate_.data(), n, d, F);
  Linear(lp.up_proj, h, up_.data(), n, d, F);
  cpu::GeluMulForward(gate_.data(), up_.data(), gate_.data(), n * F);
  Linear(lp.down_proj, gate_.data(), a, n, F, d);
  cpu::RmsNormForward(a, W(lp.post_feedforward_layernorm), a, rstd, n, d, eps);
  cpu::Add(x, a, n * d);

  if (P > 0) {
    Linear(lp.per_layer_input_gate, x, pg_.data(), n, d, P);
    cpu::GeluMulForward(pg_.data(), ple_.data() + i * n * P, pg_.data(), n * P);
    Linear(lp.per_layer_projection, pg_.data(), a, n, P, d);
    cpu::RmsNormForward(a, W(lp.post_per_layer_input_norm), a, rstd, n, d, eps);
    cpu::Add(x, a, n * d);
  }
  cpu::Scale(x, W(lp.layer_scalar)[0], n * d);
}

void Gemma4Decoder::Attend(int64_t i, const float* q, float* o, int64_t n) {
  const int64_t src = cfg_.KvSourceLayer(i);
  const int64_t window = cfg_.layer_types[i] == LayerType::kSliding ? cfg_.sliding_window : 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t b = seq_[static_cast<size_t>(t)];
    kv_rows_[static_cast<size_t>(t)] = Keys(i, b);
    kv_rows_[static_cast<size_t>(rows_ + t)] = Values(i, b);
  }
  cpu::DecodeAttention(q, o, n, cfg_.num_attention_heads, cfg_.KvHeads(i), cfg_.HeadDim(i),
                       kv_rows_.data(), kv_rows_.data() + rows_, pos_.data(), slots_[src], window,
                       capacity_, scores_.data());
}

void Gemma4Decoder::Linear(int e, const float* x, float* y, int64_t n, int64_t in, int64_t out,
                           float alpha) {
  if (const uint8_t* q = w_.blocks(e)) {  // each weight row read once for every row of x
    cpu::LinearForwardBlocksInt8(w_.block_type(e), x, q, y, n, in, out);
    if (alpha != 1.0f) cpu::Scale(y, alpha, n * out);
    return;
  }
  if (n > 1 && n <= cpu::kFewRows && (w_.f32(e) || !w_.rows(e))) {
    // A batched step (or a short chunk): each weight row read once for the n rows; under bf16
    // precision x is rounded to bf16 as for a prompt chunk's product, and the products are bf16
    // dot products (VDPBF16PS), which halve the widening kernel's instructions.
    if (const float* w = w_.f32(e)) {
      cpu::LinearForwardFew(x, w, y, n, in, out);
    } else if (precision_ == Precision::kBf16) {
      cpu::RoundToBf16(x, n, in, in, x16_.data());
      cpu::LinearForwardFewBf16(x16_.data(), w_.bf16(e), y, n, in, out);
    } else {
      cpu::LinearForwardFew(x, w_.bf16(e), y, n, in, out);
    }
    if (alpha != 1.0f) cpu::Scale(y, alpha, n * out);
    return;
  }
  if (precision_ == Precision::kBf16 && n > 1) {  // a prompt chunk: one bf16 product
    if (const uint16_t* w16 = w_.bf16(e)) {
      cpu::RoundToBf16(x, n, in, in, x16_.data());
      cpu::GemmBf16(cpu::Trans::kNo, cpu::Trans::kYes, n, out, in, alpha, x16_.data(), in, w16, in,
                    0.0f, y, out);
    } else {
      cpu::LinearForwardMixed(x, w_.f32(e), y, n, in, out, alpha, false);
    }
    return;
  }
  if (const float* w = w_.f32(e)) {
    cpu::LinearForward(x, w, y, n, in, out, alpha, false);
    return;
  }
  cpu::LinearForwardBf16(x, w_.bf16(e), y, n, in, out, widen_.data());
  if (alpha != 1.0f) cpu::Scale(y, alpha, n * out);
}

void Gemma4Decoder::Head(const float* h, float* logits, int64_t n) {
  Linear(reg_.embed_tokens, h, logits, n, cfg_.hidden_size, cfg_.vocab_size);
  cpu::SoftcapForward(logits, n * cfg_.vocab_size,
                      static_cast<float>(cfg_.final_logit_softcapping));
}

}  // namespace st
