// Autoregressive decoding of a Gemma 4 text decoder with a key/value cache: the path `generate`,
// `chat` and finetune's --sample-prompts run. It shares the training engine's kernels (the same
// Linear, RMSNorm, RoPE and GELU code), not its arena: the engine plans activations for a whole
// [B, T] batch and a backward; a decoder holds, per layer that computes K/V, the keys and values
// of every token fed so far and scratch for one chunk of new tokens.
//
// The cache follows the model's layer kinds as transformers' DynamicCache + sliding layers do:
// - a full-attention layer keeps every position (up to the capacity);
// - a sliding layer keeps a ring of its window plus one chunk (a query sees the window before it,
//   and a chunk of queries writes its own keys first), so its memory does not grow with the
//   sequence;
// - a KV-shared layer (the last num_kv_shared_layers) computes no K/V and reads those of the last
//   earlier layer of its kind.
// Positions count from 0 at the first token fed after Reset(); RoPE uses them directly.
//
// One sequence (a conversation): decoding one token reads every weight once, so the speed is the
// memory bandwidth's; a prompt is fed in chunks of up to `chunk` tokens as matrix products.
// Several sequences (`batch`, online RL's rollouts): each has its own cache and length; Step
// feeds one new token of each of a set of them as one matrix product per weight (the weights are
// read once for the whole set), and Fork copies a prompt's cache to the sequences that continue
// it, so a group of completions of one prompt computes the prompt once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cpu/quant.h"
#include "model/config.h"
#include "model/gemma4.h"
#include "model/params.h"
#include "model/weights.h"

namespace st {

// Every tensor a decoder multiplies by, resident, with LoRA adapters merged into their Linear
// weights (W + s B A, PEFT's merge_and_unload); the per-layer embedding table (2.35 B of E2B's
// parameters, a lookup of one row per token) stays in the source and is read row by row.
// Matrices are kept in fp32 or in bf16 (`storage`): decoding one token reads every matrix once,
// so bf16 halves the bytes and about doubles the speed. A bf16 checkpoint's values are exactly
// representable, so bf16 storage then changes nothing (arithmetic stays fp32); vectors (norms,
// layer scalars) stay fp32. Block storage (`BlockStorage`, `generate --weights-dtype
// q8_0|q4_0|q4_k_m`) holds each matrix in one of ggml's block types (kernels/cpu/quant.h: Q8_0's
// 34 bytes per 32 weights, 1.9x fewer than bf16; Q4_0's 18, 3.6x; Q4_K's 144 per 256, 3.6x; Q6_K's
// 210 per 256, 2.4x) or in fp32, one type per matrix (llama-quantize's mixtures), quantized here
// from the source's values (adapters merged first); its products (cpu::LinearForwardBlocksInt8)
// round the activations to int8 blocks and take integer dot products, as llama.cpp does.
class DecodeWeights {
 public:
  struct BlockStorage {
    GgmlType type = GgmlType::kQ8_0;  // of every matrix, unless `types` is given
    // Per registry entry (base entries; vectors ignored): the matrix's type, a type with an int8
    // product (cpu::HasInt8BlockProduct) or kF32 (held in fp32, not quantized).
    std::vector<GgmlType> types;
    GgmlType of(int e) const { return types.empty() ? type : types[static_cast<size_t>(e)]; }
  };
  // reg: the model's registry (adapters included, if any); source: its weights.
  DecodeWeights(const ParamRegistry& reg, const WeightSource& source, DType storage = DType::kF32);
  DecodeWeights(const ParamRegistry& reg, const WeightSource& source, const BlockStorage& blocks);
  // The same registry's weights again, from `source` (fp32 or bf16 storage), into the memory
  // this already holds: GRPO refills one DecodeWeights a round instead of allocating (and
  // faulting in) a fresh copy of the model.
  void Refill(const ParamRegistry& reg, const WeightSource& source);
  // The storage `generate` picks: bf16 when the source stores bf16 and no adapter is merged (its
  // small update would be rounded away), else fp32.
  static DType DefaultStorage(const ParamRegistry& reg, const WeightSource& source);
  // Entry e in fp32 (vectors always; matrices with fp32 storage), else null.
  const float* f32(int e) const { return f32_[static_cast<size_t>(e)]; }
  // Matrix e in bf16 (bf16 storage), else null.
  const uint16_t* bf16(int e) const { return bf16_[static_cast<size_t>(e)]; }
  // Matrix e as blocks of block_type(e), row after row (block storage), else null.
  const uint8_t* blocks(int e) const { return q_.empty() ? nullptr : q_[static_cast<size_t>(e)]; }
  bool quantized() const { return !q_.empty(); }
  GgmlType block_type(int e) const { return block_types_[static_cast<size_t>(e)]; }
  // Where the rows of a lookup-only table come from (the per-layer embeddings), else null.
  const WeightSource* rows(int e) const { return rows_[static_cast<size_t>(e)]; }
  DType storage() const { return storage_; }
  size_t ResidentBytes() const {
    return static_cast<size_t>(buffer_.size()) * sizeof(float) + half_.size() * sizeof(uint16_t) +
           blocks_.size();
  }
  // The bytes the constructor will hold for this registry (for a check before loading).
  static double Bytes(const ParamRegistry& reg, DType storage = DType::kF32);
  static double Bytes(const ParamRegistry& reg, const BlockStorage& blocks);

