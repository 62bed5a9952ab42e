#include "model/gemma4.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/ref/ops_ref.h"
#include "model/weights.h"

namespace st {

namespace {

// The op table of one backend (same signatures in st::ref and st::cpu).
struct Ops {
  decltype(&cpu::LinearForward) LinearForward;
  decltype(&cpu::LinearBackward) LinearBackward;
  decltype(&cpu::EmbeddingForward) EmbeddingForward;
  decltype(&cpu::EmbeddingBackward) EmbeddingBackward;
  decltype(&cpu::RmsNormForward) RmsNormForward;
  decltype(&cpu::RmsNormBackward) RmsNormBackward;
  decltype(&cpu::Rope) Rope;
  decltype(&cpu::AttentionForward) AttentionForward;
  decltype(&cpu::AttentionBackward) AttentionBackward;
  decltype(&cpu::GeluMulForward) GeluMulForward;
  decltype(&cpu::GeluMulBackward) GeluMulBackward;
  decltype(&cpu::SoftcapForward) SoftcapForward;
  decltype(&cpu::CrossEntropyForward) CrossEntropyForward;
  decltype(&cpu::CrossEntropySoftcapBackward) CrossEntropySoftcapBackward;
  decltype(&cpu::Add) Add;
  decltype(&cpu::Scale) Scale;
};

#define ST_OPS_OF(ns)                                                                       \
  Ops {                                                                                     \
    ns::LinearForward, ns::LinearBackward, ns::EmbeddingForward, ns::EmbeddingBackward,     \
        ns::RmsNormForward, ns::RmsNormBackward, ns::Rope, ns::AttentionForward,            \
        ns::AttentionBackward, ns::GeluMulForward, ns::GeluMulBackward, ns::SoftcapForward, \
        ns::CrossEntropyForward, ns::CrossEntropySoftcapBackward, ns::Add, ns::Scale        \
  }

// A backend's table with its Linear products in the given precision (every other op is fp32).
Ops WithPrecision(Ops ops, decltype(&cpu::LinearForward) forward_bf16,
                  decltype(&cpu::LinearBackward) backward_bf16) {
  ops.LinearForward = forward_bf16;
  ops.LinearBackward = backward_bf16;
  return ops;
}

const Ops& OpsFor(Backend b, Precision p) {
  static const Ops cpu_ops = ST_OPS_OF(cpu);
  static const Ops ref_ops = ST_OPS_OF(ref);
  static const Ops cpu_bf16 =
      WithPrecision(cpu_ops, cpu::LinearForwardMixed, cpu::LinearBackwardMixed);
  static const Ops ref_bf16 =
      WithPrecision(ref_ops, ref::LinearForwardMixed, ref::LinearBackwardMixed);
  if (b == Backend::kRef) return p == Precision::kBf16 ? ref_bf16 : ref_ops;
  return p == Precision::kBf16 ? cpu_bf16 : cpu_ops;
}
#undef ST_OPS_OF

}  // namespace

void RopeTable(const RopeParams& r, int64_t D, int64_t T, std::vector<float>* cos_t,
               std::vector<float>* sin_t) {
  const int64_t half = D / 2;
  std::vector<float> inv_freq(half, 0.0f);
  const int64_t rotated =
      r.rope_type == "proportional" ? static_cast<int64_t>(r.partial_rotary_factor * D / 2) : half;
  for (int64_t j = 0; j < std::min(rotated, half); ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(D);
    inv_freq[j] = 1.0f / std::pow(static_cast<float>(r.theta), exponent);
  }
  cos_t->resize(T * half);
  sin_t->resize(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(t) * inv_freq[j];
      (*cos_t)[t * half + j] = static_cast<float>(std::cos(static_cast<double>(angle)));
      (*sin_t)[t * half + j] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
}

StatusOr<ActivationCheckpointing> ParseActivationCheckpointing(const std::string& name) {
  if (name == "none") return ActivationCheckpointing::kNone;
  if (name == "mlp") return ActivationCheckpointing::kMlp;
  if (name == "layer") return ActivationCheckpointing::kLayer;
  return InvalidArgument("--activation-checkpointing must be none, mlp or layer, got '" + name +
                         "'");
}

const char* ActivationCheckpointingName(ActivationCheckpointing c) {
  switch (c) {
    case ActivationCheckpointing::kNone:
      return "none";
    case ActivationCheckpointing::kMlp:
      return "mlp";
    case ActivationCheckpointing::kLayer:
      return "layer";
  }
  return "none";
}

Gemma4Engine::Gemma4Engine(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                           const EngineOptions& options)
    : cfg_(cfg),
      reg_(BuildParamRegistry(cfg, options.lora)),
      max_B_(max_batch),
      max_T_(max_seq),
      options_(options),
      backend_(options.backend) {
  ST_CHECK(max_batch >= 1 && max_seq >= 1) << "engine planned for an empty batch";
  plan_ = ActivationPlan::Build(cfg_, max_B_, max_T_, options_);
  acts_ = AlignedBuffer(plan_.layout.total(), "the activation arena");
  BuildRopeTables();
  if (backend_ == Backend::kCpu) {
    int64_t max_kv = 1, max_d = 1;
    for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
      max_kv = std::max(max_kv, cfg_.KvHeads(i));
      max_d = std::max(max_d, cfg_.HeadDim(i));
    }
    cpu::ReserveAttentionScratch(max_B_, max_T_, cfg_.num_attention_heads, max_kv, max_d);
  }
  targets_.assign(max_B_ * max_T_, -100);
  doc_start_.assign(max_B_ * max_T_, 0);
  rows_.reserve(static_cast<size_t>(max_B_ * max_T_));
  row_w_.reserve(static_cast<size_t>(max_B_ * max_T_));
}

ParamTable ParamTable::FromArenas(const ParamRegistry& reg, const float* params, float* grads,
                                  const std::vector<bool>* trainable) {
  ParamTable t;
  t.param.resize(reg.layout.size());
  t.grad.assign(reg.layout.size(), nullptr);
  for (int i = 0; i < reg.layout.size(); ++i) {
    const int64_t off = reg.layout.entry(i).offset;
    t.param[i] = params + off;
    const bool train = trainable ? (*trainable)[i] : !reg.is_buffer[i];
    if (grads && train) t.grad[i] = grads + off;
  }
  return t;
}

const ParamTable& Gemma4Engine::ArenaTable(const float* params, float* grads,
                                           const std::vector<bool>* trainable) {
  if (arena_table_.param.empty() || params != arena_params_ || grads != arena_grads_ ||
      trainable != arena_trainable_) {
    arena_table_ = ParamTable::FromArenas(reg_, params, grads, trainable);
    arena_params_ = params;
    arena_grads_ = grads;
    arena_trainable_ = trainable;
  }
  return arena_table_;
}

ForwardResult Gemma4Engine::Forward(const float* params, const Batch& batch) {
  return Forward(ArenaTable(params, arena_grads_, arena_trainable_), batch);
}

void Gemma4Engine::Backward(const float* params, float* grads, const Batch& batch, float grad_scale,
                            const std::vector<bool>* trainable) {
  Backward(ArenaTable(params, grads, trainable), batch, grad_scale);
}

void Gemma4Engine::BuildRopeTables() {
  int64_t Ds = 0, Df = 0;
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i)
    (cfg_.layer_types[i] == LayerType::kFull ? Df : Ds) = cfg_.HeadDim(i);
  if (Ds) RopeTable(cfg_.rope_sliding, Ds, max_T_, &cos_s_, &sin_s_);
  if (Df) RopeTable(cfg_.rope_full, Df, max_T_, &cos_f_, &sin_f_);
}

