// Single-device Gemma 4 text decoder (+ tied LM head, final softcap, causal-LM loss): forward and
// backward in fp32 over caller-owned parameter and gradient arenas laid out by ParamRegistry.
// It knows nothing about ranks: FSDP fills the parameter arena (or parts of it) before calling.
// Every activation lives in one arena planned for (max_batch, max_seq) at construction: a step
// allocates nothing. Math follows transformers' modeling_gemma4.py (see
// shared/reference/gemma4.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/attn_mask.h"
#include "model/config.h"
#include "model/glossary.h"
#include "model/lora.h"
#include "model/params.h"

namespace st {

class WeightSource;

enum class Backend { kRef, kCpu };

struct Batch {
  const int32_t* input_ids = nullptr;       // [B,T]
  const uint8_t* attention_mask = nullptr;  // [B,T], 1 = real token; null = no padding
  const int32_t* labels = nullptr;          // [B,T], -100 = ignored; null = no loss
  int64_t B = 0, T = 0;
  // [B,T] or null (= 0..T-1 in every row). Several examples packed into one row: each restarts at
  // 0 and counts up by one, and the engine masks attention by document (data/packing.h): every
  // token attends only to the earlier tokens of its own example, and RoPE sees its position in
  // the example, so each example computes what it would alone.
  const int32_t* position_ids = nullptr;
  // [B,T] or null (= 1 everywhere): the weight of label[b,t]'s term in the sum Backward
  // differentiates. An objective other than the mean token loss (train/objectives/) sets it from
  // the forward's TargetLogProbs before the backward runs; the buffer is read by Backward only.
  const float* loss_weights = nullptr;
  // Soft tokens (a vision tower's output, model/vision/): [num_soft_tokens, d] rows that stand in,
  // in order, for the positions whose input id is `soft_token_id` (Gemma 4's image token), as
  // transformers' Gemma4Model places them: such a position embeds as its row (not E[id] sqrt(d)),
  // its per-layer token part is the pad token's and its PLE projection reads the row; the pad
  // row of either table gets no gradient from it. The id may lie outside the vocabulary.
  const float* soft_tokens = nullptr;
  int64_t num_soft_tokens = 0;
  int32_t soft_token_id = -1;
  // [num_soft_tokens, d] or null: where Backward writes d(loss)/d(soft tokens), for a tower that
  // trains (overwritten, not accumulated).
  float* soft_tokens_grad = nullptr;
};

struct ForwardResult {
  double loss_sum = 0;    // sum of per-token losses over valid targets
  int64_t num_valid = 0;  // targets != -100 after the causal shift
  double Loss() const { return num_valid ? loss_sum / static_cast<double>(num_valid) : 0.0; }
};

// Where each registry entry's parameter and gradient live for one call. A plain run points every
// entry into one arena each; FSDP points them into its gathered unit buffers.
struct ParamTable {
  std::vector<const float*> param;  // [registry entries]
  std::vector<float*> grad;         // [registry entries]; null = no gradient (frozen or buffer)
  // [registry entries] or empty: for an embedding table whose param is null, where its rows come
  // from (a frozen table left in the memory-mapped checkpoint; see FrozenWeights).
  std::vector<const WeightSource*> rows;

