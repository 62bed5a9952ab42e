#include "model/gemma4.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

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

const Ops& OpsFor(Backend b) {
  static const Ops cpu_ops = ST_OPS_OF(cpu);
  static const Ops ref_ops = ST_OPS_OF(ref);
  return b == Backend::kRef ? ref_ops : cpu_ops;
}
#undef ST_OPS_OF

// cos/sin tables [T, D/2] for one layer type (fp32 inverse frequencies and angles, as
// transformers computes them; proportional RoPE leaves frequencies past the rotary part at 0).
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

}  // namespace

Gemma4Engine::Gemma4Engine(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq,
                           Backend backend)
    : cfg_(cfg),
      reg_(BuildParamRegistry(cfg)),
      max_B_(max_batch),
      max_T_(max_seq),
      backend_(backend) {
  ST_CHECK(max_batch >= 1 && max_seq >= 1) << "engine planned for an empty batch";
  PlanActivations();
  BuildRopeTables();
  if (backend_ == Backend::kCpu) cpu::ReserveAttentionScratch(max_T_);
  targets_.assign(max_B_ * max_T_, -100);
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

void Gemma4Engine::PlanActivations() {
  ArenaLayout& l = act_layout_;
  const int64_t N = max_B_ * max_T_, d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t H = cfg_.num_attention_heads, P = cfg_.hidden_size_per_layer_input;
  const int64_t V = cfg_.vocab_size;
  int64_t max_hd = 0, max_f = 0;
  for (int64_t i = 0; i <= L; ++i) resid_.push_back(l.Add("resid." + std::to_string(i), {N, d}));
  if (P > 0) {
    a_proj_ = l.Add("ple.proj", {N, L * P});
    a_rstd_pln_ = l.Add("ple.rstd", {N * L});
    a_ple_ = l.Add("ple.inputs", {L, N, P});
  }
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "layer." + std::to_string(i) + ".";
    const int64_t D = cfg_.HeadDim(i), kv = cfg_.KvHeads(i), F = cfg_.MlpWidth(i);
    max_hd = std::max(max_hd, H * D);
    max_f = std::max(max_f, F);
    LayerActs a;
    a.h1 = l.Add(p + "h1", {N, d});
    a.rstd_in = l.Add(p + "rstd_in", {N});
    a.q_raw = l.Add(p + "q_raw", {N, H * D});
    a.rstd_q = l.Add(p + "rstd_q", {N * H});
    a.q = l.Add(p + "q", {N, H * D});
    if (!cfg_.IsKvShared(i)) {
      a.k_raw = l.Add(p + "k_raw", {N, kv * D});
      a.rstd_k = l.Add(p + "rstd_k", {N * kv});
      a.k = l.Add(p + "k", {N, kv * D});
      a.v_raw = l.Add(p + "v_raw", {N, kv * D});
      a.rstd_v = l.Add(p + "rstd_v", {N * kv});
      a.v = l.Add(p + "v", {N, kv * D});
    }
    a.probs = l.Add(p + "probs", {max_B_, H, max_T_, max_T_});
    a.o = l.Add(p + "o", {N, H * D});
    a.a = l.Add(p + "a", {N, d});
    a.rstd_pa = l.Add(p + "rstd_pa", {N});
    a.x1 = l.Add(p + "x1", {N, d});
    a.h2 = l.Add(p + "h2", {N, d});
    a.rstd_pf = l.Add(p + "rstd_pf", {N});
    a.gate = l.Add(p + "gate", {N, F});
    a.up = l.Add(p + "up", {N, F});
    a.hm = l.Add(p + "hm", {N, F});
    a.m = l.Add(p + "m", {N, d});
    a.rstd_pff = l.Add(p + "rstd_pff", {N});
    a.x2 = l.Add(p + "x2", {N, d});
    if (P > 0) {
      a.pg = l.Add(p + "pg", {N, P});
      a.g2 = l.Add(p + "g2", {N, P});
      a.u = l.Add(p + "u", {N, d});
      a.rstd_pp = l.Add(p + "rstd_pp", {N});
    }
    la_.push_back(a);
  }
  a_hN_ = l.Add("final.hN", {N, d});
  a_rstd_f_ = l.Add("final.rstd", {N});
  a_logits_ = l.Add("final.logits", {N, V});
  // Backward scratch.
  g_dx_ = l.Add("grad.dx", {N, d});
  g_dn_ = l.Add("grad.dn", {N, d});
  g_dh_ = l.Add("grad.dh", {N, d});
  g_dq_ = l.Add("grad.dq", {N, max_hd});
  g_do_ = l.Add("grad.do", {N, max_hd});
  g_df1_ = l.Add("grad.df1", {N, max_f});
  g_df2_ = l.Add("grad.df2", {N, max_f});
  g_dp1_ = l.Add("grad.dp1", {N, std::max<int64_t>(P, 1) * std::max<int64_t>(L, 1)});
  g_dp2_ = l.Add("grad.dp2", {N, std::max<int64_t>(P, 1) * std::max<int64_t>(L, 1)});
  if (P > 0) g_dple_ = l.Add("grad.dple", {L, N, P});
  g_dk_.assign(L, -1);
  g_dv_.assign(L, -1);
  for (int64_t i = 0; i < L; ++i) {
    if (cfg_.IsKvShared(i)) continue;
    const int64_t kvd = cfg_.KvHeads(i) * cfg_.HeadDim(i);
    g_dk_[i] = l.Add("grad.dk." + std::to_string(i), {N, kvd});
    g_dv_[i] = l.Add("grad.dv." + std::to_string(i), {N, kvd});
  }
  for (int64_t i = 0; i < L; ++i)
    if (cfg_.IsKvShared(i)) {
      g_dk_[i] = g_dk_[cfg_.KvSourceLayer(i)];
      g_dv_[i] = g_dv_[cfg_.KvSourceLayer(i)];
    }
  acts_ = AlignedBuffer(l.total(), "the activation arena");
}

