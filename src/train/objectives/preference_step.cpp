#include "train/objectives/preference_step.h"

#include <chrono>

namespace st {
namespace {

// Global pair and chosen-target counts of a set of batches (one all-reduce; pg null: local).
StatusOr<ObjectiveNorm> GlobalNorm(const std::vector<PairBatch>& batches, comm::ProcessGroup* pg,
                                   const comm::CollectiveOptions& collective) {
  float counts[2] = {0, 0};
  for (const PairBatch& pb : batches) {
    counts[0] += static_cast<float>(pb.pairs());
    const int64_t n = pb.batch.B * pb.batch.T;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = pb.sequence[static_cast<size_t>(t)];
      counts[1] += s >= 0 && s % 2 == 0 && pb.batch.labels[static_cast<size_t>(t)] != kIgnoreIndex;
    }
  }
  if (pg)
    ST_RETURN_IF_ERROR(pg->AllReduce(counts, 2, DType::kF32, comm::ReduceOp::kSum, collective));
  ObjectiveNorm norm;
  norm.pairs = std::max(1.0, static_cast<double>(counts[0]));
  norm.chosen_targets = counts[1];
  return norm;
}

Batch PairBatchOf(const PairBatch& pb) {
  return Batch{pb.batch.input_ids.data(),
               pb.batch.attention_mask.data(),
               pb.batch.labels.data(),
               pb.batch.B,
               pb.batch.T,
               pb.batch.position_ids.data()};
}

// The reference's per-pair sums: from the precomputed table, or a forward of the base model
// (adapters off).
StatusOr<PairLogps> ReferenceLogps(Gemma4Engine& engine, const PairForward& forward,
                                   const PairBatch& pb, std::vector<float>& logp,
                                   const std::vector<float>* table) {
  if (table) {
    PairLogps ref;
    for (int64_t p : pb.pair_ids) {
      ref.chosen.push_back((*table)[static_cast<size_t>(2 * p)]);
      ref.rejected.push_back((*table)[static_cast<size_t>(2 * p + 1)]);
    }
    return ref;
  }
  engine.SetAdapters(false);
  Status s = forward(PairBatchOf(pb));
  engine.SetAdapters(true);
  ST_RETURN_IF_ERROR(s);
  engine.TargetLogProbs(logp.data());
  return SumPairLogps(pb, logp.data());
}

Status AllReduceMetrics(std::vector<double>& sums, comm::ProcessGroup* pg,
                        const comm::CollectiveOptions& collective) {
  if (!pg) return Status::Ok();
  std::vector<float> f(sums.begin(), sums.end());
  ST_RETURN_IF_ERROR(pg->AllReduce(f.data(), static_cast<int64_t>(f.size()), DType::kF32,
                                   comm::ReduceOp::kSum, collective));
  sums.assign(f.begin(), f.end());
  return Status::Ok();
}

}  // namespace

StatusOr<StepResult> PreferenceTrainStep(const StepParts& p, const Objective& objective,
                                         const PreferenceSet& set, std::span<const StepRows> micro,
                                         const BatchingOptions& batching, TrainState& state,
                                         const std::vector<float>* ref_table) {
  using Clock = std::chrono::steady_clock;
  const auto s0 = Clock::now();
  const comm::CollectiveTotals c0 = p.pg.totals();
  const double wait0 = p.fsdp.CommWaitSeconds();
  ST_CHECK(!micro.empty());
  std::vector<PairBatch> batches;
  StepResult out;
  for (const StepRows& rows : micro) {
    batches.push_back(CollatePairs(set, rows, batching, objective.label_prompt()));
    out.real_tokens += batches.back().batch.real_tokens;
    out.tokens += batches.back().batch.B * batches.back().batch.T;
  }
  const auto s1 = Clock::now();
  p.fsdp.ZeroGrad();
  ST_ASSIGN_OR_RETURN(const ObjectiveNorm norm, GlobalNorm(batches, &p.pg, p.collective));
  const PairForward forward = [&p](const Batch& b) { return p.fsdp.Forward(p.engine, b).status(); };
  std::vector<double> sums(objective.metric_names().size(), 0.0);
  std::vector<float> logp, weights;
  for (size_t k = 0; k < batches.size(); ++k) {
    const PairBatch& pb = batches[k];
    const size_t n = static_cast<size_t>(pb.batch.B * pb.batch.T);
    logp.assign(n, 0.0f);
    weights.assign(n, 0.0f);
    PairLogps ref;
    if (objective.needs_reference()) {
      ST_ASSIGN_OR_RETURN(ref, ReferenceLogps(p.engine, forward, pb, logp, ref_table));
    }
    p.engine.SetDropoutSeed(StepDropoutSeed(p.seed, state.global_step, p.pg.rank(), k));
    Batch b = PairBatchOf(pb);
    b.loss_weights = weights.data();
    FsdpModel::Micro m;
    m.sync = p.sync_each_batch || k + 1 == batches.size();
    m.after_forward = [&]() -> Status {
      p.engine.TargetLogProbs(logp.data());
      objective.Compute(pb, logp.data(), objective.needs_reference() ? &ref : nullptr, norm,
                        sums.data(), weights.data());
      return Status::Ok();
    };
    ST_RETURN_IF_ERROR(p.fsdp.ForwardBackward(p.engine, b, m).status());
  }
  ST_RETURN_IF_ERROR(AllReduceMetrics(sums, &p.pg, p.collective));
  out.loss = sums[0];
  for (size_t i = 1; i < sums.size(); ++i)
    out.objective_metrics.emplace_back(objective.metric_names()[i], sums[i]);
  ST_RETURN_IF_ERROR(FinishStep(p, s0, s1, c0, wait0, state, out));
  return out;
}