 private:
  void Fill(const ParamRegistry& reg, const WeightSource& source);

  DType storage_;
  std::vector<int64_t> offset_;  // per entry: where it lies in buffer_ or half_ (-1: rows only)
  int64_t scratch_ = 0;          // fp32 values converted to bf16 at a time
  AlignedBuffer buffer_;
  std::vector<uint16_t> half_;
  std::vector<const float*> f32_;
  std::vector<const uint16_t*> bf16_;
  std::vector<uint8_t> blocks_;
  std::vector<const uint8_t*> q_;
  std::vector<GgmlType> block_types_;
  std::vector<const WeightSource*> rows_;
};

// FLOPs of decoding one token with `context` tokens before it: 2 x the base model's matrix-product
// parameters (the tied head once, adapters merged, lookups excluded) plus the attention products
// over the visible keys (window-limited in sliding layers).
double DecodeFlopsPerToken(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t context);

// Soft tokens to feed (a vision tower's output, Batch::soft_tokens' counterpart): `rows`
// [count, d] stand in, in order, for the fed positions whose id is `id`.
struct SoftTokens {
  const float* rows = nullptr;
  int64_t count = 0;
  int32_t id = -1;
};

class Gemma4Decoder {
 public:
  // capacity: the most tokens one sequence may hold (prompt and generated); chunk: the most new
  // tokens one Append computes at once (longer inputs are split). `reg` and `weights` must
  // outlive the decoder.
  // precision: of the prompt's matrix products (chunks of several tokens); bf16 rounds the
  // activations to bf16 and multiplies bf16 weights as stored (oneDNN, no widening). One-token
  // steps read each weight once and stay the matrix-vector kernel in either precision.
  // batch: the sequences the decoder holds (each `capacity` tokens at most).
  Gemma4Decoder(const Gemma4Config& cfg, const ParamRegistry& reg, const DecodeWeights& weights,
                int64_t capacity, int64_t chunk = 128, Precision precision = Precision::kFp32,
                int64_t batch = 1);