  // Views into a parameter arena and a gradient arena (grads may be null: forward only).
  // trainable null = every entry except buffers.
  static ParamTable FromArenas(const ParamRegistry& reg, const float* params, float* grads,
                               const std::vector<bool>* trainable = nullptr);
};

// Called by the engine around the parts of the model that FSDP gathers as units: a whole decoder
// layer (kLayer) and its MLP (kMlp, nested inside kLayer). Before* must leave the part's entries of
// the ParamTable pointing at valid values (and, in the backward, its gradient entries at buffers to
// accumulate into); After* may release them (AfterBackward: the part's gradients are final).
class ParamHooks {
 public:
  enum class Part { kLayer, kMlp };
  virtual ~ParamHooks() = default;
  virtual void BeforeForward(int64_t /*layer*/, Part /*part*/) {}
  virtual void AfterForward(int64_t /*layer*/, Part /*part*/) {}
  virtual void BeforeBackward(int64_t /*layer*/, Part /*part*/) {}
  virtual void AfterBackward(int64_t /*layer*/, Part /*part*/) {}
};

// What the backward recomputes instead of keeping (--activation-checkpointing): kNone keeps every
// layer's activations; kMlp keeps all but each MLP's three [N, F] intermediates (gate, up and
// their product), recomputed from the MLP's input when its backward starts; kLayer keeps only each
// layer's input (and the K/V that later layers share) and reruns the whole layer forward before
// its backward. The recompute runs the same kernels on the same inputs, so the gradients are bit
// for bit those of kNone.
enum class ActivationCheckpointing { kNone, kMlp, kLayer };
StatusOr<ActivationCheckpointing> ParseActivationCheckpointing(const std::string& name);
const char* ActivationCheckpointingName(ActivationCheckpointing c);

// What an engine is planned for beyond its shape.
struct EngineOptions {
  Backend backend = Backend::kCpu;
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  bool training = true;  // false: forward only (evaluate); one layer's activations at a time
  // The loss from the whole [B*T, V] logits and the backend's plain cross-entropy kernels instead
  // of tiles: the oracle tests compare the tiled head with (always so for Backend::kRef).
  bool whole_logits = false;
  // The operands of every Linear product (projections, MLP, PLE, the LM head's tiles, LoRA's A
  // and B), forward and backward: kBf16 rounds them to bf16 and accumulates in fp32. Norms, RoPE,
  // attention, softmax, the loss and the residual stream are fp32 in both.
  Precision precision = Precision::kFp32;
  // LoRA adapters on the Linear weights (model/lora.h): the engine's registry is the base
  // registry plus these, and every adapted Linear adds s * dropout(x) A^T B^T to its output.
  LoraSpec lora;
};

// The language-model head and its loss work in tiles of kHeadRows target rows x kHeadBlock
// vocabulary entries (with the final softcap and an online log-sum-exp per row): no [B*T, V]
// logits buffer exists, in training or evaluation. A frozen embed_tokens (FrozenWeights) is read
// from the source one vocabulary block at a time.
constexpr int64_t kHeadBlock = 4096;
constexpr int64_t kHeadRows = 2048;
// A training engine whose [B*T, V] logits take at most this much keeps the forward's (one tile of
// every row) and the backward skips the head's recomputation: small vocabularies lose no speed.
constexpr double kHeadCacheBytes = 64.0 * (1 << 20);

// The bytes an engine planned for (cfg, max_batch, max_seq, options) holds: its activation arena,
// the attention kernels' per-thread workspace (`threads` of them), RoPE tables and the loss's
// per-row state; the frozen head's weight block is not included (FrozenHeadBytes). Floating point,
// so that absurd sizes cannot overflow.
double EstimateActivationBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                               const EngineOptions& options = {}, int threads = 1);
// The part of that estimate that is workspace rather than activations: the head's logits tile,
// the attention kernels' scratch, RoPE tables, per-token indices.
double EstimateWorkspaceBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                              const EngineOptions& options = {}, int threads = 1);
// The fp32 block of a frozen tied head the engine converts into (kHeadBlock rows of width d).
double FrozenHeadBytes(const Gemma4Config& cfg);
// InvalidArgument when that estimate exceeds the machine's physical memory: a flag such as
// --max-seq-len 2000000000 is then a message instead of an allocation failure in the engine.
Status CheckActivationMemory(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                             const EngineOptions& options = {});

