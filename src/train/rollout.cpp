#include "train/rollout.h"

#include <algorithm>
#include <cstring>

namespace st {

StatusOr<std::vector<Completion>> SampleCompletions(Gemma4Decoder& dec,
                                                    const std::vector<std::vector<int32_t>>& prompts,
                                                    const RolloutOptions& o) {
  const int64_t G = o.num_generations, V = dec.config().vocab_size;
  ST_CHECK(G >= 1 && dec.batch() >= G) << "a decoder of " << dec.batch() << " for groups of " << G;
  for (size_t p = 0; p < prompts.size(); ++p)
    if (static_cast<int64_t>(prompts[p].size()) + o.max_completion_length > dec.capacity())
      return ResourceExhausted(StrCat("prompt ", p, " has ", prompts[p].size(),
                                      " tokens: with --max-completion-length ",
                                      o.max_completion_length, " it exceeds the decoder's ",
                                      dec.capacity()));
  Sampler sampler(o.sampling);
  const int64_t per_wave = dec.batch() / G;
  std::vector<Completion> out(prompts.size() * static_cast<size_t>(G));
  std::vector<float> logits(static_cast<size_t>(dec.batch() * V)), first(static_cast<size_t>(V));
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(dec.batch()));
  std::vector<int64_t> active, next_active;
  std::vector<int32_t> tokens;
  auto stop = [&](int32_t id) {
    return std::find(o.stops.begin(), o.stops.end(), id) != o.stops.end();
  };
  for (size_t p0 = 0; p0 < prompts.size(); p0 += static_cast<size_t>(per_wave)) {
    const size_t p1 = std::min(prompts.size(), p0 + static_cast<size_t>(per_wave));
    active.clear();
    tokens.clear();
    // Each prompt once, its cache forked to its G sequences, each drawing its first token.
    for (size_t p = p0; p < p1; ++p) {
      const int64_t base = static_cast<int64_t>(p - p0) * G;
      dec.Reset(base);
      ST_RETURN_IF_ERROR(dec.Append(base, prompts[p], first.data()));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t s = base + g;
        if (g > 0) dec.Fork(base, s);
        Completion& c = out[p * static_cast<size_t>(G) + static_cast<size_t>(g)];
        c.prompt = static_cast<int64_t>(p);
        std::vector<int32_t>& h = history[static_cast<size_t>(s)];
        h = prompts[p];
        std::memcpy(logits.data(), first.data(), static_cast<size_t>(V) * sizeof(float));
        const int32_t id = sampler.Next(h, {logits.data(), static_cast<size_t>(V)});
        c.ids.push_back(id);
        h.push_back(id);
        if (stop(id)) continue;
        if (o.max_completion_length <= 1) {
          c.truncated = true;
          continue;
        }
        active.push_back(s);
        tokens.push_back(id);
      }
    }
    // Every unfinished sequence one token further per step.
    while (!active.empty()) {
      ST_RETURN_IF_ERROR(dec.Step(active, tokens, logits.data()));
      next_active.clear();
      std::vector<int32_t> next_tokens;
      for (size_t j = 0; j < active.size(); ++j) {
        const int64_t s = active[j];
        const size_t p = p0 + static_cast<size_t>(s / G);
        Completion& c = out[p * static_cast<size_t>(G) + static_cast<size_t>(s % G)];
        std::vector<int32_t>& h = history[static_cast<size_t>(s)];
        const int32_t id =
            sampler.Next(h, {logits.data() + static_cast<int64_t>(j) * V, static_cast<size_t>(V)});
        c.ids.push_back(id);
        h.push_back(id);
        if (stop(id)) continue;
        if (static_cast<int64_t>(c.ids.size()) >= o.max_completion_length) {
          c.truncated = true;
          continue;
        }
        next_active.push_back(s);
        next_tokens.push_back(id);
      }
      active.swap(next_active);
      tokens.swap(next_tokens);
    }
  }
  return out;
}

}  // namespace st
