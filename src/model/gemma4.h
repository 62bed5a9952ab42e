// Single-device Gemma 4 text decoder (+ tied LM head, final softcap, causal-LM loss): forward and
// backward in fp32 over caller-owned parameter and gradient arenas laid out by ParamRegistry.
// It knows nothing about ranks: FSDP fills the parameter arena (or parts of it) before calling.
// Every activation lives in one arena planned for (max_batch, max_seq) at construction: a step
// allocates nothing. Math follows transformers' modeling_gemma4.py (see
// shared/reference/gemma4.md).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "kernels/attn_mask.h"
#include "model/config.h"
#include "model/glossary.h"
#include "model/params.h"

namespace st {

class WeightSource;

enum class Backend { kRef, kCpu };

struct Batch {
  const int32_t* input_ids = nullptr;       // [B,T]
  const uint8_t* attention_mask = nullptr;  // [B,T], 1 = real token; null = no padding
  const int32_t* labels = nullptr;          // [B,T], -100 = ignored; null = no loss
  int64_t B = 0, T = 0;
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

// The bytes of the activation arena Gemma4Engine(cfg, max_batch, max_seq) plans, estimated in
// floating point so that absurd sizes cannot overflow; attention probabilities grow as T^2.
double EstimateActivationBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq);
// InvalidArgument when that estimate exceeds the machine's physical memory: a flag such as
// --max-seq-len 2000000000 is then a message instead of an allocation failure in the engine.
Status CheckActivationMemory(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq);

// Vocabulary rows per block of the tied LM head when embed_tokens is frozen (FrozenWeights): the
// engine then holds one block of weights [block, d] and its logits [B*T, block] in fp32.
constexpr int64_t kFrozenHeadBlock = 8192;

class Gemma4Engine {
 public:
  Gemma4Engine(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
               Backend backend = Backend::kCpu);

  const Gemma4Config& config() const { return cfg_; }
  const ParamRegistry& registry() const { return reg_; }
  int64_t max_batch() const { return max_B_; }
  int64_t max_seq() const { return max_T_; }
  // Bytes of the activation arena (for memory reports).
  size_t ActivationBytes() const { return static_cast<size_t>(acts_.size()) * sizeof(float); }

  // Runs the model; fills logits() ([B,T,V], after softcap) and, with labels, the loss.
  ForwardResult Forward(const ParamTable& table, const Batch& batch, ParamHooks* hooks = nullptr);
  // Accumulates d(grad_scale * loss_sum)/d(param) into every non-null table.grad entry. Must follow
  // Forward on the same batch; destroys logits(). For a mean loss pass grad_scale = 1 / num_valid
  // (of all ranks' tokens).
  void Backward(const ParamTable& table, const Batch& batch, float grad_scale,
                ParamHooks* hooks = nullptr);

  // The same over one parameter arena and one gradient arena (registry layout); trainable null =
  // every entry but the buffers.
  ForwardResult Forward(const float* params, const Batch& batch);
  void Backward(const float* params, float* grads, const Batch& batch, float grad_scale,
                const std::vector<bool>* trainable = nullptr);

  const float* logits() const { return Act(a_logits_); }
  // Residual stream after decoder layer i ([B,T,d]); i = -1 gives the scaled embeddings.
  const float* hidden(int64_t layer) const { return Act(resid_[layer + 1]); }
  const float* final_hidden() const { return Act(a_hN_); }  // after the final norm

 private:
  struct LayerActs {
    int h1, rstd_in, q_raw, rstd_q, q, k_raw = -1, rstd_k = -1, k = -1, v_raw = -1, rstd_v = -1,
                                       v = -1, probs, o, a, rstd_pa, x1, h2, rstd_pf, gate, up, hm,
                                       m, rstd_pff, x2, pg, g2, u, rstd_pp;
  };

  float* Act(int idx) { return acts_.data() + act_layout_.entry(idx).offset; }
  const float* Act(int idx) const { return acts_.data() + act_layout_.entry(idx).offset; }
  void PlanActivations();
  void BuildRopeTables();

  void LayerForward(int64_t i, const ParamTable& t, const Batch& b, const AttnMask& mask,
                    ParamHooks* hooks);
  void LayerBackward(int64_t i, const ParamTable& t, const Batch& b, const AttnMask& mask,
                     ParamHooks* hooks);
  // The tied LM head over a frozen embed_tokens that the table serves as rows (no fp32 table).
  void ForEachFrozenHeadBlock(const ParamTable& t, const std::function<void(int64_t, int64_t)>& fn);
  void FrozenHeadForward(const ParamTable& t, const float* hN, float* logits, int64_t N);
  void FrozenHeadBackward(const ParamTable& t, const float* dlogits, float* dhN, int64_t N);
  // The table of the arena convenience calls, rebuilt only when the arenas change.
  const ParamTable& ArenaTable(const float* params, float* grads,
                               const std::vector<bool>* trainable);

  Gemma4Config cfg_;
  ParamRegistry reg_;
  int64_t max_B_, max_T_;
  Backend backend_;

  ArenaLayout act_layout_;
  AlignedBuffer acts_;
  std::vector<int> resid_;  // L+1 residual stream snapshots [N,d]
  std::vector<LayerActs> la_;
  int a_proj_ = -1, a_rstd_pln_ = -1, a_ple_ = -1;  // PLE: [N,L,P] projection, [N*L], [L,N,P]
  int a_hN_, a_rstd_f_, a_logits_;
  // Backward scratch (shared by all layers).
  int g_dx_, g_dn_, g_dh_, g_dq_, g_do_, g_df1_, g_df2_, g_dp1_, g_dp2_, g_dple_ = -1;
  std::vector<int> g_dk_, g_dv_;  // per layer: index of the K/V gradient accumulator it adds to
  // RoPE tables [max_T, D/2] for sliding and full layers.
  std::vector<float> cos_s_, sin_s_, cos_f_, sin_f_;
  std::vector<int32_t> targets_;   // [N] labels shifted left by one, -100 at each row's end
  AlignedBuffer head_w_, head_y_;  // frozen head: one vocabulary block's weights and logits
  ParamTable arena_table_;
  const float* arena_params_ = nullptr;
  float* arena_grads_ = nullptr;
  const std::vector<bool>* arena_trainable_ = nullptr;
};

// The FLOPs of one forward+backward over `batch` tokens: 6 x matmul params x tokens plus the
// attention products actually computed for the visible (causal, windowed) query-key pairs
// (2 products x 2 FLOPs x D per pair forward, twice that backward), no padding assumed.
double TrainingFlops(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t B, int64_t T);

}  // namespace st
