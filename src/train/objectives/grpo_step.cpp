#include "train/objectives/grpo_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

namespace st {
namespace {

// The policy as the trainer holds it now: trainable tensors gathered from the FSDP shards, the
// frozen rest served by the run's source (the checkpoint's mapped file).
class PolicyWeights : public WeightSource {
 public:
  PolicyWeights(const ParamRegistry& reg, const WeightSource& base,
                const std::vector<std::vector<float>>& gathered)
      : WeightSource(reg), base_(base), gathered_(gathered) {}
  void Read(int e, int64_t begin, int64_t count, float* dst) const override {
    const std::vector<float>& g = gathered_[static_cast<size_t>(e)];
    if (g.empty()) return base_.Read(e, begin, count, dst);
    std::memcpy(dst, g.data() + begin, static_cast<size_t>(count) * sizeof(float));
  }
  void GatherRows(int e, const int32_t* ids, int64_t n, float scale, float* out) const override {
    if (gathered_[static_cast<size_t>(e)].empty()) return base_.GatherRows(e, ids, n, scale, out);
    WeightSource::GatherRows(e, ids, n, scale, out);
  }
  void Release(int e, int64_t begin, int64_t count) const override {
    if (gathered_[static_cast<size_t>(e)].empty()) base_.Release(e, begin, count);
  }
  DType dtype() const override { return base_.dtype(); }