ForwardResult Gemma4Engine::Forward(const ParamTable& t, const Batch& b, ParamHooks* hooks) {
  ST_CHECK(b.B >= 1 && b.B <= max_B_ && b.T >= 1 && b.T <= max_T_)
      << "batch [" << b.B << ", " << b.T << "] exceeds the planned [" << max_B_ << ", " << max_T_
      << "]";
  const Ops& ops = OpsFor(backend_);
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t P = cfg_.hidden_size_per_layer_input, V = cfg_.vocab_size;
  const int32_t* ids = b.input_ids;
  for (int64_t n = 0; n < N; ++n)
    ST_CHECK(ids[n] >= 0 && ids[n] < V) << "token id " << ids[n] << " outside the vocabulary";
  auto W = [&](int idx) { return t.param[idx]; };

  // Embeddings: x0 = E[ids] * sqrt(d)   [N,d]
  float* x0 = Act(resid_[0]);
  if (const float* table = W(reg_.embed_tokens))
    ops.EmbeddingForward(ids, table, x0, N, d, std::sqrt(static_cast<float>(d)));
  else  // frozen and left in the checkpoint (FrozenWeights): the batch's rows
    t.rows.at(reg_.embed_tokens)
        ->GatherRows(reg_.embed_tokens, ids, N, std::sqrt(static_cast<float>(d)), x0);

  // Per-layer inputs: ple[l] = (norm(x0 Wplmp^T / sqrt(d)) + Epl[ids] * sqrt(P)) / sqrt(2)
  if (P > 0) {
    float* proj = Act(a_proj_);  // [N, L*P] pre-norm projection (saved)
    float* projn = Act(g_dp1_);  // [N, L*P] normed (scratch)
    float* tok = Act(g_dp2_);    // [N, L*P] token-identity part (scratch)
    ops.LinearForward(x0, W(reg_.per_layer_model_projection), proj, N, d, L * P,
                      1.0f / std::sqrt(static_cast<float>(d)), false);
    ops.RmsNormForward(proj, W(reg_.per_layer_projection_norm), projn, Act(a_rstd_pln_), N * L, P,
                       static_cast<float>(cfg_.rms_norm_eps));
    const int ple_table = reg_.embed_tokens_per_layer;
    if (const float* table = W(ple_table))
      ops.EmbeddingForward(ids, table, tok, N, L * P, std::sqrt(static_cast<float>(P)));
    else  // frozen and left in the checkpoint: the batch's rows, converted on the fly
      t.rows.at(ple_table)->GatherRows(ple_table, ids, N, std::sqrt(static_cast<float>(P)), tok);
    float* ple = Act(a_ple_);  // [L, N, P]
    const float s = static_cast<float>(std::pow(2.0, -0.5));
#pragma omp parallel for schedule(static) if (N * L * P > (1 << 15))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t p = 0; p < P; ++p)
          ple[(l * N + n) * P + p] = (projn[(n * L + l) * P + p] + tok[(n * L + l) * P + p]) * s;
  }

  AttnMask full_mask{b.attention_mask, 0};
  AttnMask sliding_mask{b.attention_mask, cfg_.sliding_window};
  for (int64_t i = 0; i < L; ++i)
    LayerForward(i, t, b, cfg_.layer_types[i] == LayerType::kFull ? full_mask : sliding_mask,
                 hooks);

  // Final norm, tied LM head, softcap.
  float* hN = Act(a_hN_);
  float* logits = Act(a_logits_);
  ops.RmsNormForward(Act(resid_[L]), W(reg_.norm), hN, Act(a_rstd_f_), N, d,
                     static_cast<float>(cfg_.rms_norm_eps));
  if (const float* head = W(reg_.embed_tokens))
    ops.LinearForward(hN, head, logits, N, d, V, 1.0f, false);
  else
    FrozenHeadForward(t, hN, logits, N);
  ops.SoftcapForward(logits, N * V, static_cast<float>(cfg_.final_logit_softcapping));

  ForwardResult r;
  if (b.labels) {
    // Causal shift: position t predicts labels[t+1]; each row's last position predicts nothing.
    for (int64_t bi = 0; bi < b.B; ++bi)
      for (int64_t t = 0; t < b.T; ++t) {
        const int32_t label = t + 1 < b.T ? b.labels[bi * b.T + t + 1] : -100;
        ST_CHECK(label == -100 || (label >= 0 && label < V))
            << "label " << label << " out of range";
        targets_[bi * b.T + t] = label;
      }
    r.loss_sum = ops.CrossEntropyForward(logits, targets_.data(), N, V, &r.num_valid);
  }
  return r;
}

