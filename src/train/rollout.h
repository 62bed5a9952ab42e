// Online RL's rollouts (finetune --objective grpo): G completions of each prompt sampled from
// the policy as it is now, through the batched KV-cached decoder (model/decode.h): a prompt is
// computed once and its cache forked to its G sequences, then every unfinished sequence of the
// batch advances by one token per step, one matrix product per weight for all of them. With an
// environment (multi-turn), a model turn that ends at a stop token may be answered by a next turn
// whose tokens are fed to that sequence before the model answers again.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/status.h"
#include "model/decode.h"
#include "model/sampling.h"

namespace st {

struct RolloutOptions {
  SamplingOptions sampling;  // temperature, top-k, top-p, repetition penalty; seed: the round's
  int64_t num_generations = 8;
  int64_t max_completion_length = 256;  // every token after the prompt, the environment's too
  std::vector<int32_t> stops;           // a model turn ends after one of these (it is kept)
  int64_t max_turns = 1;                // model turns per episode (> 1 only with an environment)
};

struct Completion {
  int64_t prompt = 0;            // index into the prompts sampled
  std::vector<int32_t> ids;      // the tokens after the prompt, stop tokens included
  std::vector<uint8_t> sampled;  // per token of ids: 1 = drawn from the model, 0 = environment's
  bool truncated = false;        // max_completion_length reached inside a model turn
  int64_t turns = 1;             // model turns
};

// Multi-turn: the completions (indices into `all`) whose model turn just ended at a stop token;
// returns, for each, the tokens of the next turn to feed (the model then answers again), or
// nullopt when the episode is over.
using NextTurnFn = std::function<StatusOr<std::vector<std::optional<std::vector<int32_t>>>>(
    const std::vector<size_t>& ended, const std::vector<Completion>& all)>;

// Completions of prompts[p], G per prompt in prompt order ([p * G, (p + 1) * G)), sampled with
// one Sampler seeded with o.sampling.seed (the same seed, weights, prompts and environment
// answers give the same tokens). The decoder's batch bounds the sequences in flight (at least G;
// prompts are taken batch / G at a time) and its capacity must hold the longest prompt plus
// max_completion_length. next_turn (with o.max_turns > 1) continues episodes.
StatusOr<std::vector<Completion>> SampleCompletions(
    Gemma4Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
    const RolloutOptions& o, const NextTurnFn& next_turn = {});

}  // namespace st
