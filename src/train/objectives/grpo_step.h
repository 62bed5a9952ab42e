// One optimizer step of GRPO (--objective grpo) on every rank: at the start of a generation round
// the rank's prompts are sampled G times each with the policy's current weights (train/rollout.h
// over the batched decoder; the weights gathered from the FSDP shards, LoRA merged, no reload
// from disk), scored by the reward functions (train/rewards.h), the rewards of every rank
// gathered for the group advantages (objectives/grpo.h); then each micro-batch of completions
// runs forward (at the sampling temperature), the GRPO loss becomes per-token weights and the
// backward differentiates it; the step ends in train_step.h's FinishStep. With --num-iterations
// N a round's completions serve N optimizer steps (the ratio to the round's log-probs then
// moves away from 1 and clipping acts).
// Collectives, the same on every rank: the gathers of the trainable tensors (GatherTensor, in
// entry order) and one all-gather of the rewards per round; per micro-batch the reference's and
// the round's forwards when needed; one all-reduce of the token count, ForwardBackward's,
// FinishStep's and one all-reduce of the metrics per step.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "train/environment.h"
#include "train/objectives/grpo.h"
#include "train/rewards.h"
#include "train/rollout.h"
#include "train/train_step.h"

namespace st {

// What a GRPO run keeps from step to step.
struct GrpoRun {
  GrpoOptions options;
  RolloutOptions rollout;  // sampling (its seed: the run's), G, completion length, stop tokens
  std::vector<std::unique_ptr<RewardFunction>> rewards;  // the --reward ones, then the commands
  const PromptSet* prompts = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ParamRegistry* registry = nullptr;
  Gemma4Config config;
  Precision precision = Precision::kFp32;  // of the decoder's prompt products and its weights
  int64_t max_in_flight = 64;              // sequences decoded together (a multiple of G)
  // The reference of the KL term (beta > 0) is the model the run started from: with LoRA the
  // base with the adapters off; when trained tensors themselves move (full fine-tuning,
  // --modules-to-save) the FSDP shards kept at the start too (FsdpModel::UseReference).
  bool reference_is_base = false;
  bool reference_in_fsdp = false;
  int64_t log_completions = 0;  // completions of rank 0 recorded per step (0: none)
  // Multi-turn (--environment-command): the renderer of the environment's user turns (as the
  // chat template continues a conversation) and the program; null: one turn.
  std::unique_ptr<ExampleRenderer> renderer;
  std::unique_ptr<Environment> environment;

  // The sampler's copy of the policy, refilled each round: the gathered trainable tensors and the
  // decoder's weights (their memory kept from round to round).
  std::vector<std::vector<float>> gathered;
  std::unique_ptr<DecodeWeights> decode_weights;

  // The current round: this rank's completions as training rows, per micro-batch.
  struct Micro {
    TokenBatch batch;
    std::vector<double> advantages;         // [B]
    std::vector<float> old_logp, ref_logp;  // [B*T] when needed
  };
  std::vector<Micro> round;
  std::vector<std::pair<std::string, double>> round_metrics;  // reward, completions/..., per round
  nlohmann::json round_completions;  // --log-completions: this rank's first ones, with rewards
};

// The sequences decoded together for `sequences` completions in groups of G: whole groups, at
// most max_in_flight (64 by default; at least one group).
int64_t SequencesInFlight(int64_t sequences, int64_t G, int64_t max_in_flight = 64);

// Bytes a round's sampler holds on a worker (the memory plan's term): the decoder's copy of the
// policy (DecodeWeights, in bf16 with --precision bf16), the gathered trainable tensors it is
// built from, and the KV cache and scratch of SequencesInFlight sequences of prompt_len +
// max_completion_length tokens.
double GrpoSamplerBytes(const Gemma4Config& cfg, const ParamRegistry& reg,
                        const std::vector<bool>& trainable, int64_t prompt_len,
                        int64_t max_completion_length, int64_t sequences_per_round, int64_t G,
                        Precision precision);

// new_round: sample and score (the first step of a round), else reuse run.round.
StatusOr<StepResult> GrpoTrainStep(const StepParts& parts, GrpoRun& run,
                                   std::span<const StepRows> micro, TrainState& state,
                                   bool new_round);

}  // namespace st