ActivationPlan ActivationPlan::Build(const Gemma4Config& cfg, int64_t B, int64_t T,
                                     const EngineOptions& options) {
  ActivationPlan plan;
  ArenaLayout& l = plan.layout;
  const int64_t N = B * T, d = cfg.hidden_size, L = cfg.num_hidden_layers;
  const int64_t H = cfg.num_attention_heads, P = cfg.hidden_size_per_layer_input;
  const bool train = options.training;
  // Which layers' K/V later layers read (they must outlive the layer), and the largest layer.
  std::vector<bool>& kv_source = plan.kv_source;
  kv_source.assign(L, false);
  int64_t max_hd = 0, max_kvd = 0, max_f = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (cfg.IsKvShared(i)) kv_source[cfg.KvSourceLayer(i)] = true;
    max_hd = std::max(max_hd, H * cfg.HeadDim(i));
    max_kvd = std::max(max_kvd, cfg.KvHeads(i) * cfg.HeadDim(i));
    max_f = std::max(max_f, cfg.MlpWidth(i));
  }
  // Per-layer sets when the backward reads them as the forward left them; otherwise one set.
  const bool keep_layers = train && options.checkpointing != ActivationCheckpointing::kLayer;
  const bool keep_mlp = train && options.checkpointing == ActivationCheckpointing::kNone;
  // The residual stream: every layer's input when training (the checkpoints of kLayer), else two
  // buffers the layers alternate between.
  for (int64_t i = 0; i <= L; ++i) {
    if (train || i < 2)
      plan.resid.push_back(l.Add("resid." + std::to_string(i), {N, d}));
    else
      plan.resid.push_back(plan.resid[static_cast<size_t>(i % 2)]);
  }
  if (P > 0) {
    plan.proj = l.Add("ple.proj", {N, L * P});
    plan.rstd_pln = l.Add("ple.rstd", {N * L});
    plan.ple = l.Add("ple.inputs", {L, N, P});
  }
  // Adds to `a` the tensors of one layer's activation set: the attention and PLE part (set), the
  // K/V projections before RoPE/norm (kv_raw), K and V themselves (kv), the MLP's intermediates.
  auto add = [&](const std::string& p, ActivationPlan::LayerActs a, int64_t hd, int64_t kvh,
                 int64_t kvd, int64_t F, bool set, bool kv_raw, bool kv, bool mlp) {
    if (set) {
      a.h1 = l.Add(p + "h1", {N, d});
      a.rstd_in = l.Add(p + "rstd_in", {N});
      a.q_raw = l.Add(p + "q_raw", {N, hd});
      a.rstd_q = l.Add(p + "rstd_q", {N * H});
      a.q = l.Add(p + "q", {N, hd});
      a.lse = l.Add(p + "lse", {B, H, T});
      a.o = l.Add(p + "o", {N, hd});
      a.a = l.Add(p + "a", {N, d});
      a.rstd_pa = l.Add(p + "rstd_pa", {N});
      a.x1 = l.Add(p + "x1", {N, d});
      a.h2 = l.Add(p + "h2", {N, d});
      a.rstd_pf = l.Add(p + "rstd_pf", {N});
      a.m = l.Add(p + "m", {N, d});
      a.rstd_pff = l.Add(p + "rstd_pff", {N});
      a.x2 = l.Add(p + "x2", {N, d});
      if (P > 0) {
        a.pg = l.Add(p + "pg", {N, P});
        a.g2 = l.Add(p + "g2", {N, P});
        a.u = l.Add(p + "u", {N, d});
        a.rstd_pp = l.Add(p + "rstd_pp", {N});
      }
    }
    if (kv_raw) {
      a.k_raw = l.Add(p + "k_raw", {N, kvd});
      a.rstd_k = l.Add(p + "rstd_k", {N * kvh});
      a.v_raw = l.Add(p + "v_raw", {N, kvd});
      a.rstd_v = l.Add(p + "rstd_v", {N * kvh});
    }
    if (kv) {
      a.k = l.Add(p + "k", {N, kvd});
      a.v = l.Add(p + "v", {N, kvd});
    }
    if (mlp) {
      a.gate = l.Add(p + "gate", {N, F});
      a.up = l.Add(p + "up", {N, F});
      a.hm = l.Add(p + "hm", {N, F});
    }
    return a;
  };
  int64_t max_kvh = 1;
  for (int64_t i = 0; i < L; ++i) max_kvh = std::max(max_kvh, cfg.KvHeads(i));
  ActivationPlan::LayerActs shared{};
  if (!keep_layers)  // kLayer, or forward only: one set for every layer
    shared = add("shared.", shared, max_hd, max_kvh, max_kvd, max_f, true, true, true, true);
  else if (!keep_mlp)  // kMlp: one set of MLP intermediates
    shared = add("shared.", shared, 0, 0, 0, max_f, false, false, false, true);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "layer." + std::to_string(i) + ".";
    const int64_t hd = H * cfg.HeadDim(i), kvh = cfg.KvHeads(i), kvd = kvh * cfg.HeadDim(i);
    const bool own_kv = !cfg.IsKvShared(i);
    ActivationPlan::LayerActs a;
    if (keep_layers) {
      a = add(p, shared, hd, kvh, kvd, cfg.MlpWidth(i), true, own_kv, own_kv, keep_mlp);
    } else {
      a = add(p, shared, hd, kvh, kvd, 0, false, false, own_kv && kv_source[i], false);
    }
    if (!own_kv) a.k_raw = a.rstd_k = a.k = a.v_raw = a.rstd_v = a.v = -1;
    plan.layers.push_back(a);
  }
  plan.hN = l.Add("final.hN", {N, d});
  plan.rstd_f = l.Add("final.rstd", {N});
  // The head's tiles: the compacted target rows, their gradient, one tile of logits, the rows'
  // log-sum-exp.
  plan.head_h = l.Add("head.rows", {N, d});
  const int64_t V = cfg.vocab_size;
  // (Not with LoRA: its head is the frozen tied embedding, read block by block, never cached.)
  if (train && !options.lora.enabled() &&
      static_cast<double>(N) * static_cast<double>(V) * sizeof(float) <= kHeadCacheBytes) {
    // Small enough to keep: the forward's softcapped logits of the target rows, which the
    // backward then turns into their gradient without recomputing the head's product.
    plan.head_cache = l.Add("head.logits", {N, V});
    plan.head_y = plan.head_cache;
  } else {
    plan.head_y = l.Add("head.tile", {std::min(N, kHeadRows), std::min(V, kHeadBlock)});
  }
  plan.head_lse = l.Add("head.lse", {N});
  plan.head_sum = l.Add("head.sum", {N});
  plan.head_zt = l.Add("head.zt", {N});
  plan.head_ez = l.Add("head.ez", {N});
  const int64_t LP = std::max<int64_t>(P, 1) * std::max<int64_t>(L, 1);
  plan.dp2 = l.Add("grad.dp2", {N, LP});  // also the forward's PLE scratch
  if (options.lora.enabled()) {
    const ParamRegistry base = BuildParamRegistry(cfg);
    int64_t max_in = 0;
    for (int e : options.lora.targets) max_in = std::max(max_in, base.layout.entry(e).shape[1]);
    plan.lora_t = l.Add("lora.t", {N, options.lora.rank});
    if (train) plan.lora_dt = l.Add("lora.dt", {N, options.lora.rank});
    if (train && options.lora.dropout > 0) plan.lora_x = l.Add("lora.x", {N, max_in});
  }
  if (!train) return plan;
  plan.head_dh = l.Add("head.drows", {N, d});
  // Backward scratch.
  plan.dx = l.Add("grad.dx", {N, d});
  plan.dn = l.Add("grad.dn", {N, d});
  plan.dh = l.Add("grad.dh", {N, d});
  plan.dq = l.Add("grad.dq", {N, max_hd});
  plan.dout = l.Add("grad.do", {N, max_hd});
  plan.df1 = l.Add("grad.df1", {N, max_f});
  plan.df2 = l.Add("grad.df2", {N, max_f});
  plan.dp1 = l.Add("grad.dp1", {N, LP});
  if (P > 0) plan.dple = l.Add("grad.dple", {L, N, P});
  // K/V gradient accumulators: their own for a layer whose K/V later layers share (the consumers'
  // backward adds into it first), one shared by the others.
  plan.dk.assign(L, -1);
  plan.dv.assign(L, -1);
  int dk_shared = -1, dv_shared = -1;
  for (int64_t i = 0; i < L; ++i) {
    if (cfg.IsKvShared(i)) continue;
    if (kv_source[i]) {
      const int64_t kvd = cfg.KvHeads(i) * cfg.HeadDim(i);
      plan.dk[i] = l.Add("grad.dk." + std::to_string(i), {N, kvd});
      plan.dv[i] = l.Add("grad.dv." + std::to_string(i), {N, kvd});
    } else {
      if (dk_shared < 0) {
        dk_shared = l.Add("grad.dk", {N, max_kvd});
        dv_shared = l.Add("grad.dv", {N, max_kvd});
      }
      plan.dk[i] = dk_shared;
      plan.dv[i] = dv_shared;
    }
  }
  for (int64_t i = 0; i < L; ++i)
    if (cfg.IsKvShared(i)) {
      plan.dk[i] = plan.dk[cfg.KvSourceLayer(i)];
      plan.dv[i] = plan.dv[cfg.KvSourceLayer(i)];
    }
  return plan;
}

