#include "train/rollout.h"

#include <algorithm>
#include <cstring>

namespace st {

StatusOr<std::vector<Completion>> SampleCompletions(
    Gemma4Decoder& dec, const std::vector<std::vector<int32_t>>& prompts, const RolloutOptions& o,
    const NextTurnFn& next_turn) {
  const int64_t G = o.num_generations, V = dec.config().vocab_size;
  ST_CHECK(G >= 1 && dec.batch() >= G) << "a decoder of " << dec.batch() << " for groups of " << G;
  for (size_t p = 0; p < prompts.size(); ++p)
    if (static_cast<int64_t>(prompts[p].size()) + o.max_completion_length > dec.capacity())
      return ResourceExhausted(
          StrCat("prompt ", p, " has ", prompts[p].size(), " tokens: with --max-completion-length ",
                 o.max_completion_length, " it exceeds the decoder's ", dec.capacity()));
  Sampler sampler(o.sampling);
  const int64_t per_wave = dec.batch() / G;
  const size_t Vs = static_cast<size_t>(V);
  std::vector<Completion> out(prompts.size() * static_cast<size_t>(G));
  std::vector<float> logits(static_cast<size_t>(dec.batch() * V)), row(Vs);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(dec.batch()));
  std::vector<int64_t> active, next_active, ended_seq;
  std::vector<size_t> ended;
  std::vector<int32_t> tokens, next_tokens;
  auto stop = [&](int32_t id) {
    return std::find(o.stops.begin(), o.stops.end(), id) != o.stops.end();
  };
  for (size_t p0 = 0; p0 < prompts.size(); p0 += static_cast<size_t>(per_wave)) {
    const size_t p1 = std::min(prompts.size(), p0 + static_cast<size_t>(per_wave));
    auto index = [&](int64_t s) {
      return (p0 + static_cast<size_t>(s / G)) * static_cast<size_t>(G) +
             static_cast<size_t>(s % G);
    };
    // Draws sequence s's next token from `l` [V] and decides what becomes of the sequence: it
    // goes on (next_active), its model turn ended (ended, for the environment), or it is done.
    auto draw = [&](int64_t s, float* l) {
      Completion& c = out[index(s)];
      std::vector<int32_t>& h = history[static_cast<size_t>(s)];
      const int32_t id = sampler.Next(h, {l, Vs});
      c.ids.push_back(id);
      c.sampled.push_back(1);
      h.push_back(id);
      if (stop(id)) {
        if (next_turn && c.turns < o.max_turns &&
            static_cast<int64_t>(c.ids.size()) < o.max_completion_length) {
          ended.push_back(index(s));
          ended_seq.push_back(s);
        }
        return;
      }
      if (static_cast<int64_t>(c.ids.size()) >= o.max_completion_length) {
        c.truncated = true;
        return;
      }
      next_active.push_back(s);
      next_tokens.push_back(id);
    };
    // The environment's next turns of the episodes whose model turn ended: fed, then the model
    // draws the first token of its next turn from them.
    auto continue_episodes = [&]() -> Status {
      if (ended.empty()) return Status::Ok();
      ST_ASSIGN_OR_RETURN(const std::vector<std::optional<std::vector<int32_t>>> next,
                          next_turn(ended, out));
      ST_CHECK(next.size() == ended.size()) << "next_turn answered " << next.size();
      const std::vector<int64_t> seqs = ended_seq;
      ended.clear();
      ended_seq.clear();
      for (size_t k = 0; k < seqs.size(); ++k) {
        if (!next[k] || next[k]->empty()) continue;  // the episode is over
        const int64_t s = seqs[k];
        Completion& c = out[index(s)];
        const std::vector<int32_t>& turn = *next[k];
        if (static_cast<int64_t>(c.ids.size() + turn.size()) + 1 > o.max_completion_length) {
          c.truncated = true;  // the turn and one more token do not fit
          continue;
        }
        // The decoder has not seen the stop token that ended the turn (it was drawn, not fed):
        // it goes in first, then the turn.
        std::vector<int32_t> feed = {c.ids.back()};
        feed.insert(feed.end(), turn.begin(), turn.end());
        c.ids.insert(c.ids.end(), turn.begin(), turn.end());
        c.sampled.insert(c.sampled.end(), turn.size(), 0);
        std::vector<int32_t>& h = history[static_cast<size_t>(s)];
        h.insert(h.end(), turn.begin(), turn.end());
        ST_RETURN_IF_ERROR(dec.Append(s, feed, row.data()));
        ++c.turns;
        draw(s, row.data());
      }
      return Status::Ok();
    };
    next_active.clear();
    next_tokens.clear();
    // Each prompt once, its cache forked to its G sequences, each drawing its first token.
    for (size_t p = p0; p < p1; ++p) {
      const int64_t base = static_cast<int64_t>(p - p0) * G;
      dec.Reset(base);
      ST_RETURN_IF_ERROR(dec.Append(base, prompts[p], logits.data()));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t s = base + g;
        if (g > 0) dec.Fork(base, s);
        out[index(s)].prompt = static_cast<int64_t>(p);
        history[static_cast<size_t>(s)] = prompts[p];
        std::memcpy(row.data(), logits.data(), Vs * sizeof(float));
        draw(s, row.data());
      }
    }
    ST_RETURN_IF_ERROR(continue_episodes());
    // Every unfinished sequence one token further per step.
    while (!next_active.empty()) {
      active.swap(next_active);
      tokens.swap(next_tokens);
      next_active.clear();
      next_tokens.clear();
      ST_RETURN_IF_ERROR(dec.Step(active, tokens, logits.data()));
      for (size_t j = 0; j < active.size(); ++j)
        draw(active[j], logits.data() + static_cast<int64_t>(j) * V);
      ST_RETURN_IF_ERROR(continue_episodes());
    }
  }
  return out;
}

}  // namespace st