 private:
  const WeightSource& base_;
  const std::vector<std::vector<float>>& gathered_;
};

// The seed of a round's sampler: differs per round and rank, and is the same when a resumed run
// redoes the round (it starts at the same global step).
uint64_t RoundSeed(uint64_t seed, int64_t global_step, int rank) {
  return StepDropoutSeed(seed ^ 0x6a09e667f3bcc909ull, global_step, rank, 0x5a);
}

// The rows of one micro-batch's completions: prompt then completion, padded on the right to the
// longest; the completion's tokens the model drew are the labels (an environment's turns are not;
// none for a truncated completion with --mask-truncated-completions).
TokenBatch CompletionRows(const PromptSet& prompts, const std::vector<int64_t>& prompt_ids,
                          const std::vector<const Completion*>& done, bool mask_truncated,
                          int32_t pad_id) {
  TokenBatch tb;
  tb.B = static_cast<int64_t>(done.size());
  for (const Completion* c : done) {
    const int64_t p = prompt_ids[static_cast<size_t>(c->prompt)];
    tb.T = std::max(tb.T, prompts.prompts.length(p) + static_cast<int64_t>(c->ids.size()));
  }
  const size_t n = static_cast<size_t>(tb.B * tb.T);
  tb.input_ids.assign(n, pad_id);
  tb.attention_mask.assign(n, 0);
  tb.labels.assign(n, kIgnoreIndex);
  for (int64_t b = 0; b < tb.B; ++b) {
    const Completion& c = *done[static_cast<size_t>(b)];
    const int64_t p = prompt_ids[static_cast<size_t>(c.prompt)];
    const int32_t* pi =
        prompts.prompts.ids.data() + prompts.prompts.offsets[static_cast<size_t>(p)];
    const int64_t lp = prompts.prompts.length(p), lc = static_cast<int64_t>(c.ids.size());
    for (int64_t t = 0; t < lp + lc; ++t) {
      const size_t k = static_cast<size_t>(b * tb.T + t);
      tb.input_ids[k] = t < lp ? pi[t] : c.ids[static_cast<size_t>(t - lp)];
      tb.attention_mask[k] = 1;
      if (t >= lp && !(mask_truncated && c.truncated) && c.sampled[static_cast<size_t>(t - lp)])
        tb.labels[k] = tb.input_ids[k];
    }
    tb.real_tokens += lp + lc;
  }
  return tb;
}

}  // namespace

int64_t SequencesInFlight(int64_t sequences, int64_t G, int64_t max_in_flight) {
  return std::max<int64_t>(G, std::min<int64_t>(sequences, max_in_flight / G * G));
}

double GrpoSamplerBytes(const Gemma4Config& cfg, const ParamRegistry& reg,
                        const std::vector<bool>& trainable, int64_t prompt_len,
                        int64_t max_completion_length, int64_t sequences_per_round, int64_t G,
                        Precision precision) {
  double gathered = 0;
  for (int e = 0; e < reg.layout.size(); ++e)
    if (trainable[static_cast<size_t>(e)])
      gathered += 4.0 * static_cast<double>(reg.layout.entry(e).numel);
  const DType storage = precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  const int64_t in_flight = SequencesInFlight(sequences_per_round, G);
  return DecodeWeights::Bytes(reg, storage) + gathered +
         Gemma4Decoder::Bytes(cfg, prompt_len + max_completion_length, 128, in_flight) +
         4.0 * static_cast<double>(in_flight + 1) * static_cast<double>(cfg.vocab_size);
}

StatusOr<StepResult> GrpoTrainStep(const StepParts& p, GrpoRun& run,
                                   std::span<const StepRows> micro, TrainState& state,
                                   bool new_round) {
  using Clock = std::chrono::steady_clock;
  const auto s0 = Clock::now();
  const comm::CollectiveTotals c0 = p.pg.totals();
  const double wait0 = p.fsdp.CommWaitSeconds();
  const GrpoOptions& o = run.options;
  const int64_t G = o.num_generations;
  const ParamRegistry& reg = *run.registry;
  StepResult out;
  if (new_round || run.round.empty()) {
    // This rank's prompts, micro-batch by micro-batch.
    std::vector<int64_t> prompt_ids;
    std::vector<size_t> micro_end;
    for (const StepRows& rows : micro) {
      for (const std::vector<int64_t>& row : rows)
        for (int64_t e : row) prompt_ids.push_back(e);
      micro_end.push_back(prompt_ids.size());
    }
    // The policy's weights as they are now (every rank gathers every trainable tensor), into the
    // memory of the previous round: a fresh copy of the model each round spent up to 0.9 s of a
    // gemma4-small step faulting its pages in.
    std::vector<std::vector<float>>& gathered = run.gathered;
    gathered.resize(static_cast<size_t>(reg.layout.size()));
    for (int e = 0; e < reg.layout.size(); ++e) {
      if (!p.fsdp.trainable(e)) continue;
      gathered[static_cast<size_t>(e)].resize(static_cast<size_t>(reg.layout.entry(e).numel));
      ST_RETURN_IF_ERROR(p.fsdp.GatherTensor(e, gathered[static_cast<size_t>(e)].data()));
    }
    const PolicyWeights policy(reg, p.fsdp.weights(), gathered);
    const DType storage = run.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
    if (run.decode_weights)
      run.decode_weights->Refill(reg, policy);
    else
      run.decode_weights = std::make_unique<DecodeWeights>(reg, policy, storage);
    const DecodeWeights& weights = *run.decode_weights;
    int64_t longest = 0;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t e : prompt_ids) {
      const int32_t* ids =
          run.prompts->prompts.ids.data() + run.prompts->prompts.offsets[static_cast<size_t>(e)];
      prompts.emplace_back(ids, ids + run.prompts->prompts.length(e));
      longest = std::max(longest, run.prompts->prompts.length(e));
    }
    const int64_t in_flight =
        SequencesInFlight(static_cast<int64_t>(prompts.size()) * G, G, run.max_in_flight);
    Gemma4Decoder decoder(run.config, reg, weights, longest + o.max_completion_length, 128,
                          run.precision, in_flight);
    RolloutOptions ro = run.rollout;
    ro.sampling.seed = RoundSeed(run.rollout.sampling.seed, state.global_step, p.pg.rank());
    // Multi-turn: the episode's messages after the prompt, per completion.
    std::vector<nlohmann::json> episode(prompts.size() * static_cast<size_t>(G),
                                        nlohmann::json::array());
    std::vector<int64_t> recorded(episode.size(), 0);  // model turns in episode[i]
    auto model_turn = [&](const Completion& c) {       // the tokens of its last model turn
      size_t begin = c.ids.size();
      while (begin > 0 && c.sampled[begin - 1]) --begin;
      return std::span<const int32_t>(c.ids).subspan(begin);
    };
    NextTurnFn next_turn;
    if (run.environment)
      next_turn = [&](const std::vector<size_t>& ended, const std::vector<Completion>& all) {
        std::vector<Environment::EndedTurn> turns;
        for (size_t i : ended) {
          const Completion& c = all[i];
          const int64_t e = prompt_ids[static_cast<size_t>(c.prompt)];
          turns.push_back(
              {model_turn(c), run.prompts->rows[static_cast<size_t>(e)], c.turns, &episode[i]});
          ++recorded[i];
        }
        return run.environment->Next(turns);
      };
    const auto g0 = Clock::now();
    ST_ASSIGN_OR_RETURN(std::vector<Completion> done,
                        SampleCompletions(decoder, prompts, ro, next_turn));
    const double generate_s = std::chrono::duration<double>(Clock::now() - g0).count();
    // Rewards: the row, the prompt as the row has it, the completion (text, or an assistant turn
    // after a conversational prompt) and its ids.
    const size_t N = done.size(), F = run.rewards.size();
    std::vector<nlohmann::json> inputs(N);
    for (size_t i = 0; i < N; ++i) {
      const Completion& c = done[i];
      const int64_t e = prompt_ids[static_cast<size_t>(c.prompt)];
      nlohmann::json in = run.prompts->rows[static_cast<size_t>(e)];
      if (run.environment) {  // an episode: every turn after the prompt, as messages
        nlohmann::json turns = episode[i];
        if (c.turns > recorded[i])  // the last model turn, not shown to the environment
          turns.push_back(run.environment->AssistantMessage(model_turn(c)));
        in["completion"] = std::move(turns);
      } else if (run.prompts->conversational(e)) {
        in["completion"] = nlohmann::json::array(
            {{{"role", "assistant"}, {"content", run.tokenizer->Decode(model_turn(c), true)}}});
      } else {
        in["completion"] = run.tokenizer->Decode(c.ids, true);
      }
      in["completion_ids"] = c.ids;
      inputs[i] = std::move(in);
    }
    // Per completion: each function's reward, its length and whether it was cut; every rank's.
    const size_t row = F + 2;
    std::vector<float> mine(N * row), all(N * row * static_cast<size_t>(p.pg.size()));
    for (size_t f = 0; f < F; ++f) {
      ST_ASSIGN_OR_RETURN(std::vector<double> r, run.rewards[f]->Score(inputs));
      for (size_t i = 0; i < N; ++i) mine[i * row + f] = static_cast<float>(r[i]);
    }
    for (size_t i = 0; i < N; ++i) {
      mine[i * row + F] = static_cast<float>(done[i].ids.size());
      mine[i * row + F + 1] = done[i].truncated ? 1.0f : 0.0f;
    }
    ST_RETURN_IF_ERROR(p.pg.AllGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()),
                                      DType::kF32, p.collective));
    const size_t total = N * static_cast<size_t>(p.pg.size());
    std::vector<std::vector<double>> rewards(total, std::vector<double>(F));
    double len_sum = 0, len_min = 1e300, len_max = 0, cut = 0, term_sum = 0, term_n = 0;
    for (size_t i = 0; i < total; ++i) {
      for (size_t f = 0; f < F; ++f) rewards[i][f] = all[i * row + f];
      const double len = all[i * row + F];
      len_sum += len, len_min = std::min(len_min, len), len_max = std::max(len_max, len);
      if (all[i * row + F + 1] > 0.5f) {
        ++cut;
      } else {
        term_sum += len;
        ++term_n;
      }
    }
    const GroupAdvantagesResult adv =
        GroupAdvantages(rewards, o.reward_weights, G, o.scale_rewards);
    auto& m = run.round_metrics;
    m.clear();
    m.emplace_back("reward", adv.reward);
    m.emplace_back("reward_std", adv.reward_std);
    m.emplace_back("frac_reward_zero_std", adv.frac_reward_zero_std);
    for (size_t f = 0; f < F; ++f) {
      m.emplace_back("rewards/" + run.rewards[f]->name() + "/mean", adv.func_mean[f]);
      m.emplace_back("rewards/" + run.rewards[f]->name() + "/std", adv.func_std[f]);
    }
    m.emplace_back("completions/mean_length", len_sum / static_cast<double>(total));
    m.emplace_back("completions/min_length", len_min);
    m.emplace_back("completions/max_length", len_max);
    m.emplace_back("completions/clipped_ratio", cut / static_cast<double>(total));
    m.emplace_back("completions/mean_terminated_length",
                   term_n > 0 ? term_sum / term_n : std::numeric_limits<double>::quiet_NaN());
    m.emplace_back("generate_s", generate_s);
    run.round_completions = nlohmann::json::array();
    for (size_t i = 0; i < N && static_cast<int64_t>(i) < run.log_completions; ++i) {
      const size_t g = static_cast<size_t>(p.pg.rank()) * N + i;  // in the gathered batch
      nlohmann::json c = {{"prompt", inputs[i]["prompt"]},
                          {"completion", inputs[i]["completion"]},
                          {"advantage", adv.advantages[g]}};
      double total = 0;
      bool any = false;
      for (size_t f = 0; f < F; ++f) {
        const double r = rewards[g][f];
        c["rewards"][run.rewards[f]->name()] = std::isnan(r) ? nlohmann::json() : nlohmann::json(r);
        if (!std::isnan(r)) total += r * (o.reward_weights.empty() ? 1.0 : o.reward_weights[f]);
        any |= !std::isnan(r);
      }
      c["reward"] = any ? nlohmann::json(total) : nlohmann::json();
      run.round_completions.push_back(std::move(c));
    }
    // The round's training rows, micro-batch by micro-batch.
    run.round.clear();
    size_t begin = 0;
    for (size_t k = 0; k < micro_end.size(); ++k) {
      GrpoRun::Micro mb;
      std::vector<const Completion*> part;
      for (size_t i = begin * static_cast<size_t>(G); i < micro_end[k] * static_cast<size_t>(G);
           ++i) {
        part.push_back(&done[i]);
        mb.advantages.push_back(adv.advantages[static_cast<size_t>(p.pg.rank()) * N + i]);
      }
      mb.batch = CompletionRows(*run.prompts, prompt_ids, part, o.mask_truncated_completions,
                                run.tokenizer->pad_id() >= 0 ? run.tokenizer->pad_id() : 0);
      begin = micro_end[k];
      run.round.push_back(std::move(mb));
    }
    // The log-probs the round keeps: the reference's (beta > 0) and, when the round serves
    // several steps, the policy's at sampling.
    p.engine.SetDropout(false);
    p.engine.SetLogitTemperature(static_cast<float>(
        run.rollout.sampling.temperature > 0 ? run.rollout.sampling.temperature : 1.0));
    Status s = Status::Ok();
    for (GrpoRun::Micro& mb : run.round) {
      const size_t n = static_cast<size_t>(mb.batch.B * mb.batch.T);
      if (o.beta != 0) {
        if (run.reference_is_base) p.engine.SetAdapters(false);
        if (run.reference_in_fsdp) p.fsdp.UseReference(true);
        s = p.fsdp.Forward(p.engine, BatchOf(mb.batch)).status();
        if (run.reference_in_fsdp) p.fsdp.UseReference(false);
        p.engine.SetAdapters(true);
        if (!s.ok()) break;
        mb.ref_logp.assign(n, 0.0f);
        p.engine.TargetLogProbs(mb.ref_logp.data());
      }
      if (o.num_iterations > 1) {
        s = p.fsdp.Forward(p.engine, BatchOf(mb.batch)).status();
        if (!s.ok()) break;
        mb.old_logp.assign(n, 0.0f);
        p.engine.TargetLogProbs(mb.old_logp.data());
      }
    }
    p.engine.SetDropout(true);
    p.engine.SetLogitTemperature(1.0f);
    ST_RETURN_IF_ERROR(s);
  }
  for (const GrpoRun::Micro& mb : run.round) {
    out.real_tokens += mb.batch.real_tokens;
    out.tokens += mb.batch.B * mb.batch.T;
  }
  const auto s1 = Clock::now();
  p.fsdp.ZeroGrad();
  // dapo's normaliser: the step's completion tokens over every rank.
  float tokens = 0;
  for (const GrpoRun::Micro& mb : run.round)
    for (int32_t l : mb.batch.labels) tokens += l != kIgnoreIndex;
  ST_RETURN_IF_ERROR(p.pg.AllReduce(&tokens, 1, DType::kF32, comm::ReduceOp::kSum, p.collective));
  GrpoNorm norm;
  norm.world = p.pg.size();
  norm.micro_batches = static_cast<int64_t>(run.round.size());
  norm.global_tokens = tokens;
  std::vector<double> sums(GrpoLossMetricNames().size(), 0.0);
  std::vector<float> logp, weights;
  std::vector<uint8_t> mask;
  p.engine.SetLogitTemperature(static_cast<float>(
      run.rollout.sampling.temperature > 0 ? run.rollout.sampling.temperature : 1.0));
  p.engine.SetComputeEntropy(true);
  std::vector<float> entropy;
  std::vector<GrpoClipExtremes> extremes(run.round.size());
  Status status = Status::Ok();
  for (size_t k = 0; k < run.round.size(); ++k) {
    const GrpoRun::Micro& mb = run.round[k];
    const size_t n = static_cast<size_t>(mb.batch.B * mb.batch.T);
    logp.assign(n, 0.0f);
    entropy.assign(n, 0.0f);
    weights.assign(n, 0.0f);
    mask.resize(n);
    for (size_t i = 0; i < n; ++i) mask[i] = mb.batch.labels[i] != kIgnoreIndex;
    p.engine.SetDropoutSeed(StepDropoutSeed(p.seed, state.global_step, p.pg.rank(), k));
    Batch b = BatchOf(mb.batch);
    b.loss_weights = weights.data();
    FsdpModel::Micro m;
    m.sync = p.sync_each_batch || k + 1 == run.round.size();
    m.after_forward = [&]() -> Status {
      p.engine.TargetLogProbs(logp.data());
      p.engine.TargetEntropies(entropy.data());
      GrpoTokens t;
      t.B = mb.batch.B;
      t.T = mb.batch.T;
      t.logp = logp.data();
      t.old_logp = mb.old_logp.empty() ? nullptr : mb.old_logp.data();
      t.ref_logp = mb.ref_logp.empty() ? nullptr : mb.ref_logp.data();
      t.mask = mask.data();
      t.advantages = mb.advantages.data();
      t.entropy = entropy.data();
      GrpoTokenLoss(o, t, norm, sums, weights.data(), &extremes[k]);
      return Status::Ok();
    };
    status = p.fsdp.ForwardBackward(p.engine, b, m).status();
    if (!status.ok()) break;
  }
  p.engine.SetLogitTemperature(1.0f);
  p.engine.SetComputeEntropy(false);
  ST_RETURN_IF_ERROR(status);
  std::vector<float> f(sums.begin(), sums.end());
  ST_RETURN_IF_ERROR(p.pg.AllReduce(f.data(), static_cast<int64_t>(f.size()), DType::kF32,
                                    comm::ReduceOp::kSum, p.collective));
  sums.assign(f.begin(), f.end());
  // Each micro-batch's clip extremes over every rank's completions (MIN and MAX all-reduces).
  std::vector<float> lo, hi;
  for (const GrpoClipExtremes& e : extremes) {
    lo.push_back(static_cast<float>(e.low_min));
    hi.push_back(static_cast<float>(e.high_max));
  }
  const int64_t K = static_cast<int64_t>(lo.size());
  ST_RETURN_IF_ERROR(p.pg.AllReduce(lo.data(), K, DType::kF32, comm::ReduceOp::kMin, p.collective));
  ST_RETURN_IF_ERROR(p.pg.AllReduce(hi.data(), K, DType::kF32, comm::ReduceOp::kMax, p.collective));
  for (size_t k = 0; k < extremes.size(); ++k) extremes[k] = {lo[k], hi[k]};
  out.loss = sums[0];
  out.objective_metrics = run.round_metrics;
  if (new_round && p.pg.rank() == 0) out.completions = run.round_completions;
  for (auto& kv : FinishGrpoMetrics(o, sums, extremes))
    out.objective_metrics.push_back(std::move(kv));
  ST_RETURN_IF_ERROR(FinishStep(p, s0, s1, c0, wait0, state, out));
  return out;
}

}  // namespace st