ForwardResult Gemma4Engine::Forward(const ParamTable& t, const Batch& b, ParamHooks* hooks) {
  ST_CHECK(b.B >= 1 && b.B <= max_B_ && b.T >= 1 && b.T <= max_T_)
      << "batch [" << b.B << ", " << b.T << "] exceeds the planned [" << max_B_ << ", " << max_T_
      << "]";
  const Ops& ops = OpsFor(backend_, options_.precision);
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t P = cfg_.hidden_size_per_layer_input, V = cfg_.vocab_size;
  const int32_t* ids = TokenIds(b);
  auto W = [&](int idx) { return t.param[idx]; };
  last_N_ = N;

  // Embeddings: x0 = E[ids] * sqrt(d)   [N,d]; soft-token positions take their rows as they are.
  float* x0 = Act(plan_.resid[0]);
  if (const float* table = W(reg_.embed_tokens))
    ops.EmbeddingForward(ids, table, x0, N, d, std::sqrt(static_cast<float>(d)));
  else  // frozen and left in the checkpoint (FrozenWeights): the batch's rows
    t.rows.at(reg_.embed_tokens)
        ->GatherRows(reg_.embed_tokens, ids, N, std::sqrt(static_cast<float>(d)), x0);
  if (b.num_soft_tokens > 0)
    for (int64_t n = 0, s = 0; n < N; ++n)
      if (b.input_ids[n] == b.soft_token_id)
        std::memcpy(x0 + n * d, b.soft_tokens + (s++) * d, static_cast<size_t>(d) * sizeof(float));

  // Per-layer inputs: ple[l] = (norm(x0 Wplmp^T / sqrt(d)) + Epl[ids] * sqrt(P)) / sqrt(2)
  if (P > 0) {
    float* proj = Act(plan_.proj);  // [N, L*P] pre-norm projection (saved)
    // The normed projection (in place when nothing runs backward) and the token-identity part.
    float* projn = options_.training ? Act(plan_.dp1) : proj;
    float* tok = Act(plan_.dp2);
    Linear(t, reg_.per_layer_model_projection, x0, proj, N, d, L * P,
           1.0f / std::sqrt(static_cast<float>(d)));
    ops.RmsNormForward(proj, W(reg_.per_layer_projection_norm), projn, Act(plan_.rstd_pln), N * L,
                       P, static_cast<float>(cfg_.rms_norm_eps));
    const int ple_table = reg_.embed_tokens_per_layer;
    if (const float* table = W(ple_table))
      ops.EmbeddingForward(ids, table, tok, N, L * P, std::sqrt(static_cast<float>(P)));
    else  // frozen and left in the checkpoint: the batch's rows, converted on the fly
      t.rows.at(ple_table)->GatherRows(ple_table, ids, N, std::sqrt(static_cast<float>(P)), tok);
    float* ple = Act(plan_.ple);  // [L, N, P]
    const float s = static_cast<float>(std::pow(2.0, -0.5));
#pragma omp parallel for schedule(static) if (N * L * P > (1 << 15))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t p = 0; p < P; ++p)
          ple[(l * N + n) * P + p] = (projn[(n * L + l) * P + p] + tok[(n * L + l) * P + p]) * s;
  }

  const int32_t* start = DocumentStarts(b);
  AttnMask full_mask{b.attention_mask, 0, start};
  AttnMask sliding_mask{b.attention_mask, cfg_.sliding_window, start};
  for (int64_t i = 0; i < L; ++i)
    LayerForward(i, t, b, cfg_.layer_types[i] == LayerType::kFull ? full_mask : sliding_mask,
                 hooks);

  // Final norm; the tied head and the loss in tiles (the softcapped logits are never whole).
  ops.RmsNormForward(Act(plan_.resid[L]), W(reg_.norm), Act(plan_.hN), Act(plan_.rstd_f), N, d,
                     static_cast<float>(cfg_.rms_norm_eps));
  ForwardResult r;
  rows_.clear();
  if (b.labels) {
    // Causal shift: position t predicts labels[t+1]; each row's last position predicts nothing.
    for (int64_t bi = 0; bi < b.B; ++bi)
      for (int64_t t = 0; t < b.T; ++t) {
        const int32_t label = t + 1 < b.T ? b.labels[bi * b.T + t + 1] : -100;
        ST_CHECK(label == -100 || (label >= 0 && label < V))
            << "label " << label << " out of range";
        targets_[bi * b.T + t] = label;
        if (label != -100) rows_.push_back(static_cast<int32_t>(bi * b.T + t));
      }
    r.num_valid = static_cast<int64_t>(rows_.size());
    r.loss_sum = HeadLossForward(t);
  }
  return r;
}

const int32_t* Gemma4Engine::TokenIds(const Batch& b) {
  const int64_t N = b.B * b.T, V = cfg_.vocab_size;
  const int32_t* ids = b.input_ids;
  if (b.num_soft_tokens == 0 && b.soft_tokens == nullptr) {
    for (int64_t n = 0; n < N; ++n)
      ST_CHECK(ids[n] >= 0 && ids[n] < V) << "token id " << ids[n] << " outside the vocabulary";
    return ids;
  }
  ST_CHECK(b.soft_tokens != nullptr && b.num_soft_tokens > 0)
      << "soft tokens: " << b.num_soft_tokens << " rows given at " << b.soft_tokens;
  ids_.resize(static_cast<size_t>(N));
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] == b.soft_token_id) {
      ids_[n] = static_cast<int32_t>(cfg_.pad_token_id);
      ++count;
      continue;
    }
    ST_CHECK(ids[n] >= 0 && ids[n] < V) << "token id " << ids[n] << " outside the vocabulary";
    ids_[n] = ids[n];
  }
  ST_CHECK(count == b.num_soft_tokens)
      << "the batch has " << count << " positions of soft token " << b.soft_token_id << " for "
      << b.num_soft_tokens << " soft tokens";
  return ids_.data();
}

const int32_t* Gemma4Engine::DocumentStarts(const Batch& b) {
  if (b.position_ids == nullptr) return nullptr;
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t < b.T; ++t) {
      const int32_t p = b.position_ids[r * b.T + t];
      const int32_t prev = t > 0 ? b.position_ids[r * b.T + t - 1] : -1;
      ST_CHECK(p == 0 || p == prev + 1)
          << "position_ids must restart at 0 or count up by one; row " << r << " position " << t
          << " has " << p << " after " << prev;
      doc_start_[static_cast<size_t>(r * b.T + t)] = static_cast<int32_t>(t - p);
    }
  return doc_start_.data();
}

