#include "train/train_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace st {

Status EncodeImages(const vision::ImageEncoder* encoder, TokenBatch& tb,
                    vision::VisionSaved* saved) {
  if (saved) saved->images.clear();
  if (tb.images.empty()) return Status::Ok();
  // Only a vision model's template renders image parts (text.images); this cannot happen.
  ST_CHECK(encoder != nullptr) << "a batch with images and no vision model";
  ST_ASSIGN_OR_RETURN(tb.soft_tokens, encoder->Encode(tb.images, saved));
  tb.soft_token_rows =
      static_cast<int64_t>(tb.soft_tokens.size()) / encoder->config().text_hidden_size;
  tb.soft_token_id = encoder->config().image_token_id;
  return Status::Ok();
}

StatusOr<StepResult> TrainStep(const StepParts& p, const TokenizedSet& set,
                               std::span<const StepRows> micro, const BatchingOptions& batching,
                               TrainState& state) {
  // Step metrics: data / compute / comm-wait split and collective totals, measured here and in
  // FsdpModel without changing what is computed or the order of collectives.
  using Clock = std::chrono::steady_clock;
  const auto s0 = Clock::now();
  const comm::CollectiveTotals c0 = p.pg.totals();
  const double wait0 = p.fsdp.CommWaitSeconds();
  ST_CHECK(!micro.empty());
  const size_t K = micro.size();
  std::vector<TokenBatch> tbs;
  // A trained tower: each micro-batch's saved forward and its soft tokens' gradient.
  std::vector<vision::VisionSaved> saved(p.vision_lora ? K : 0);
  std::vector<std::vector<float>> d_soft(saved.size());
  StepResult out;
  int64_t local_targets = 0;
  for (const StepRows& rows : micro) {
    tbs.push_back(CollateStep(set, rows, batching));
    ST_RETURN_IF_ERROR(
        EncodeImages(p.images, tbs.back(), p.vision_lora ? &saved[tbs.size() - 1] : nullptr));
    const TokenBatch& tb = tbs.back();
    out.real_tokens += tb.real_tokens;
    out.tokens += tb.B * tb.T;
    for (int64_t r = 0; r < tb.B; ++r)
      for (int64_t t = 1; t < tb.T; ++t) local_targets += tb.labels[r * tb.T + t] != kIgnoreIndex;
  }
  const auto s1 = Clock::now();
  p.fsdp.ZeroGrad();
  if (p.vision_lora) p.vision_lora->ZeroGrad();
  // Accumulating: the loss mean's denominator is the whole window's targets on every rank.
  float window_targets = static_cast<float>(local_targets);
  if (K > 1)
    ST_RETURN_IF_ERROR(
        p.pg.AllReduce(&window_targets, 1, DType::kF32, comm::ReduceOp::kSum, p.collective));
  ForwardResult r;
  for (size_t k = 0; k < K; ++k) {
    const TokenBatch& tb = tbs[k];
    Batch b = BatchOf(tb);
    const bool tower = p.vision_lora && tb.soft_token_rows > 0;
    if (tower) {
      d_soft[k].resize(tb.soft_tokens.size());
      b.soft_tokens_grad = d_soft[k].data();
    }
    // Dropout masks differ per step, micro-batch and rank (each rank's batch is different data),
    // and are the same when a resumed run redoes a step.
    p.engine.SetDropoutSeed(StepDropoutSeed(p.seed, state.global_step, p.pg.rank(), k));
    if (K == 1) {
      ST_ASSIGN_OR_RETURN(r, p.fsdp.ForwardBackward(p.engine, b));
    } else {
      FsdpModel::Micro m;
      m.global_targets = static_cast<int64_t>(std::llround(window_targets));
      m.sync = p.sync_each_batch || k + 1 == K;
      ST_ASSIGN_OR_RETURN(ForwardResult rk, p.fsdp.ForwardBackward(p.engine, b, m));
      r.loss_sum += rk.loss_sum;  // each already every rank's
      r.num_valid = rk.num_valid;
    }
    if (tower) {
      ST_RETURN_IF_ERROR(p.vision_lora->Backward(saved[k], d_soft[k].data()));
      saved[k] = {};  // the layer inputs are large; the next micro-batch's are already held
    }
  }
  if (p.vision_lora) ST_RETURN_IF_ERROR(p.vision_lora->AllReduce(p.pg, p.collective));
  out.loss = r.Loss();
  ST_RETURN_IF_ERROR(FinishStep(p, s0, s1, c0, wait0, state, out));
  return out;
}

Status FinishStep(const StepParts& p, std::chrono::steady_clock::time_point s0,
                  std::chrono::steady_clock::time_point s1, const comm::CollectiveTotals& c0,
                  double wait0, TrainState& state, StepResult& out) {
  using Clock = std::chrono::steady_clock;
  double clip_s = 0;  // grad_norm -1: rank 0 sums the ranks' squares instead
  // A trained tower's adapter gradients are the same on every rank: rank 0 counts them once.
  const double tower_sq = p.vision_lora && p.pg.rank() == 0 ? p.vision_lora->SumOfSquares() : 0.0;
  if (p.max_grad_norm > 0) {
    const auto k0 = Clock::now();
    ST_ASSIGN_OR_RETURN(out.grad_norm, p.fsdp.ClipGradNorm(p.max_grad_norm, tower_sq));
    if (p.vision_lora) {
      const float coef = ClipCoefficient(out.grad_norm, p.max_grad_norm);
      if (coef < 1.0f) p.vision_lora->Scale(coef);
    }
    clip_s = std::chrono::duration<double>(Clock::now() - k0).count();
  }
  WorkerSample mine;
  if (out.grad_norm < 0)
    mine.grad_sq = static_cast<float>(SumOfSquares(p.fsdp.grads(), p.fsdp.shard_size()) + tower_sq);
  p.fsdp.OptimizerStep(p.adam, ++state.global_step);
  if (p.vision_lora) p.vision_lora->Step(p.adam);
  state.epoch_loss_sum += out.loss;
  ++state.step_in_epoch;
  const auto s2 = Clock::now();
  const comm::CollectiveTotals c1 = p.pg.totals();
  const ProcessMemory mem = ReadProcessMemory();
  mine.step_s = static_cast<float>(std::chrono::duration<double>(s2 - s0).count());
  mine.data_s = static_cast<float>(std::chrono::duration<double>(s1 - s0).count());
  mine.comm_wait_s = static_cast<float>(p.fsdp.CommWaitSeconds() - wait0 + clip_s);
  mine.compute_s = std::max(0.0f, mine.step_s - mine.data_s - mine.comm_wait_s);
  mine.real_tokens = static_cast<float>(out.real_tokens);
  mine.tokens = static_cast<float>(out.tokens);
  mine.rss_mib = static_cast<float>(mem.rss_mib);
  mine.peak_rss_mib = static_cast<float>(mem.peak_mib);
  mine.comm_mib = static_cast<float>((c1.bytes - c0.bytes) / 1048576.0);
  mine.comm_s = static_cast<float>(c1.seconds - c0.seconds);
  // One all_gather of a few floats per step, on every rank, after the optimizer step.
  ST_ASSIGN_OR_RETURN(out.samples, GatherSamples(p.pg, mine, p.collective));
  return Status::Ok();
}

}  // namespace st