// Where each activation lives in the engine's arena (indices into `layout`). Layers whose
// activations the plan does not keep (checkpointing, forward only) share one set sized for the
// largest layer; the K/V a later layer shares always has its own.
struct ActivationPlan {
  struct LayerActs {
    int h1, rstd_in, q_raw, rstd_q, q, k_raw = -1, rstd_k = -1, k = -1, v_raw = -1, rstd_v = -1,
                                       v = -1, lse, o, a, rstd_pa, x1, h2, rstd_pf, gate, up, hm, m,
                                       rstd_pff, x2, pg, g2, u, rstd_pp;
  };
  ArenaLayout layout;
  std::vector<int> resid;                  // L+1 residual stream snapshots [N,d]
  std::vector<LayerActs> layers;           // [L]
  int proj = -1, rstd_pln = -1, ple = -1;  // PLE: [N,L,P] projection, [N*L], [L,N,P]
  int hN = -1, rstd_f = -1;
  // The head's compacted target rows and their gradient [N,d], one tile of logits [rows, block],
  // and per row the running maximum (then log-sum-exp), running sum and target logit [N].
  int head_h = -1, head_dh = -1, head_y = -1, head_lse = -1, head_sum = -1, head_zt = -1;
  int head_ez = -1;     // per row: sum of exp(z - max) z, for the entropy (SetComputeEntropy)
  int head_cache = -1;  // [N, V] the forward's logits, when small (kHeadCacheBytes); = head_y
  // Backward scratch (shared by all layers).
  int dx = -1, dn = -1, dh = -1, dq = -1, dout = -1, df1 = -1, df2 = -1, dp1 = -1, dp2 = -1,
      dple = -1;
  // LoRA scratch: x A^T and its gradient [N, R]; the dropped-out input (training with dropout) or
  // the gradient of A's input [N, largest adapted input].
  int lora_t = -1, lora_dt = -1, lora_x = -1;
  std::vector<int> dk, dv;      // per layer: the K/V gradient accumulator it adds to
  std::vector<bool> kv_source;  // per layer: later layers read its K/V

  static ActivationPlan Build(const Gemma4Config& cfg, int64_t B, int64_t T,
                              const EngineOptions& options);
};

class Gemma4Engine {
  static EngineOptions OptionsOf(Backend backend) {
    EngineOptions o;
    o.backend = backend;
    return o;
  }

 public:
  Gemma4Engine(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
               const EngineOptions& options);
  Gemma4Engine(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
               Backend backend = Backend::kCpu)
      : Gemma4Engine(cfg, max_batch, max_seq, OptionsOf(backend)) {}

  const Gemma4Config& config() const { return cfg_; }
  const ParamRegistry& registry() const { return reg_; }
  int64_t max_batch() const { return max_B_; }
  int64_t max_seq() const { return max_T_; }
  const EngineOptions& options() const { return options_; }
  // Bytes of the activation arena (for memory reports).
  size_t ActivationBytes() const { return static_cast<size_t>(acts_.size()) * sizeof(float); }

  // The seed of the LoRA dropout masks of the next Forward/Backward pair: the mask of element j
  // of an adapted Linear's input is a hash of (seed, adapter, j), so the backward (and a
  // checkpointed recompute) sees the forward's mask without storing it. The trainer derives it
  // from the run's seed, the step and the rank.
  void SetDropoutSeed(uint64_t seed) { dropout_seed_ = seed; }
  // Off: the LoRA dropout is the identity (evaluation inside a training run); on by default.
  void SetDropout(bool on) { dropout_on_ = on; }
  // Off: every LoRA adapter is skipped, so the engine computes the base model (PEFT's
  // disable_adapter: DPO's reference model without a second copy). On by default.
  void SetAdapters(bool on) { adapters_on_ = on; }
  bool adapters_on() const { return adapters_on_; }
  // The loss, its gradient and TargetLogProbs over the softcapped logits divided by
  // `temperature` (TRL's GRPO computes the policy's log-probs at the sampling temperature); 1 by
  // default. Only the tiled head (not the whole-logits oracle) applies it.
  void SetLogitTemperature(float temperature) { inv_temperature_ = 1.0f / temperature; }
  // The forward also keeps each target row's entropy of the softmax (over the tempered logits):
  // TargetEntropies reads them (GRPO's `entropy` metric). Off by default.
  void SetComputeEntropy(bool on) { entropy_ = on; }