StatusOr<std::vector<double>> EvaluatePairs(Gemma4Engine& engine, const PairForward& forward,
                                            const Objective& objective, const PreferenceSet& set,
                                            const std::vector<StepRows>& rows,
                                            const BatchingOptions& batching, comm::ProcessGroup* pg,
                                            const comm::CollectiveOptions& collective,
                                            const std::vector<float>* ref_table) {
  std::vector<PairBatch> batches;
  for (const StepRows& r : rows)
    batches.push_back(CollatePairs(set, r, batching, objective.label_prompt()));
  ST_ASSIGN_OR_RETURN(const ObjectiveNorm norm, GlobalNorm(batches, pg, collective));
  std::vector<double> sums(objective.metric_names().size(), 0.0);
  std::vector<float> logp;
  engine.SetDropout(false);
  Status status = Status::Ok();
  for (const PairBatch& pb : batches) {
    logp.assign(static_cast<size_t>(pb.batch.B * pb.batch.T), 0.0f);
    PairLogps ref;
    if (objective.needs_reference()) {
      StatusOr<PairLogps> r = ReferenceLogps(engine, forward, pb, logp, ref_table);
      if (!r.ok()) {
        status = r.status();
        break;
      }
      ref = *std::move(r);
    }
    status = forward(PairBatchOf(pb));
    if (!status.ok()) break;
    engine.TargetLogProbs(logp.data());
    objective.Compute(pb, logp.data(), objective.needs_reference() ? &ref : nullptr, norm,
                      sums.data(), nullptr);
  }
  engine.SetDropout(true);
  ST_RETURN_IF_ERROR(status);
  ST_RETURN_IF_ERROR(AllReduceMetrics(sums, pg, collective));
  return sums;
}

StatusOr<std::vector<double>> PreferenceEvaluate(
    Gemma4Engine& engine, FsdpModel& fsdp, const Objective& objective, const PreferenceSet& set,
    const BatchingOptions& batching, comm::ProcessGroup& pg,
    const comm::CollectiveOptions& collective, const std::vector<float>* ref_table) {
  BatchingOptions b = batching;
  b.padding = PaddingMode::kLongest;
  b.group_by_length = false;
  const PairForward forward = [&](const Batch& batch) {
    return fsdp.Forward(engine, batch).status();
  };
  return EvaluatePairs(engine, forward, objective, set,
                       PlanEpoch(set.pairs, b, pg.size(), pg.rank(), 0), b, &pg, collective,
                       ref_table);
}

StatusOr<std::vector<float>> PrecomputeReferenceLogps(Gemma4Engine& engine, FsdpModel& fsdp,
                                                      const PreferenceSet& set,
                                                      const BatchingOptions& batching,
                                                      comm::ProcessGroup& pg,
                                                      const comm::CollectiveOptions& collective) {
  BatchingOptions b = batching;
  b.padding = PaddingMode::kLongest;
  b.group_by_length = false;
  std::vector<float> table(static_cast<size_t>(2 * set.size()), 0.0f), logp;
  const PairForward forward = [&](const Batch& batch) {
    return fsdp.Forward(engine, batch).status();
  };
  engine.SetDropout(false);
  Status status = Status::Ok();
  for (const StepRows& rows : PlanEpoch(set.pairs, b, pg.size(), pg.rank(), 0)) {
    const PairBatch pb = CollatePairs(set, rows, b, false);
    logp.assign(static_cast<size_t>(pb.batch.B * pb.batch.T), 0.0f);
    StatusOr<PairLogps> ref = ReferenceLogps(engine, forward, pb, logp, nullptr);
    if (!ref.ok()) {
      status = ref.status();
      break;
    }
    for (int64_t k = 0; k < pb.pairs(); ++k) {
      const size_t p = static_cast<size_t>(pb.pair_ids[static_cast<size_t>(k)]);
      table[2 * p] = static_cast<float>(ref->chosen[static_cast<size_t>(k)]);
      table[2 * p + 1] = static_cast<float>(ref->rejected[static_cast<size_t>(k)]);
    }
  }
  engine.SetDropout(true);
  ST_RETURN_IF_ERROR(status);
  // Each pair is one rank's: the sum over ranks is the table (zeros elsewhere add nothing).
  ST_RETURN_IF_ERROR(pg.AllReduce(table.data(), static_cast<int64_t>(table.size()), DType::kF32,
                                  comm::ReduceOp::kSum, collective));
  return table;
}

}  // namespace st