void Gemma4Engine::LayerForward(int64_t i, const ParamTable& t, const Batch& b,
                                const AttnMask& mask, ParamHooks* hooks) {
  const Ops& ops = OpsFor(backend_);
  const LayerParams& lp = reg_.layers[i];
  const LayerActs& a = la_[i];
  const int64_t B = b.B, T = b.T, N = B * T, d = cfg_.hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.HeadDim(i), Hkv = cfg_.KvHeads(i);
  const int64_t F = cfg_.MlpWidth(i), P = cfg_.hidden_size_per_layer_input;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bool full = cfg_.layer_types[i] == LayerType::kFull;
  const float* cos_t = full ? cos_f_.data() : cos_s_.data();
  const float* sin_t = full ? sin_f_.data() : sin_s_.data();
  auto W = [&](int idx) { return t.param[idx]; };

  using Part = ParamHooks::Part;
  if (hooks) hooks->BeforeForward(i, Part::kLayer);
  const float* x_in = Act(resid_[i]);  // [N,d]
  // Attention block: x1 = x_in + norm_pa(o_proj(attn(norm_in(x_in))))
  float* h1 = Act(a.h1);
  ops.RmsNormForward(x_in, W(lp.input_layernorm), h1, Act(a.rstd_in), N, d, eps);
  float* q = Act(a.q);  // [N, H*D] after q_norm and RoPE
  ops.LinearForward(h1, W(lp.q_proj), Act(a.q_raw), N, d, H * D, 1.0f, false);
  ops.RmsNormForward(Act(a.q_raw), W(lp.q_norm), q, Act(a.rstd_q), N * H, D, eps);
  ops.Rope(q, cos_t, sin_t, B, T, H, D, false);
  if (!cfg_.IsKvShared(i)) {
    ops.LinearForward(h1, W(lp.k_proj), Act(a.k_raw), N, d, Hkv * D, 1.0f, false);
    ops.RmsNormForward(Act(a.k_raw), W(lp.k_norm), Act(a.k), Act(a.rstd_k), N * Hkv, D, eps);
    ops.Rope(Act(a.k), cos_t, sin_t, B, T, Hkv, D, false);
    ops.LinearForward(h1, W(lp.v_proj), Act(a.v_raw), N, d, Hkv * D, 1.0f, false);
    ops.RmsNormForward(Act(a.v_raw), nullptr, Act(a.v), Act(a.rstd_v), N * Hkv, D, eps);
  }
  const LayerActs& src = la_[cfg_.KvSourceLayer(i)];
  ops.AttentionForward(q, Act(src.k), Act(src.v), Act(a.o), Act(a.probs), B, T, H, Hkv, D, mask);
  ops.LinearForward(Act(a.o), W(lp.o_proj), Act(a.a), N, H * D, d, 1.0f, false);
  float* x1 = Act(a.x1);
  ops.RmsNormForward(Act(a.a), W(lp.post_attention_layernorm), x1, Act(a.rstd_pa), N, d, eps);
  ops.Add(x1, x_in, N * d);

  // MLP block: x2 = x1 + norm_pff(down(gelu(gate(h2)) * up(h2))), h2 = norm_pf(x1)
  float* h2 = Act(a.h2);
  ops.RmsNormForward(x1, W(lp.pre_feedforward_layernorm), h2, Act(a.rstd_pf), N, d, eps);
  if (hooks) hooks->BeforeForward(i, Part::kMlp);
  ops.LinearForward(h2, W(lp.gate_proj), Act(a.gate), N, d, F, 1.0f, false);
  ops.LinearForward(h2, W(lp.up_proj), Act(a.up), N, d, F, 1.0f, false);
  ops.GeluMulForward(Act(a.gate), Act(a.up), Act(a.hm), N * F);
  ops.LinearForward(Act(a.hm), W(lp.down_proj), Act(a.m), N, F, d, 1.0f, false);
  if (hooks) hooks->AfterForward(i, Part::kMlp);
  float* x2 = Act(a.x2);
  ops.RmsNormForward(Act(a.m), W(lp.post_feedforward_layernorm), x2, Act(a.rstd_pff), N, d, eps);
  ops.Add(x2, x1, N * d);

  // PLE block: x3 = x2 + norm_pp(proj(gelu(gate(x2)) * ple_i)); then the whole stream * scalar.
  float* out = Act(resid_[i + 1]);
  if (P > 0) {
    const float* ple_i = Act(a_ple_) + i * N * P;
    ops.LinearForward(x2, W(lp.per_layer_input_gate), Act(a.pg), N, d, P, 1.0f, false);
    ops.GeluMulForward(Act(a.pg), ple_i, Act(a.g2), N * P);
    ops.LinearForward(Act(a.g2), W(lp.per_layer_projection), Act(a.u), N, P, d, 1.0f, false);
    ops.RmsNormForward(Act(a.u), W(lp.post_per_layer_input_norm), out, Act(a.rstd_pp), N, d, eps);
    ops.Add(out, x2, N * d);
  } else {
    std::memcpy(out, x2, static_cast<size_t>(N * d) * sizeof(float));
  }
  ops.Scale(out, W(lp.layer_scalar)[0], N * d);
  if (hooks) hooks->AfterForward(i, Part::kLayer);
}