void Gemma4Engine::LayerForward(int64_t i, const ParamTable& t, const Batch& b,
                                const AttnMask& mask, ParamHooks* hooks) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  const LayerParams& lp = reg_.layers[i];
  const ActivationPlan::LayerActs& a = plan_.layers[i];
  const int64_t B = b.B, T = b.T, N = B * T, d = cfg_.hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.HeadDim(i), Hkv = cfg_.KvHeads(i);
  const int64_t P = cfg_.hidden_size_per_layer_input;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bool full = cfg_.layer_types[i] == LayerType::kFull;
  const float* cos_t = full ? cos_f_.data() : cos_s_.data();
  const float* sin_t = full ? sin_f_.data() : sin_s_.data();
  auto W = [&](int idx) { return t.param[idx]; };

  using Part = ParamHooks::Part;
  if (hooks) hooks->BeforeForward(i, Part::kLayer);
  const float* x_in = Act(plan_.resid[i]);  // [N,d]
  // Attention block: x1 = x_in + norm_pa(o_proj(attn(norm_in(x_in))))
  float* h1 = Act(a.h1);
  ops.RmsNormForward(x_in, W(lp.input_layernorm), h1, Act(a.rstd_in), N, d, eps);
  float* q = Act(a.q);  // [N, H*D] after q_norm and RoPE
  Linear(t, lp.q_proj, h1, Act(a.q_raw), N, d, H * D);
  ops.RmsNormForward(Act(a.q_raw), W(lp.q_norm), q, Act(a.rstd_q), N * H, D, eps);
  ops.Rope(q, cos_t, sin_t, b.position_ids, B, T, H, D, false);
  if (!cfg_.IsKvShared(i)) {
    Linear(t, lp.k_proj, h1, Act(a.k_raw), N, d, Hkv * D);
    ops.RmsNormForward(Act(a.k_raw), W(lp.k_norm), Act(a.k), Act(a.rstd_k), N * Hkv, D, eps);
    ops.Rope(Act(a.k), cos_t, sin_t, b.position_ids, B, T, Hkv, D, false);
    Linear(t, lp.v_proj, h1, Act(a.v_raw), N, d, Hkv * D);
    ops.RmsNormForward(Act(a.v_raw), nullptr, Act(a.v), Act(a.rstd_v), N * Hkv, D, eps);
  }
  const ActivationPlan::LayerActs& src = plan_.layers[cfg_.KvSourceLayer(i)];
  ops.AttentionForward(q, Act(src.k), Act(src.v), Act(a.o), Act(a.lse), B, T, H, Hkv, D, mask);
  Linear(t, lp.o_proj, Act(a.o), Act(a.a), N, H * D, d);
  float* x1 = Act(a.x1);
  ops.RmsNormForward(Act(a.a), W(lp.post_attention_layernorm), x1, Act(a.rstd_pa), N, d, eps);
  ops.Add(x1, x_in, N * d);

  // MLP block: x2 = x1 + norm_pff(down(gelu(gate(h2)) * up(h2))), h2 = norm_pf(x1)
  ops.RmsNormForward(x1, W(lp.pre_feedforward_layernorm), Act(a.h2), Act(a.rstd_pf), N, d, eps);
  if (hooks) hooks->BeforeForward(i, Part::kMlp);
  MlpForward(i, t, N);
  Linear(t, lp.down_proj, Act(a.hm), Act(a.m), N, cfg_.MlpWidth(i), d);
  if (hooks) hooks->AfterForward(i, Part::kMlp);
  float* x2 = Act(a.x2);
  ops.RmsNormForward(Act(a.m), W(lp.post_feedforward_layernorm), x2, Act(a.rstd_pff), N, d, eps);
  ops.Add(x2, x1, N * d);

  // PLE block: x3 = x2 + norm_pp(proj(gelu(gate(x2)) * ple_i)); then the whole stream * scalar.
  float* out = Act(plan_.resid[i + 1]);
  if (P > 0) {
    const float* ple_i = Act(plan_.ple) + i * N * P;
    Linear(t, lp.per_layer_input_gate, x2, Act(a.pg), N, d, P);
    ops.GeluMulForward(Act(a.pg), ple_i, Act(a.g2), N * P);
    Linear(t, lp.per_layer_projection, Act(a.g2), Act(a.u), N, P, d);
    ops.RmsNormForward(Act(a.u), W(lp.post_per_layer_input_norm), out, Act(a.rstd_pp), N, d, eps);
    ops.Add(out, x2, N * d);
  } else {
    std::memcpy(out, x2, static_cast<size_t>(N * d) * sizeof(float));
  }
  ops.Scale(out, W(lp.layer_scalar)[0], N * d);
  if (hooks) hooks->AfterForward(i, Part::kLayer);
}

void Gemma4Engine::MlpForward(int64_t i, const ParamTable& t, int64_t N) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  const LayerParams& lp = reg_.layers[i];
  const ActivationPlan::LayerActs& a = plan_.layers[i];
  const int64_t d = cfg_.hidden_size, F = cfg_.MlpWidth(i);
  Linear(t, lp.gate_proj, Act(a.h2), Act(a.gate), N, d, F);
  Linear(t, lp.up_proj, Act(a.h2), Act(a.up), N, d, F);
  ops.GeluMulForward(Act(a.gate), Act(a.up), Act(a.hm), N * F);
}

const float* Gemma4Engine::LoraInput(int e, const float* x, int64_t N, int64_t in) {
  const float p = reg_.lora_dropout;
  if (!options_.training || !dropout_on_ || p <= 0.0f) return x;
  const LoraDropoutMask mask = LoraDropoutMask::For(dropout_seed_, e, p);
  float* out = Act(plan_.lora_x);
  const int64_t n = N * in;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t j = 0; j < n; ++j) out[j] = mask.Keep(j) ? x[j] * mask.scale : 0.0f;
  return out;
}

void Gemma4Engine::Linear(const ParamTable& t, int e, const float* x, float* y, int64_t N,
                          int64_t in, int64_t out, float alpha) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  ops.LinearForward(x, t.param[e], y, N, in, out, alpha, false);
  const int A = reg_.lora_a[e], B = reg_.lora_b[e];
  if (A < 0 || !adapters_on_) return;
  const int64_t R = reg_.lora_rank;
  float* xa = Act(plan_.lora_t);  // [N, R]
  ops.LinearForward(LoraInput(e, x, N, in), t.param[A], xa, N, in, R, 1.0f, false);
  ops.LinearForward(xa, t.param[B], y, N, R, out, alpha * reg_.lora_scaling, true);
}

void Gemma4Engine::LinearBack(const ParamTable& t, int e, const float* x, const float* dy,
                              float* dx, int64_t N, int64_t in, int64_t out, float alpha,
                              bool accumulate_dx) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  ops.LinearBackward(x, t.param[e], dy, dx, t.grad[e], N, in, out, alpha, accumulate_dx);
  const int A = reg_.lora_a[e], B = reg_.lora_b[e];
  if (A < 0 || !adapters_on_ || (!dx && !t.grad[A] && !t.grad[B])) return;
  // The forward's x A^T again (R columns: cheap next to the base product), then
  // d(x A^T) = s dy B, dB += s dy^T (x A^T), dA += d(x A^T)^T x_dropped, dx += mask d(x A^T) A.
  const int64_t R = reg_.lora_rank;
  const float* xin = LoraInput(e, x, N, in);
  float* xa = Act(plan_.lora_t);
  float* dxa = Act(plan_.lora_dt);
  ops.LinearForward(xin, t.param[A], xa, N, in, R, 1.0f, false);
  ops.LinearBackward(xa, t.param[B], dy, dxa, t.grad[B], N, R, out, alpha * reg_.lora_scaling,
                     false);
  if (xin == x) {
    ops.LinearBackward(x, t.param[A], dxa, dx, t.grad[A], N, in, R, 1.0f, true);
    return;
  }
  // With dropout: A's gradient from the dropped input, then the input's gradient through the
  // mask (d x_dropped into lora_x, which held x_dropped, then masked and scaled into dx).
  ops.LinearBackward(xin, t.param[A], dxa, nullptr, t.grad[A], N, in, R, 1.0f, false);
  if (!dx) return;
  float* dxin = Act(plan_.lora_x);
  ops.LinearBackward(nullptr, t.param[A], dxa, dxin, nullptr, N, in, R, 1.0f, false);
  const LoraDropoutMask mask = LoraDropoutMask::For(dropout_seed_, e, reg_.lora_dropout);
  const int64_t n = N * in;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t j = 0; j < n; ++j)
    if (mask.Keep(j)) dx[j] += dxin[j] * mask.scale;
}

