// Online RL's rollouts (finetune --objective grpo): G completions of each prompt sampled from
// the policy as it is now, through the batched KV-cached decoder (model/decode.h): a prompt is
// computed once and its cache forked to its G sequences, then every unfinished sequence of the
// batch advances by one token per step, one matrix product per weight for all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/decode.h"
#include "model/sampling.h"

namespace st {

struct RolloutOptions {
  SamplingOptions sampling;  // temperature, top-k, top-p, repetition penalty; seed: the round's
  int64_t num_generations = 8;
  int64_t max_completion_length = 256;
  std::vector<int32_t> stops;  // a completion ends after one of these (it is kept)
};

struct Completion {
  int64_t prompt = 0;         // index into the prompts sampled
  std::vector<int32_t> ids;   // the new tokens, the stop token included when there was one
  bool truncated = false;     // max_completion_length reached without a stop token
};

// Completions of prompts[p], G per prompt in prompt order ([p * G, (p + 1) * G)), sampled with
// one Sampler seeded with o.sampling.seed (the same seed, weights and prompts give the same
// tokens). The decoder's batch bounds the sequences in flight (at least G; prompts are taken
// batch / G at a time) and its capacity must hold the longest prompt plus max_completion_length.
StatusOr<std::vector<Completion>> SampleCompletions(Gemma4Decoder& decoder,
                                                    const std::vector<std::vector<int32_t>>& prompts,
                                                    const RolloutOptions& o);

}  // namespace st