// The tied head when embed_tokens is frozen and served from the checkpoint: the vocabulary in
// blocks of kFrozenHeadBlock rows, each converted into one scratch block (allocated at first use,
// then reused), so the fp32 table is never whole. fn(v0, c) runs with rows [v0, v0 + c) in
// head_w_; the table's file pages are released at the end.
void Gemma4Engine::ForEachFrozenHeadBlock(const ParamTable& t,
                                          const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t d = cfg_.hidden_size, V = cfg_.vocab_size, B = kFrozenHeadBlock;
  if (head_w_.size() < B * d)
    head_w_ = AlignedBuffer(B * d, "a block of the frozen LM head (fp32)");
  if (head_y_.size() < max_B_ * max_T_ * B)
    head_y_ = AlignedBuffer(max_B_ * max_T_ * B, "the logits of one vocabulary block");
  const WeightSource* rows = t.rows.at(reg_.embed_tokens);
  for (int64_t v0 = 0; v0 < V; v0 += B) {
    const int64_t c = std::min(B, V - v0);
    rows->Read(reg_.embed_tokens, v0 * d, c * d, head_w_.data());
    fn(v0, c);
  }
  rows->Release(reg_.embed_tokens);
}

void Gemma4Engine::FrozenHeadForward(const ParamTable& t, const float* hN, float* logits,
                                     int64_t N) {
  const Ops& ops = OpsFor(backend_);
  const int64_t d = cfg_.hidden_size, V = cfg_.vocab_size;
  ForEachFrozenHeadBlock(t, [&](int64_t v0, int64_t c) {
    ops.LinearForward(hN, head_w_.data(), head_y_.data(), N, d, c, 1.0f, false);
#pragma omp parallel for schedule(static) if (N * c > (1 << 16))
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(logits + n * V + v0, head_y_.data() + n * c, static_cast<size_t>(c) * 4);
  });
}