  // Runs the model up to the final norm and, with labels, the loss (the head in tiles: no logits
  // are kept). Only a training engine can run Backward after it.
  ForwardResult Forward(const ParamTable& table, const Batch& batch, ParamHooks* hooks = nullptr);
  // Accumulates d(grad_scale * loss_sum)/d(param) into every non-null table.grad entry (each
  // token's loss weighted by batch.loss_weights when set). Must follow Forward on the same batch.
  // For a mean loss pass grad_scale = 1 / num_valid (of all ranks' tokens).
  void Backward(const ParamTable& table, const Batch& batch, float grad_scale,
                ParamHooks* hooks = nullptr);

  // The same over one parameter arena and one gradient arena (registry layout); trainable null =
  // every entry but the buffers.
  ForwardResult Forward(const float* params, const Batch& batch);
  void Backward(const float* params, float* grads, const Batch& batch, float grad_scale,
                const std::vector<bool>* trainable = nullptr);

  // log p(labels[b,t] | tokens before t) of the last Forward, into out [B*T] aligned with the
  // labels (0 where the label is -100, and at t = 0): what DPO-style objectives sum per sequence.
  // Call it before that Forward's Backward (the whole-logits oracle turns its logits into
  // gradients in place).
  void TargetLogProbs(float* out) const;
  // The entropy of the predicted distribution at each label's position, aligned as
  // TargetLogProbs (0 where there is no target); needs SetComputeEntropy(true) before Forward.
  void TargetEntropies(float* out) const;

  // The softcapped logits [B*T, V] of the last Forward into `out` (for tests and tools that
  // compare logits; training never builds them).
  void ComputeLogits(const ParamTable& table, float* out);
  void ComputeLogits(const float* params, float* out);
  // Residual stream after decoder layer i ([B,T,d]); i = -1 gives the scaled embeddings.
  const float* hidden(int64_t layer) const { return Act(plan_.resid[layer + 1]); }
  const float* final_hidden() const { return Act(plan_.hN); }  // after the final norm

 private:
  float* Act(int idx) { return acts_.data() + plan_.layout.entry(idx).offset; }
  const float* Act(int idx) const { return acts_.data() + plan_.layout.entry(idx).offset; }
  void BuildRopeTables();
  // doc_start_ from the batch's position ids (checked), or null when it has none.
  const int32_t* DocumentStarts(const Batch& b);
  // The ids the embedding tables read: the batch's, or ids_ with every soft-token position set to
  // the pad id (checked: as many positions as soft tokens, and every other id in the vocabulary).
  const int32_t* TokenIds(const Batch& b);