template <typename Fn>
void Gemma4Engine::ForEachHeadBlock(const ParamTable& t, Fn&& fn) {
  const int64_t d = cfg_.hidden_size, V = cfg_.vocab_size;
  if (const float* head = t.param[reg_.embed_tokens]) {
    for (int64_t v0 = 0; v0 < V; v0 += kHeadBlock)
      fn(v0, std::min(kHeadBlock, V - v0), head + v0 * d);
    return;
  }
  // Frozen and served from the checkpoint: each block converted into one scratch block
  // (allocated at first use, then reused) and its file pages released at once.
  if (head_w_.size() < kHeadBlock * d)
    head_w_ = AlignedBuffer(kHeadBlock * d, "a block of the frozen LM head (fp32)");
  const WeightSource* rows = t.rows.at(reg_.embed_tokens);
  for (int64_t v0 = 0; v0 < V; v0 += kHeadBlock) {
    const int64_t c = std::min(kHeadBlock, V - v0);
    rows->Read(reg_.embed_tokens, v0 * d, c * d, head_w_.data());
    rows->Release(reg_.embed_tokens, v0 * d, c * d);  // the block's file pages, now converted
    fn(v0, c, head_w_.data());
  }
}

void Gemma4Engine::HeadTile(const float* hv, const float* w, int64_t rows, int64_t c) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  float* y = Act(plan_.head_y);
  ops.LinearForward(hv, w, y, rows, cfg_.hidden_size, c, 1.0f, false);
  ops.SoftcapForward(y, rows * c, static_cast<float>(cfg_.final_logit_softcapping));
}

const float* Gemma4Engine::CachedHead(const ParamTable& t) const {
  return plan_.head_cache >= 0 ? t.param[reg_.embed_tokens] : nullptr;
}

void Gemma4Engine::HeadRowsLse(const float* y, int64_t r0, int64_t rows, int64_t v0, int64_t c) {
  float* mx = Act(plan_.head_lse);
  float* sum = Act(plan_.head_sum);
  float* zt = Act(plan_.head_zt);
#pragma omp parallel for schedule(static) if (rows * c > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = y + r * c;
    const int64_t n = r0 + r;
    const float it = inv_temperature_;  // 1 unless an objective samples at a temperature
    float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
    for (int64_t j = 0; j < c; ++j) bm = std::max(bm, z[j] * it);
    const float m = std::max(mx[n], bm);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += cpu::FastExp(z[j] * it - m);
    if (entropy_) {  // sum of exp(z - m) z, rescaled as the sum is
      float e = 0;
#pragma omp simd reduction(+ : e)
      for (int64_t j = 0; j < c; ++j) e += cpu::FastExp(z[j] * it - m) * (z[j] * it);
      float* ez = Act(plan_.head_ez);
      ez[n] = ez[n] * cpu::FastExp(mx[n] - m) + e;
    }
    sum[n] = sum[n] * cpu::FastExp(mx[n] - m) + s;
    mx[n] = m;
    const int64_t target = targets_[rows_[n]];
    if (target >= v0 && target < v0 + c) zt[n] = z[target - v0] * it;
  }
}

void Gemma4Engine::HeadRowsGrad(float* y, int64_t r0, int64_t rows, int64_t v0, int64_t c,
                                float row_scale, const float* row_w) {
  const float* lse = Act(plan_.head_lse);
  const float cap = static_cast<float>(cfg_.final_logit_softcapping);
  const float inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
#pragma omp parallel for schedule(static) if (rows * c > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float* z = y + r * c;
    const float l = lse[r0 + r];
    const int64_t target = targets_[rows_[r0 + r]] - v0;
    const bool here = target >= 0 && target < c;
    // With a temperature t the loss is over z / t: its gradient gains a factor 1 / t.
    const float it = inv_temperature_;
    const float scale = (row_w ? row_scale * row_w[r0 + r] : row_scale) * it;
    const float zt = here ? z[target] : 0.0f;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) {
      const float u = z[j] * inv_cap;
      z[j] = cpu::FastExp(z[j] * it - l) * scale * (1.0f - u * u);
    }
    if (here) {
      const float u = zt * inv_cap;
      z[target] -= scale * (1.0f - u * u);
    }
  }
}

// The loss over the rows with a target: per row an online log-sum-exp over the vocabulary blocks
// (running maximum and sum, rescaled when the maximum grows) and the target's logit, so memory is
// one tile of [kHeadRows, kHeadBlock] whatever V is. Rows without a target cost nothing.
double Gemma4Engine::HeadLossForward(const ParamTable& t) {
  const int64_t Nv = static_cast<int64_t>(rows_.size()), d = cfg_.hidden_size;
  if (options_.whole_logits || backend_ == Backend::kRef) {
    // The oracle: every row's whole [V] logits, then the plain cross-entropy (tests compare the
    // tiled path with this one).
    ST_CHECK(inv_temperature_ == 1.0f) << "a logit temperature needs the tiled head";
    whole_logits_.resize(static_cast<size_t>(last_N_ * cfg_.vocab_size));
    ComputeLogits(t, whole_logits_.data());
    int64_t valid = 0;
    return OpsFor(backend_, options_.precision)
        .CrossEntropyForward(whole_logits_.data(), targets_.data(), last_N_, cfg_.vocab_size,
                             &valid);
  }
  if (Nv == 0) return 0.0;
  float* hv = Act(plan_.head_h);  // [Nv, d] the rows' final hidden states, compacted
  const float* hN = Act(plan_.hN);
#pragma omp parallel for schedule(static) if (Nv * d > (1 << 16))
  for (int64_t r = 0; r < Nv; ++r)
    std::memcpy(hv + r * d, hN + static_cast<int64_t>(rows_[r]) * d, static_cast<size_t>(d) * 4);
  float* mx = Act(plan_.head_lse);  // running max, then the log-sum-exp
  std::fill(mx, mx + Nv, -INFINITY);
  std::fill(Act(plan_.head_sum), Act(plan_.head_sum) + Nv, 0.0f);
  std::fill(Act(plan_.head_zt), Act(plan_.head_zt) + Nv, 0.0f);
  if (entropy_) std::fill(Act(plan_.head_ez), Act(plan_.head_ez) + Nv, 0.0f);
  if (const float* head = CachedHead(t)) {  // one tile: every row, the whole vocabulary
    const int64_t V = cfg_.vocab_size;
    OpsFor(backend_, options_.precision)
        .LinearForward(hv, head, Act(plan_.head_cache), Nv, d, V, 1.0f, false);
    OpsFor(backend_, options_.precision)
        .SoftcapForward(Act(plan_.head_cache), Nv * V,
                        static_cast<float>(cfg_.final_logit_softcapping));
    HeadRowsLse(Act(plan_.head_cache), 0, Nv, 0, V);
  } else {
    ForEachHeadBlock(t, [&](int64_t v0, int64_t c, const float* w) {
      for (int64_t r0 = 0; r0 < Nv; r0 += kHeadRows) {
        const int64_t rows = std::min(kHeadRows, Nv - r0);
        HeadTile(hv + r0 * d, w, rows, c);
        HeadRowsLse(Act(plan_.head_y), r0, rows, v0, c);
      }
    });
  }
  const float* sum = Act(plan_.head_sum);
  const float* zt = Act(plan_.head_zt);
  double total = 0;
  for (int64_t n = 0; n < Nv; ++n) {
    mx[n] += std::log(sum[n]);  // the row's log-sum-exp, for the backward
    total += static_cast<double>(mx[n]) - static_cast<double>(zt[n]);
  }
  return total;
}