void Gemma4Engine::FrozenHeadBackward(const ParamTable& t, const float* dlogits, float* dhN,
                                      int64_t N) {
  const Ops& ops = OpsFor(backend_);
  const int64_t d = cfg_.hidden_size, V = cfg_.vocab_size;
  ForEachFrozenHeadBlock(t, [&](int64_t v0, int64_t c) {
#pragma omp parallel for schedule(static) if (N * c > (1 << 16))
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(head_y_.data() + n * c, dlogits + n * V + v0, static_cast<size_t>(c) * 4);
    ops.LinearBackward(Act(a_hN_), head_w_.data(), head_y_.data(), dhN, nullptr, N, d, c, 1.0f,
                       v0 > 0);
  });
}

void Gemma4Engine::Backward(const ParamTable& t, const Batch& b, float grad_scale,
                            ParamHooks* hooks) {
  ST_CHECK(b.labels != nullptr) << "Backward needs labels";
  const Ops& ops = OpsFor(backend_);
  const int64_t N = b.B * b.T, d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const int64_t P = cfg_.hidden_size_per_layer_input, V = cfg_.vocab_size;
  auto W = [&](int idx) { return t.param[idx]; };
  auto G = [&](int idx) -> float* { return idx >= 0 ? t.grad[idx] : nullptr; };

  // Loss -> logits (in place) -> final norm.
  float* dlogits = Act(a_logits_);
  ops.CrossEntropySoftcapBackward(dlogits, targets_.data(), N, V,
                                  static_cast<float>(cfg_.final_logit_softcapping), grad_scale);
  float* dhN = Act(g_dn_);
  if (const float* head = W(reg_.embed_tokens))
    ops.LinearBackward(Act(a_hN_), head, dlogits, dhN, G(reg_.embed_tokens), N, d, V, 1.0f, false);
  else
    FrozenHeadBackward(t, dlogits, dhN, N);
  float* dx = Act(g_dx_);
  ops.RmsNormBackward(Act(resid_[L]), W(reg_.norm), Act(a_rstd_f_), dhN, dx, G(reg_.norm), N, d,
                      false);

  // K/V gradient accumulators of the owner layers start at zero; consumers add into them.
  for (int64_t i = 0; i < L; ++i)
    if (!cfg_.IsKvShared(i)) {
      std::memset(Act(g_dk_[i]), 0, static_cast<size_t>(N * cfg_.KvHeads(i) * cfg_.HeadDim(i)) * 4);
      std::memset(Act(g_dv_[i]), 0, static_cast<size_t>(N * cfg_.KvHeads(i) * cfg_.HeadDim(i)) * 4);
    }

  AttnMask full_mask{b.attention_mask, 0};
  AttnMask sliding_mask{b.attention_mask, cfg_.sliding_window};
  for (int64_t i = L - 1; i >= 0; --i)
    LayerBackward(i, t, b, cfg_.layer_types[i] == LayerType::kFull ? full_mask : sliding_mask,
                  hooks);

  // dx now holds d loss / d x0 through the residual stream; add the PLE projection path.
  const int32_t* ids = b.input_ids;
  if (P > 0) {
    const float* dple = Act(g_dple_);  // [L,N,P]
    float* dsum = Act(g_dp1_);         // [N, L*P] gradient of (proj_normed + tok)
    const float s = static_cast<float>(std::pow(2.0, -0.5));
#pragma omp parallel for schedule(static) if (N * L * P > (1 << 15))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t p = 0; p < P; ++p) dsum[(n * L + l) * P + p] = dple[(l * N + n) * P + p] * s;
    if (float* g = G(reg_.embed_tokens_per_layer))
      ops.EmbeddingBackward(ids, dsum, g, N, L * P, std::sqrt(static_cast<float>(P)),
                            static_cast<int32_t>(cfg_.pad_token_id));
    float* dproj = Act(g_dp2_);
    ops.RmsNormBackward(Act(a_proj_), W(reg_.per_layer_projection_norm), Act(a_rstd_pln_), dsum,
                        dproj, G(reg_.per_layer_projection_norm), N * L, P, false);
    ops.LinearBackward(Act(resid_[0]), W(reg_.per_layer_model_projection), dproj, dx,
                       G(reg_.per_layer_model_projection), N, d, L * P,
                       1.0f / std::sqrt(static_cast<float>(d)), true);
  }
  if (float* g = G(reg_.embed_tokens))
    ops.EmbeddingBackward(ids, dx, g, N, d, std::sqrt(static_cast<float>(d)),
                          static_cast<int32_t>(cfg_.pad_token_id));
}