  // Forgets every token of every sequence (new sequences).
  void Reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }
  // Forgets sequence `seq`'s tokens.
  void Reset(int64_t seq) { lengths_[static_cast<size_t>(seq)] = 0; }
  // Tokens in the cache (of sequence 0; of `seq`).
  int64_t length() const { return lengths_[0]; }
  int64_t length(int64_t seq) const { return lengths_[static_cast<size_t>(seq)]; }
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }
  const Gemma4Config& config() const { return cfg_; }

  // Feeds `ids` after sequence 0's (or `seq`'s) cached tokens and, when logits is not null,
  // writes the softcapped logits [V] that follow the last of them. ResourceExhausted when the
  // sequence would exceed the capacity (nothing is fed then); InvalidArgument for an id outside
  // the vocabulary.
  Status Append(std::span<const int32_t> ids, float* logits) { return Append(0, ids, logits); }
  Status Append(int64_t seq, std::span<const int32_t> ids, float* logits);
  // The same with soft tokens for the positions of `ids` that hold soft.id (exactly as many).
  Status Append(int64_t seq, std::span<const int32_t> ids, float* logits, const SoftTokens& soft);
  // Feeds ids[j] after sequence seqs[j]'s tokens, for every j at once (distinct sequences, at
  // most `batch`), and writes the logits that follow each into logits [seqs.size(), V]. Errors
  // as Append's (nothing is fed then).
  Status Step(std::span<const int64_t> seqs, std::span<const int32_t> ids, float* logits);
  // Sequence `to` becomes a copy of sequence `from` (its cache and length).
  void Fork(int64_t from, int64_t to);

  // Bytes of the cache and scratch for (cfg, capacity, chunk, batch).
  static double Bytes(const Gemma4Config& cfg, int64_t capacity, int64_t chunk = 128,
                      int64_t batch = 1);

 private:
  Status Check(int64_t seq, int64_t n, std::span<const int32_t> ids) const;
  // Computes the n rows set in seq_/pos_ (their tokens `ids`) through every layer; writes the
  // logits after the last row (all_logits false) or after every row ([n, V]) when logits is set.
  // soft (optional): rows replacing the embeddings of the rows whose raw id is soft->id, in
  // order (ids then hold the pad id there).
  void Rows(const int32_t* ids, int64_t n, float* logits, bool all_logits,
            const int32_t* raw_ids = nullptr, SoftTokens* soft = nullptr);
  void Layer(int64_t i, int64_t n);
  // The n new queries [n, H, D] of layer i against their sequences' caches (window and
  // causality), into o.
  void Attend(int64_t i, const float* q, float* o, int64_t n);
  // Layer i's keys (values) of sequence b: [slots, Hkv, D].
  float* Keys(int64_t i, int64_t b);
  float* Values(int64_t i, int64_t b);
  void Head(const float* h, float* logits, int64_t n);
  // y [n, out] = alpha * x [n, in] W_e^T, in the weights' storage.
  void Linear(int e, const float* x, float* y, int64_t n, int64_t in, int64_t out,
              float alpha = 1.0f);

  Gemma4Config cfg_;
  const ParamRegistry& reg_;
  const DecodeWeights& w_;
  int64_t capacity_, chunk_, rows_;  // rows_: the most rows one pass computes (chunk, batch)
  std::vector<int64_t> lengths_;     // per sequence
  // Per layer: ring slots of its cache (its own, or its source's for a shared layer) and where
  // the layer's K and V live in cache_ ([batch, slots, Hkv, D] each); -1 for a shared layer.
  std::vector<int64_t> slots_, k_off_, v_off_;
  AlignedBuffer cache_;
  // RoPE tables [capacity, D/2] per layer kind.
  std::vector<float> cos_s_, sin_s_, cos_f_, sin_f_;
  // Scratch for one pass of n <= rows_ tokens.
  std::vector<float> x_, h_, q_, k_, v_, o_, a_, gate_, up_, pg_, rstd_;
  std::vector<float> ple_, proj_, ple_tok_;  // per-layer inputs [L, n, P]; [n, L*P] twice
  std::vector<float> scores_;  // [threads, max query heads per kv head, capacity] attention scores
  std::vector<const float*> kv_rows_;  // a pass's rows' key caches, then their value caches
  std::vector<float> widen_;           // [kBf16Rows, widest input] bf16 rows widened
  Precision precision_;
  std::vector<uint16_t> x16_;  // bf16 prefill: a pass's input rounded [n, widest input]
  std::vector<int32_t> pos_;   // per row of a pass: its position and its sequence
  std::vector<int64_t> seq_;
};

}  // namespace st