// d(scale * loss)/d(pre-softcap logits) = scale * (softmax - onehot) * (1 - (z/cap)^2), tile by
// tile from the forward's log-sum-exp; into dhN (every row: zero where no target) and the head's
// gradient.
void Gemma4Engine::HeadLossBackward(const ParamTable& t, const Batch& b, float scale, float* dhN,
                                    int64_t N) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  const int64_t Nv = static_cast<int64_t>(rows_.size()), d = cfg_.hidden_size;
  const float* row_w = nullptr;
  if (b.loss_weights) {  // position p's target is label p + 1 (same row: the last has none)
    row_w_.resize(rows_.size());
    for (int64_t n = 0; n < Nv; ++n) row_w_[n] = b.loss_weights[rows_[n] + 1];
    row_w = row_w_.data();
  }
  if (options_.whole_logits || backend_ == Backend::kRef) {
    const int64_t V = cfg_.vocab_size;
    ops.CrossEntropySoftcapBackward(whole_logits_.data(), targets_.data(), N, V,
                                    static_cast<float>(cfg_.final_logit_softcapping), scale);
    if (b.loss_weights)  // the gradient is linear in each row's weight
      for (int64_t n = 0; n < N; ++n)
        if (targets_[n] != -100)
          for (int64_t v = 0; v < V; ++v) whole_logits_[n * V + v] *= b.loss_weights[n + 1];
    std::vector<float> block;
    ForEachHeadBlock(t, [&](int64_t v0, int64_t c, const float* w) {
      block.resize(static_cast<size_t>(N * c));
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(block.data() + n * c, whole_logits_.data() + n * V + v0,
                    static_cast<size_t>(c) * sizeof(float));
      float* dw = t.grad[reg_.embed_tokens];
      ops.LinearBackward(Act(plan_.hN), w, block.data(), dhN, dw ? dw + v0 * d : nullptr, N, d, c,
                         1.0f, v0 > 0);
    });
    return;
  }
  std::memset(dhN, 0, static_cast<size_t>(N * d) * sizeof(float));
  if (Nv == 0) return;
  const float* hv = Act(plan_.head_h);
  float* dhv = Act(plan_.head_dh);
  float* dw_head = t.grad[reg_.embed_tokens];
  if (const float* head = CachedHead(t)) {  // the forward's logits, no recompute
    const int64_t V = cfg_.vocab_size;
    HeadRowsGrad(Act(plan_.head_cache), 0, Nv, 0, V, scale, row_w);
    ops.LinearBackward(hv, head, Act(plan_.head_cache), dhv, dw_head, Nv, d, V, 1.0f, false);
  } else {
    float* y = Act(plan_.head_y);
    ForEachHeadBlock(t, [&](int64_t v0, int64_t c, const float* w) {
      for (int64_t r0 = 0; r0 < Nv; r0 += kHeadRows) {
        const int64_t rows = std::min(kHeadRows, Nv - r0);
        HeadTile(hv + r0 * d, w, rows, c);
        HeadRowsGrad(y, r0, rows, v0, c, scale, row_w);
        ops.LinearBackward(hv + r0 * d, w, y, dhv + r0 * d, dw_head ? dw_head + v0 * d : nullptr,
                           rows, d, c, 1.0f, v0 > 0);
      }
    });
  }
#pragma omp parallel for schedule(static) if (Nv * d > (1 << 16))
  for (int64_t r = 0; r < Nv; ++r)
    std::memcpy(dhN + static_cast<int64_t>(rows_[r]) * d, dhv + r * d, static_cast<size_t>(d) * 4);
}

void Gemma4Engine::TargetLogProbs(float* out) const {
  std::fill(out, out + last_N_, 0.0f);
  if (options_.whole_logits || backend_ == Backend::kRef) {
    const int64_t V = cfg_.vocab_size;
    for (int64_t n = 0; n + 1 < last_N_; ++n) {
      if (targets_[n] == -100) continue;
      const float* z = whole_logits_.data() + n * V;
      double m = -INFINITY, s = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
      for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(z[v]) - m);
      out[n + 1] = static_cast<float>(static_cast<double>(z[targets_[n]]) - m - std::log(s));
    }
    return;
  }
  const float* lse = Act(plan_.head_lse);
  const float* zt = Act(plan_.head_zt);
  for (size_t n = 0; n < rows_.size(); ++n) out[rows_[n] + 1] = zt[n] - lse[n];
}

void Gemma4Engine::TargetEntropies(float* out) const {
  ST_CHECK(entropy_) << "TargetEntropies needs SetComputeEntropy(true) before the forward";
  std::fill(out, out + last_N_, 0.0f);
  if (options_.whole_logits || backend_ == Backend::kRef) {
    const int64_t V = cfg_.vocab_size;
    for (int64_t n = 0; n + 1 < last_N_; ++n) {
      if (targets_[n] == -100) continue;
      const float* z = whole_logits_.data() + n * V;
      double m = -INFINITY, s = 0, e = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(static_cast<double>(z[v]) - m);
        s += p;
        e += p * z[v];
      }
      out[n + 1] = static_cast<float>(m + std::log(s) - e / s);
    }
    return;
  }
  const float* lse = Act(plan_.head_lse);
  const float* sum = Act(plan_.head_sum);
  const float* ez = Act(plan_.head_ez);
  for (size_t n = 0; n < rows_.size(); ++n) out[rows_[n] + 1] = lse[n] - ez[n] / sum[n];
}

void Gemma4Engine::ComputeLogits(const float* params, float* out) {
  ComputeLogits(ArenaTable(params, arena_grads_, arena_trainable_), out);
}

void Gemma4Engine::ComputeLogits(const ParamTable& t, float* out) {
  // (Its own tile: the plan's may hold the forward's logits, which a later Backward reads.)
  const Ops& ops = OpsFor(backend_, options_.precision);
  const int64_t N = last_N_, d = cfg_.hidden_size, V = cfg_.vocab_size;
  const float* hN = Act(plan_.hN);
  std::vector<float> y;
  ForEachHeadBlock(t, [&](int64_t v0, int64_t c, const float* w) {
    y.resize(static_cast<size_t>(N * c));
    ops.LinearForward(hN, w, y.data(), N, d, c, 1.0f, false);
    ops.SoftcapForward(y.data(), N * c, static_cast<float>(cfg_.final_logit_softcapping));
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(out + n * V + v0, y.data() + n * c, static_cast<size_t>(c) * sizeof(float));
  });
}