void Gemma4Engine::LayerBackward(int64_t i, const ParamTable& t, const Batch& b,
                                 const AttnMask& mask, ParamHooks* hooks) {
  const Ops& ops = OpsFor(backend_);
  const LayerParams& lp = reg_.layers[i];
  const LayerActs& a = la_[i];
  const int64_t B = b.B, T = b.T, N = B * T, d = cfg_.hidden_size;
  const int64_t H = cfg_.num_attention_heads, D = cfg_.HeadDim(i), Hkv = cfg_.KvHeads(i);
  const int64_t F = cfg_.MlpWidth(i), P = cfg_.hidden_size_per_layer_input;
  const bool full = cfg_.layer_types[i] == LayerType::kFull;
  const float* cos_t = full ? cos_f_.data() : cos_s_.data();
  const float* sin_t = full ? sin_f_.data() : sin_s_.data();
  auto W = [&](int idx) { return t.param[idx]; };
  auto G = [&](int idx) -> float* { return idx >= 0 ? t.grad[idx] : nullptr; };
  using Part = ParamHooks::Part;
  if (hooks) hooks->BeforeBackward(i, Part::kLayer);
  float* dx = Act(g_dx_);  // in: d resid[i+1]; out: d resid[i]
  float* dn = Act(g_dn_);
  float* dh = Act(g_dh_);

  ops.Scale(dx, W(lp.layer_scalar)[0], N * d);  // d x3
  if (P > 0) {
    float* dg2 = Act(g_dp1_);
    float* dpg = Act(g_dp2_);
    ops.RmsNormBackward(Act(a.u), W(lp.post_per_layer_input_norm), Act(a.rstd_pp), dx, dn,
                        G(lp.post_per_layer_input_norm), N, d, false);
    ops.LinearBackward(Act(a.g2), W(lp.per_layer_projection), dn, dg2, G(lp.per_layer_projection),
                       N, P, d, 1.0f, false);
    ops.GeluMulBackward(Act(a.pg), Act(a_ple_) + i * N * P, dg2, dpg, Act(g_dple_) + i * N * P,
                        N * P);
    ops.LinearBackward(Act(a.x2), W(lp.per_layer_input_gate), dpg, dx, G(lp.per_layer_input_gate),
                       N, d, P, 1.0f, true);  // dx = d x2
  }
  // MLP block.
  float* dhm = Act(g_df1_);
  float* dgate = Act(g_df2_);
  ops.RmsNormBackward(Act(a.m), W(lp.post_feedforward_layernorm), Act(a.rstd_pff), dx, dn,
                      G(lp.post_feedforward_layernorm), N, d, false);
  if (hooks) hooks->BeforeBackward(i, Part::kMlp);
  ops.LinearBackward(Act(a.hm), W(lp.down_proj), dn, dhm, G(lp.down_proj), N, F, d, 1.0f, false);
  ops.GeluMulBackward(Act(a.gate), Act(a.up), dhm, dgate, /*db=*/dhm, N * F);  // dhm -> d up
  ops.LinearBackward(Act(a.h2), W(lp.gate_proj), dgate, dh, G(lp.gate_proj), N, d, F, 1.0f, false);
  ops.LinearBackward(Act(a.h2), W(lp.up_proj), dhm, dh, G(lp.up_proj), N, d, F, 1.0f, true);
  if (hooks) hooks->AfterBackward(i, Part::kMlp);
  ops.RmsNormBackward(Act(a.x1), W(lp.pre_feedforward_layernorm), Act(a.rstd_pf), dh, dx,
                      G(lp.pre_feedforward_layernorm), N, d, true);  // dx = d x1
  // Attention block.
  float* dq = Act(g_dq_);
  float* dout = Act(g_do_);
  ops.RmsNormBackward(Act(a.a), W(lp.post_attention_layernorm), Act(a.rstd_pa), dx, dn,
                      G(lp.post_attention_layernorm), N, d, false);
  ops.LinearBackward(Act(a.o), W(lp.o_proj), dn, dout, G(lp.o_proj), N, H * D, d, 1.0f, false);
  const LayerActs& src = la_[cfg_.KvSourceLayer(i)];
  float* dk = Act(g_dk_[i]);
  float* dv = Act(g_dv_[i]);
  ops.AttentionBackward(Act(a.q), Act(src.k), Act(src.v), Act(a.probs), dout, dq, dk, dv, B, T, H,
                        Hkv, D, mask);
  ops.Rope(dq, cos_t, sin_t, B, T, H, D, true);
  float* dq_raw = dout;  // d o is consumed
  ops.RmsNormBackward(Act(a.q_raw), W(lp.q_norm), Act(a.rstd_q), dq, dq_raw, G(lp.q_norm), N * H, D,
                      false);
  ops.LinearBackward(Act(a.h1), W(lp.q_proj), dq_raw, dh, G(lp.q_proj), N, d, H * D, 1.0f, false);
  if (!cfg_.IsKvShared(i)) {
    // Every consumer of this layer's K/V is later in the stack, so dk/dv are complete here.
    float* draw = dq;
    ops.Rope(dk, cos_t, sin_t, B, T, Hkv, D, true);
    ops.RmsNormBackward(Act(a.k_raw), W(lp.k_norm), Act(a.rstd_k), dk, draw, G(lp.k_norm), N * Hkv,
                        D, false);
    ops.LinearBackward(Act(a.h1), W(lp.k_proj), draw, dh, G(lp.k_proj), N, d, Hkv * D, 1.0f, true);
    ops.RmsNormBackward(Act(a.v_raw), nullptr, Act(a.rstd_v), dv, draw, nullptr, N * Hkv, D, false);
    ops.LinearBackward(Act(a.h1), W(lp.v_proj), draw, dh, G(lp.v_proj), N, d, Hkv * D, 1.0f, true);
  }
  ops.RmsNormBackward(Act(resid_[i]), W(lp.input_layernorm), Act(a.rstd_in), dh, dx,
                      G(lp.input_layernorm), N, d, true);  // dx = d resid[i]
  if (hooks) hooks->AfterBackward(i, Part::kLayer);
}