  void LayerForward(int64_t i, const ParamTable& t, const Batch& b, const AttnMask& mask,
                    ParamHooks* hooks);
  void LayerBackward(int64_t i, const ParamTable& t, const Batch& b, const AttnMask& mask,
                     ParamHooks* hooks);
  // y [N, out] = alpha * (x W^T + s * dropout(x) A^T B^T) for registry entry e (no adapter: the
  // plain product), and its backward: dx [N, in] (= or += with accumulate_dx; null: not needed),
  // and the gradients of W, A and B where the table has them.
  void Linear(const ParamTable& t, int e, const float* x, float* y, int64_t N, int64_t in,
              int64_t out, float alpha = 1.0f);
  void LinearBack(const ParamTable& t, int e, const float* x, const float* dy, float* dx, int64_t N,
                  int64_t in, int64_t out, float alpha, bool accumulate_dx);
  // The adapter's input: x itself, or (training with dropout) x masked and scaled into lora_x.
  const float* LoraInput(int e, const float* x, int64_t N, int64_t in);
  // The MLP's gate, up and their product from its input h2 (forward, and the kMlp recompute).
  void MlpForward(int64_t i, const ParamTable& t, int64_t N);
  // Calls fn(v0, c, w) for each vocabulary block [v0, v0 + c) of the tied head, w its fp32 rows:
  // the table's own, or (embed_tokens frozen) read from the source into a scratch block.
  // (A template defined in gemma4.cpp: a std::function would allocate its capture.)
  template <typename Fn>
  void ForEachHeadBlock(const ParamTable& t, Fn&& fn);
  // The head's logits of `rows` target rows (compacted, [rows, d] at hv) against one vocabulary
  // block, softcapped, into the tile scratch [rows, c].
  void HeadTile(const float* hv, const float* w, int64_t rows, int64_t c);
  // The tied head when the plan keeps the forward's logits and the head is in the table (not
  // served as rows): nullptr means tiles.
  const float* CachedHead(const ParamTable& t) const;
  // Per row of a tile y [rows, c] (compacted rows r0.., vocabulary v0..): the online
  // log-sum-exp's running maximum and sum and the target's logit; and the tile turned in place
  // into d(scale * loss)/d(pre-softcap logits).
  void HeadRowsLse(const float* y, int64_t r0, int64_t rows, int64_t v0, int64_t c);
  // row_w: per compacted row its loss weight, or null (all 1).
  void HeadRowsGrad(float* y, int64_t r0, int64_t rows, int64_t v0, int64_t c, float scale,
                    const float* row_w);
  // The loss over the compacted rows, and its backward (recomputing each tile).
  double HeadLossForward(const ParamTable& t);
  void HeadLossBackward(const ParamTable& t, const Batch& b, float grad_scale, float* dhN,
                        int64_t N);
  // The table of the arena convenience calls, rebuilt only when the arenas change.
  const ParamTable& ArenaTable(const float* params, float* grads,
                               const std::vector<bool>* trainable);

  Gemma4Config cfg_;
  ParamRegistry reg_;
  int64_t max_B_, max_T_;
  EngineOptions options_;
  Backend backend_;

  ActivationPlan plan_;
  AlignedBuffer acts_;
  int64_t last_N_ = 0;  // tokens of the last Forward
  uint64_t dropout_seed_ = 0;
  bool dropout_on_ = true;
  bool adapters_on_ = true;
  float inv_temperature_ = 1.0f;
  bool entropy_ = false;
  std::vector<float> row_w_;  // [rows_] the batch's loss weights per compacted row
  // RoPE tables [max_T, D/2] for sliding and full layers.
  std::vector<float> cos_s_, sin_s_, cos_f_, sin_f_;
  std::vector<int32_t> targets_;     // [N] labels shifted left by one, -100 at each row's end
  std::vector<int32_t> rows_;        // the rows with a target, in order (the head's compacted rows)
  std::vector<int32_t> doc_start_;   // [N] from Batch::position_ids: each token's first visible key
  std::vector<int32_t> ids_;         // [N] the input ids with soft-token positions as the pad id
  AlignedBuffer head_w_;             // frozen head: one vocabulary block's weights (fp32)
  std::vector<float> whole_logits_;  // the oracle's [N, V] logits (EngineOptions::whole_logits)
  ParamTable arena_table_;
  const float* arena_params_ = nullptr;
  float* arena_grads_ = nullptr;
  const std::vector<bool>* arena_trainable_ = nullptr;
};

// cos/sin tables [T, D/2] of one layer kind's RoPE (fp32 inverse frequencies and angles, as
// transformers computes them; proportional RoPE leaves frequencies past the rotary part at 0).
void RopeTable(const RopeParams& r, int64_t D, int64_t T, std::vector<float>* cos_t,
               std::vector<float>* sin_t);

// The FLOPs of one forward+backward over `batch` tokens: 6 x matmul params x tokens plus the
// attention products actually computed for the visible (causal, windowed) query-key pairs
// (2 products x 2 FLOPs x D per pair forward, twice that backward), no padding assumed.
// With `trainable`, a frozen weight costs 4 x params x tokens (no weight gradient), as under LoRA.
double TrainingFlops(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t B, int64_t T,
                     const std::vector<bool>* trainable = nullptr);

}  // namespace st