void Gemma4Engine::Backward(const ParamTable& t, const Batch& b, float grad_scale,
                            ParamHooks* hooks) {
  ST_CHECK(b.labels != nullptr) << "Backward needs labels";
  ST_CHECK(options_.training) << "Backward on an engine planned for the forward only";
  const Ops& ops = OpsFor(backend_, options_.precision);
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t P = cfg_.hidden_size_per_layer_input;
  auto W = [&](int idx) { return t.param[idx]; };
  auto G = [&](int idx) -> float* { return idx >= 0 ? t.grad[idx] : nullptr; };

  // Loss -> head (tile by tile) -> final norm.
  float* dhN = Act(plan_.dn);
  HeadLossBackward(t, b, grad_scale, dhN, N);
  float* dx = Act(plan_.dx);
  ops.RmsNormBackward(Act(plan_.resid[L]), W(reg_.norm), Act(plan_.rstd_f), dhN, dx, G(reg_.norm),
                      N, d, false);

  // K/V gradient accumulators of the layers others share start at zero; consumers add into them
  // (the shared accumulator of the others is cleared when each such layer's backward starts).
  for (int64_t i = 0; i < L; ++i)
    if (plan_.kv_source[i]) {
      const size_t bytes = static_cast<size_t>(N * cfg_.KvHeads(i) * cfg_.HeadDim(i)) * 4;
      std::memset(Act(plan_.dk[i]), 0, bytes);
      std::memset(Act(plan_.dv[i]), 0, bytes);
    }

  const int32_t* start = b.position_ids ? doc_start_.data() : nullptr;  // the forward's
  AttnMask full_mask{b.attention_mask, 0, start};
  AttnMask sliding_mask{b.attention_mask, cfg_.sliding_window, start};
  for (int64_t i = L - 1; i >= 0; --i)
    LayerBackward(i, t, b, cfg_.layer_types[i] == LayerType::kFull ? full_mask : sliding_mask,
                  hooks);

  // dx now holds d loss / d x0 through the residual stream; add the PLE projection path.
  const int32_t* ids = TokenIds(b);
  if (P > 0) {
    const float* dple = Act(plan_.dple);  // [L,N,P]
    float* dsum = Act(plan_.dp1);         // [N, L*P] gradient of (proj_normed + tok)
    const float s = static_cast<float>(std::pow(2.0, -0.5));
#pragma omp parallel for schedule(static) if (N * L * P > (1 << 15))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t p = 0; p < P; ++p) dsum[(n * L + l) * P + p] = dple[(l * N + n) * P + p] * s;
    if (float* g = G(reg_.embed_tokens_per_layer))
      ops.EmbeddingBackward(ids, dsum, g, N, L * P, std::sqrt(static_cast<float>(P)),
                            static_cast<int32_t>(cfg_.pad_token_id));
    float* dproj = Act(plan_.dp2);
    ops.RmsNormBackward(Act(plan_.proj), W(reg_.per_layer_projection_norm), Act(plan_.rstd_pln),
                        dsum, dproj, G(reg_.per_layer_projection_norm), N * L, P, false);
    LinearBack(t, reg_.per_layer_model_projection, Act(plan_.resid[0]), dproj, dx, N, d, L * P,
               1.0f / std::sqrt(static_cast<float>(d)), true);
  }
  // Soft-token positions: their gradient goes to the tower (the pad row's is skipped below).
  if (b.soft_tokens_grad)
    for (int64_t n = 0, s = 0; n < N; ++n)
      if (b.input_ids[n] == b.soft_token_id)
        std::memcpy(b.soft_tokens_grad + (s++) * d, dx + n * d,
                    static_cast<size_t>(d) * sizeof(float));
  if (float* g = G(reg_.embed_tokens))
    ops.EmbeddingBackward(ids, dx, g, N, d, std::sqrt(static_cast<float>(d)),
                          static_cast<int32_t>(cfg_.pad_token_id));
}

void Gemma4Engine::LayerBackward(int64_t i, const ParamTable& t, const Batch& b,
                                 const AttnMask& mask, ParamHooks* hooks) {
  const Ops& ops = OpsFor(backend_, options_.precision);
  const LayerParams& lp = reg_.layers[i];
  const ActivationPlan::LayerActs& a = plan_.layers[i];
  const int64_t B = b.B, T = b.T, N = B * T, d = cfg_.hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.HeadDim(i), Hkv = cfg_.KvHeads(i);
  const int64_t F = cfg_.MlpWidth(i), P = cfg_.hidden_size_per_layer_input;
  const bool full = cfg_.layer_types[i] == LayerType::kFull;
  const float* cos_t = full ? cos_f_.data() : cos_s_.data();
  const float* sin_t = full ? sin_f_.data() : sin_s_.data();
  auto W = [&](int idx) { return t.param[idx]; };
  auto G = [&](int idx) -> float* { return idx >= 0 ? t.grad[idx] : nullptr; };
  using Part = ParamHooks::Part;
  const ActivationCheckpointing ckpt = options_.checkpointing;
  if (hooks) hooks->BeforeBackward(i, Part::kLayer);
  if (ckpt == ActivationCheckpointing::kLayer) {
    // The layer's activations were not kept: its parameters (both parts) are in place for the
    // backward, so the forward runs again from the kept input first (no hooks: nothing new to
    // gather; the output it writes equals the kept next input).
    if (hooks) hooks->BeforeBackward(i, Part::kMlp);
    LayerForward(i, t, b, mask, nullptr);
  }
  if (!cfg_.IsKvShared(i) && !plan_.kv_source[i]) {  // the shared accumulator starts at zero
    const size_t bytes = static_cast<size_t>(N * Hkv * D) * sizeof(float);
    std::memset(Act(plan_.dk[i]), 0, bytes);
    std::memset(Act(plan_.dv[i]), 0, bytes);
  }
  float* dx = Act(plan_.dx);  // in: d resid[i+1]; out: d resid[i]
  float* dn = Act(plan_.dn);
  float* dh = Act(plan_.dh);

  ops.Scale(dx, W(lp.layer_scalar)[0], N * d);  // d x3
  if (P > 0) {
    float* dg2 = Act(plan_.dp1);
    float* dpg = Act(plan_.dp2);
    ops.RmsNormBackward(Act(a.u), W(lp.post_per_layer_input_norm), Act(a.rstd_pp), dx, dn,
                        G(lp.post_per_layer_input_norm), N, d, false);
    LinearBack(t, lp.per_layer_projection, Act(a.g2), dn, dg2, N, P, d, 1.0f, false);
    ops.GeluMulBackward(Act(a.pg), Act(plan_.ple) + i * N * P, dg2, dpg,
                        Act(plan_.dple) + i * N * P, N * P);
    LinearBack(t, lp.per_layer_input_gate, Act(a.x2), dpg, dx, N, d, P, 1.0f, true);  // d x2
  }
  // MLP block.
  float* dhm = Act(plan_.df1);
  float* dgate = Act(plan_.df2);
  ops.RmsNormBackward(Act(a.m), W(lp.post_feedforward_layernorm), Act(a.rstd_pff), dx, dn,
                      G(lp.post_feedforward_layernorm), N, d, false);
  if (ckpt != ActivationCheckpointing::kLayer) {
    if (hooks) hooks->BeforeBackward(i, Part::kMlp);
    if (ckpt == ActivationCheckpointing::kMlp) MlpForward(i, t, N);  // gate, up, hm again
  }
  LinearBack(t, lp.down_proj, Act(a.hm), dn, dhm, N, F, d, 1.0f, false);
  ops.GeluMulBackward(Act(a.gate), Act(a.up), dhm, dgate, /*db=*/dhm, N * F);  // dhm -> d up
  LinearBack(t, lp.gate_proj, Act(a.h2), dgate, dh, N, d, F, 1.0f, false);
  LinearBack(t, lp.up_proj, Act(a.h2), dhm, dh, N, d, F, 1.0f, true);
  if (hooks) hooks->AfterBackward(i, Part::kMlp);
  ops.RmsNormBackward(Act(a.x1), W(lp.pre_feedforward_layernorm), Act(a.rstd_pf), dh, dx,
                      G(lp.pre_feedforward_layernorm), N, d, true);  // dx = d x1
  // Attention block.
  float* dq = Act(plan_.dq);
  float* dout = Act(plan_.dout);
  ops.RmsNormBackward(Act(a.a), W(lp.post_attention_layernorm), Act(a.rstd_pa), dx, dn,
                      G(lp.post_attention_layernorm), N, d, false);
  LinearBack(t, lp.o_proj, Act(a.o), dn, dout, N, H * D, d, 1.0f, false);
  const ActivationPlan::LayerActs& src = plan_.layers[cfg_.KvSourceLayer(i)];
  float* dk = Act(plan_.dk[i]);
  float* dv = Act(plan_.dv[i]);
  ops.AttentionBackward(Act(a.q), Act(src.k), Act(src.v), Act(a.o), Act(a.lse), dout, dq, dk, dv, B,
                        T, H, Hkv, D, mask);
  ops.Rope(dq, cos_t, sin_t, b.position_ids, B, T, H, D, true);
  float* dq_raw = dout;  // d o is consumed
  ops.RmsNormBackward(Act(a.q_raw), W(lp.q_norm), Act(a.rstd_q), dq, dq_raw, G(lp.q_norm), N * H, D,
                      false);
  LinearBack(t, lp.q_proj, Act(a.h1), dq_raw, dh, N, d, H * D, 1.0f, false);
  if (!cfg_.IsKvShared(i)) {
    // Every consumer of this layer's K/V is later in the stack, so dk/dv are complete here.
    float* draw = dq;
    ops.Rope(dk, cos_t, sin_t, b.position_ids, B, T, Hkv, D, true);
    ops.RmsNormBackward(Act(a.k_raw), W(lp.k_norm), Act(a.rstd_k), dk, draw, G(lp.k_norm), N * Hkv,
                        D, false);
    LinearBack(t, lp.k_proj, Act(a.h1), draw, dh, N, d, Hkv * D, 1.0f, true);
    ops.RmsNormBackward(Act(a.v_raw), nullptr, Act(a.rstd_v), dv, draw, nullptr, N * Hkv, D, false);
    LinearBack(t, lp.v_proj, Act(a.h1), draw, dh, N, d, Hkv * D, 1.0f, true);
  }
  ops.RmsNormBackward(Act(plan_.resid[i]), W(lp.input_layernorm), Act(a.rstd_in), dh, dx,
                      G(lp.input_layernorm), N, d, true);  // dx = d resid[i]
  if (hooks) hooks->AfterBackward(i, Part::kLayer);
}