double TrainingFlops(const Gemma4Config& cfg, const ParamRegistry& reg, int64_t B, int64_t T) {
  double flops = 6.0 * static_cast<double>(reg.MatmulParams()) * static_cast<double>(B * T);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const int64_t W = cfg.layer_types[i] == LayerType::kFull ? T : cfg.sliding_window;
    double pairs = 0;
    for (int64_t q = 0; q < T; ++q) pairs += static_cast<double>(std::min(q + 1, W));
    flops += 12.0 * static_cast<double>(cfg.num_attention_heads * cfg.HeadDim(i)) * pairs *
             static_cast<double>(B);
  }
  return flops;
}

double EstimateActivationBytes(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq) {
  // Mirrors PlanActivations() to within small per-token terms.
  const double B = static_cast<double>(max_batch), T = static_cast<double>(max_seq), N = B * T;
  const double d = static_cast<double>(cfg.hidden_size),
               H = static_cast<double>(cfg.num_attention_heads);
  const double P = static_cast<double>(cfg.hidden_size_per_layer_input);
  const double L = static_cast<double>(cfg.num_hidden_layers);
  double floats = (L + 1) * N * d + 2 * N * L * P + 2 * N * static_cast<double>(cfg.vocab_size);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const double D = static_cast<double>(cfg.HeadDim(i)), kv = static_cast<double>(cfg.KvHeads(i));
    floats += N * (8 * d + 3 * H * D + 4 * kv * D + 3 * static_cast<double>(cfg.MlpWidth(i)) + P) +
              B * H * T * T;
  }
  return floats * sizeof(float);
}

Status CheckActivationMemory(const Gemma4Config& cfg, int64_t max_batch, int64_t max_seq) {
  const double need = EstimateActivationBytes(cfg, max_batch, max_seq);
  const double have =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && need > have)
    return InvalidArgument(StrCat(
        "a batch of ", max_batch, " x ", max_seq, " tokens needs about ",
        static_cast<int64_t>(need / (1 << 30)), " GiB of activations, more than this machine's ",
        static_cast<int64_t>(have / (1 << 30)), " GiB; lower the batch size or --max-seq-len"));
  return Status::Ok();
}

}  // namespace st
