#include "data/preference.h"

#include <algorithm>
#include <string>

namespace st {
namespace {

size_t CommonPrefixLength(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

Status TokenizePreference(const InstructionRecord& r, const Tokenizer& tok,
                          const ExampleRenderer* chat, PreferenceTokens* out) {
  std::vector<int32_t> prompt, whole_c, whole_r;
  if (r.conversational) {
    if (!chat)
      return InvalidArgument("conversational preference data needs a chat template (gemma-chat)");
    std::vector<ChatMessage> turns = r.prompt_turns;
    ST_RETURN_IF_ERROR(chat->RenderConversation(turns, true, &prompt));
    turns.insert(turns.end(), r.chosen_turns.begin(), r.chosen_turns.end());
    ST_RETURN_IF_ERROR(chat->RenderConversation(turns, false, &whole_c));
    turns.resize(r.prompt_turns.size());
    turns.insert(turns.end(), r.rejected_turns.begin(), r.rejected_turns.end());
    ST_RETURN_IF_ERROR(chat->RenderConversation(turns, false, &whole_r));
  } else {
    std::string eos;
    if (tok.eos_id() >= 0) eos = tok.IdToToken(tok.eos_id());
    const std::string chosen = EndsWith(r.chosen, eos) ? r.chosen : r.chosen + eos;
    const std::string rejected = EndsWith(r.rejected, eos) ? r.rejected : r.rejected + eos;
    prompt = tok.Encode(r.prompt);
    whole_c = tok.Encode(r.prompt + chosen);
    whole_r = tok.Encode(r.prompt + rejected);
  }
  const size_t p =
      std::min(CommonPrefixLength(prompt, whole_c), CommonPrefixLength(prompt, whole_r));
  out->prompt_diverged = p < prompt.size();
  out->prompt.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(p));
  out->chosen.assign(whole_c.begin() + static_cast<std::ptrdiff_t>(p), whole_c.end());
  out->rejected.assign(whole_r.begin() + static_cast<std::ptrdiff_t>(p), whole_r.end());
  return Status::Ok();
}

bool PreferenceSet::Add(const PreferenceTokens& t, int64_t line) {
  const int64_t P = static_cast<int64_t>(t.prompt.size());
  if (P >= max_len) {
    ++dropped;
    return false;
  }
  prompt_diverged += t.prompt_diverged;
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  int64_t chosen_tokens = 0;
  for (const std::vector<int32_t>* side : {&t.chosen, &t.rejected}) {
    const int64_t n = std::min<int64_t>(P + static_cast<int64_t>(side->size()), max_len);
    truncated += n < P + static_cast<int64_t>(side->size());
    for (int64_t k = 0; k < n; ++k) {
      ids.push_back(k < P ? t.prompt[k] : (*side)[k - P]);
      trained.push_back(k < P ? 0 : 1);
    }
    if (side == &t.chosen) chosen_tokens = n;
  }
  pairs.Add(ids, trained);
  chosen_len.push_back(chosen_tokens);
  prompt_len.push_back(P);
  lines.push_back(line);
  return true;
}

PairBatch CollatePairs(const PreferenceSet& set, const StepRows& rows,
                       const BatchingOptions& options, bool label_prompt) {
  PairBatch out;
  TokenBatch& b = out.batch;
  const int64_t cap = options.max_seq_len;
  int64_t fullest = 0;
  for (const std::vector<int64_t>& r : rows) {
    int64_t fill = 0;
    for (int64_t p : r) fill += set.pairs.length(p);
    fullest = std::max(fullest, fill);
  }
  ST_CHECK(fullest <= cap) << "a row of " << fullest << " pair tokens > " << cap;
  b.B = rows.empty() ? 1 : static_cast<int64_t>(rows.size());
  b.T = options.padding == PaddingMode::kMaxLength && !rows.empty()
            ? cap
            : std::min(cap, std::max<int64_t>(8, (fullest + 7) / 8 * 8));
  const size_t n = static_cast<size_t>(b.B * b.T);
  b.input_ids.assign(n, options.pad_id);
  b.attention_mask.assign(n, 0);
  b.labels.assign(n, kIgnoreIndex);
  b.position_ids.assign(n, 0);
  out.sequence.assign(n, -1);
  out.completion.assign(n, 0);
  for (int64_t r = 0; r < static_cast<int64_t>(rows.size()); ++r) {
    int64_t t = r * b.T;
    int32_t pos = 0;
    for (int64_t p : rows[static_cast<size_t>(r)]) {
      const int64_t k = out.pairs();
      out.pair_ids.push_back(p);
      const int64_t src = set.pairs.offsets[p], len = set.pairs.length(p);
      const int64_t c_len = set.chosen_len[static_cast<size_t>(p)];
      for (int side = 0; side < 2; ++side) {
        const int64_t begin = side == 0 ? 0 : c_len, end = side == 0 ? c_len : len;
        int64_t completion = 0;
        for (int64_t j = begin; j < end; ++j, ++t) {
          const int32_t id = set.pairs.ids[src + j];
          const bool trained = set.pairs.trained[src + j] != 0;
          b.input_ids[t] = id;
          b.attention_mask[t] = 1;
          b.position_ids[t] = static_cast<int32_t>(j - begin);
          out.sequence[t] = static_cast<int32_t>(2 * k + side);
          out.completion[t] = trained;  // TRL's completion_mask (a first token has no log-prob)
          completion += out.completion[t];
          if (j > begin && (trained || label_prompt)) b.labels[t] = id;
        }
        out.completion_tokens.push_back(completion);
        out.sequence_tokens.push_back(end - begin);
        b.real_tokens += end - begin;
        pos = static_cast<int32_t>(end - begin);
      }
    }
    for (; t < (r + 1) * b.T; ++t) b.position_ids[t] = pos++;
  }
  return out;
}

}  // namespace st