double TrainingFlops(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t B, int64_t T,
                     const std::vector<bool>* trainable) {
  double flops = 6.0 * static_cast<double>(reg.MatmulParams()) * static_cast<double>(B * T);
  if (trainable) {  // a frozen weight's gradient is never formed: 4 instead of 6 per element
    double frozen = 0;
    for (int i = 0; i < reg.layout.size(); ++i)
      if (!(*trainable)[static_cast<size_t>(i)] && reg.IsMatmul(i))
        frozen += static_cast<double>(reg.layout.entry(i).numel);
    flops -= 2.0 * frozen * static_cast<double>(B * T);
  }
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const int64_t W = cfg.layer_types[i] == LayerType::kFull ? T : cfg.sliding_window;
    double pairs = 0;
    for (int64_t q = 0; q < T; ++q) pairs += static_cast<double>(std::min(q + 1, W));
    flops += 12.0 * static_cast<double>(cfg.num_attention_heads * cfg.HeadDim(i)) * pairs *
             static_cast<double>(B);
  }
  return flops;
}

namespace {

// The engine's bytes outside the activations proper: the head's tile of logits, the attention
// kernels' per-thread and per-call scratch, RoPE tables, the targets and the head's row list.
// The bf16 copies of the two operands of the largest Linear product (cpu::Gemm's per-thread
// scratch in precision bf16). A product [rows, in] x [out, in]^T reads x and W forward, dy and W
// for dx, dy^T and x for dW.
double Bf16OperandBytes(const Gemma4Config& cfg, const ActivationPlan& plan, int64_t N,
                        const EngineOptions& o) {
  double a = 0, b = 0;
  auto product = [&](double rows, double in, double out) {
    a = std::max({a, rows * in, o.training ? rows * out : 0.0});
    b = std::max({b, out * in, o.training ? rows * in : 0.0});
  };
  const double n = static_cast<double>(N), d = static_cast<double>(cfg.hidden_size);
  const double P = static_cast<double>(cfg.hidden_size_per_layer_input);
  const double L = static_cast<double>(cfg.num_hidden_layers);
  double widest = d;  // the widest input or output of an adapted product
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const double D = static_cast<double>(cfg.HeadDim(i));
    widest = std::max({widest, static_cast<double>(cfg.num_attention_heads) * D,
                       static_cast<double>(cfg.MlpWidth(i))});
    product(n, d, static_cast<double>(cfg.num_attention_heads) * D);
    product(n, d, static_cast<double>(cfg.KvHeads(i)) * D);
    product(n, d, static_cast<double>(cfg.MlpWidth(i)));
    product(n, static_cast<double>(cfg.MlpWidth(i)), d);
    if (P > 0) product(n, d, P), product(n, P, d);
  }
  if (P > 0) product(n, d, L * P);
  if (o.lora.rank > 0) {
    const double R = static_cast<double>(o.lora.rank);
    product(n, widest, R);
    product(n, R, widest);
  }
  // The head: a tile of logits [rows, c] against a vocabulary block [c, d].
  const double tile = static_cast<double>(plan.layout.entry(plan.head_y).numel);
  const double c = plan.head_cache >= 0 ? static_cast<double>(cfg.vocab_size)
                                        : static_cast<double>(std::min(cfg.vocab_size, kHeadBlock));
  a = std::max({a, tile, std::min(n, static_cast<double>(kHeadRows)) * d});
  b = std::max(b, c * d);
  // cpu::Gemm takes larger operands in blocks of at most kBf16OperandCap elements.
  const double cap = static_cast<double>(cpu::kBf16OperandCap);
  return 2.0 * (std::min(a, cap) + std::min(b, cap));
}

double WorkspaceBytes(const Gemma4Config& cfg, const ActivationPlan& plan, int64_t B, int64_t T,
                      const EngineOptions& options, int threads) {
  double bytes = static_cast<double>(plan.layout.entry(plan.head_y).numel) * sizeof(float);
  int64_t max_kv = 1, max_d = 1, sliding_d = 0, full_d = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    max_kv = std::max(max_kv, cfg.KvHeads(i));
    max_d = std::max(max_d, cfg.HeadDim(i));
    (cfg.layer_types[i] == LayerType::kFull ? full_d : sliding_d) = cfg.HeadDim(i);
  }
  if (options.backend == Backend::kCpu)
    bytes += cpu::AttentionWorkspaceBytes(B, T, cfg.num_attention_heads, max_kv, max_d,
                                          std::max(1, threads));
  bytes += static_cast<double>(T) * static_cast<double>(sliding_d + full_d) * sizeof(float);
  bytes += static_cast<double>(B * T) * 2 * sizeof(int32_t);
  if (options.precision == Precision::kBf16) bytes += Bf16OperandBytes(cfg, plan, B * T, options);
  return bytes;
}

bool AbsurdShape(int64_t B, int64_t T) {
  return B < 1 || T < 1 || static_cast<double>(B) * static_cast<double>(T) > 1e10;
}

}  // namespace

double EstimateActivationBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                               const EngineOptions& options, int threads) {
  // The plan holds offsets in int64: for absurd shapes, a lower bound instead of the plan.
  if (AbsurdShape(max_batch, max_seq))
    return static_cast<double>(max_batch) * static_cast<double>(max_seq) *
           static_cast<double>(cfg.hidden_size) * static_cast<double>(cfg.num_hidden_layers) * 4.0;
  const ActivationPlan plan = ActivationPlan::Build(cfg, max_batch, max_seq, options);
  const double head_tile = static_cast<double>(plan.layout.entry(plan.head_y).numel) * 4.0;
  return static_cast<double>(plan.layout.total()) * sizeof(float) - head_tile +
         WorkspaceBytes(cfg, plan, max_batch, max_seq, options, threads);
}

double EstimateWorkspaceBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                              const EngineOptions& options, int threads) {
  if (AbsurdShape(max_batch, max_seq)) return 0;
  const ActivationPlan plan = ActivationPlan::Build(cfg, max_batch, max_seq, options);
  return WorkspaceBytes(cfg, plan, max_batch, max_seq, options, threads);
}

double FrozenHeadBytes(const Gemma4Config& cfg) {
  return static_cast<double>(kHeadBlock) * static_cast<double>(cfg.hidden_size) * sizeof(float);
}

Status CheckActivationMemory(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                             const EngineOptions& options) {
  const double need = EstimateActivationBytes(cfg, max_batch, max_seq, options, cpu::NumThreads());
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > have)
    return InvalidArgument(StrCat(
        "a batch of ", max_batch, " x ", max_seq, " tokens needs about ",
        static_cast<int64_t>(need / (1 << 30)), " GiB of activations, more than this machine's ",
        static_cast<int64_t>(have / (1 << 30)), " GiB; lower the batch size or --max-seq-len",
        options.training && options.checkpointing != ActivationCheckpointing::kLayer
            ? ", or keep fewer activations (--activation-checkpointing layer)"
            : ""));
  return Status::Ok();
}

}  // namespace st
