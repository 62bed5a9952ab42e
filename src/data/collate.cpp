#include "data/collate.h"

#include <algorithm>

namespace st {

StatusOr<int32_t> ResolvePadId(const Tokenizer& tok, const CollateOptions& options) {
  if (options.pad_id >= 0) return options.pad_id;
  if (tok.pad_id() >= 0) return tok.pad_id();
  if (tok.eos_id() >= 0) return tok.eos_id();
  return InvalidArgument("the tokenizer has neither a pad nor an eos token; set a pad id");
}

void AddExample(const Tokenizer& tok, std::string_view text, const CollateOptions& options,
                int32_t pad_id, TokenizedSet* set) {
  const int64_t T = options.max_seq_len;
  ST_CHECK_GE(T, 1);
  set->T = T;
  std::vector<int32_t> ids = tok.Encode(text, options.add_special_tokens, 0);
  if (static_cast<int64_t>(ids.size()) > T) {
    ++set->truncated;
    ids = tok.Encode(text, options.add_special_tokens, T);
  }
  const int64_t n = static_cast<int64_t>(ids.size()), pad = T - n;
  set->real_tokens += n;
  auto pad_block = [&] {
    set->input_ids.insert(set->input_ids.end(), pad, pad_id);
    set->mask.insert(set->mask.end(), pad, 0);
  };
  if (options.pad_left) pad_block();
  set->input_ids.insert(set->input_ids.end(), ids.begin(), ids.end());
  set->mask.insert(set->mask.end(), n, 1);
  if (!options.pad_left) pad_block();
}

StatusOr<TokenizedSet> TokenizeDataset(const InstructionDataset& ds, const PromptTemplate& tmpl,
                                       const Tokenizer& tok, const CollateOptions& options,
                                       DatasetReport* report) {
  if (options.max_seq_len < 1)
    return InvalidArgument(StrCat("max_seq_len must be >= 1, got ", options.max_seq_len));
  ST_RETURN_IF_ERROR(tmpl.Validate());
  ST_ASSIGN_OR_RETURN(int32_t pad_id, ResolvePadId(tok, options));
  TokenizedSet set;
  set.T = options.max_seq_len;
  ST_RETURN_IF_ERROR(ds.ForEach(
      [&](const InstructionRecord& r) {
        AddExample(tok, tmpl.Format(r), options, pad_id, &set);
        return Status::Ok();
      },
      report));
  return set;
}

TokenBatch Collate(const TokenizedSet& set, std::span<const int64_t> rows) {
  TokenBatch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = set.T;
  b.input_ids.resize(b.B * b.T);
  b.attention_mask.resize(b.B * b.T);
  b.labels.resize(b.B * b.T);
  for (int64_t i = 0; i < b.B; ++i) {
    ST_CHECK(rows[i] >= 0 && rows[i] < set.size()) << "row " << rows[i] << " of " << set.size();
    const int64_t src = rows[i] * set.T, dst = i * b.T;
    for (int64_t t = 0; t < b.T; ++t) {
      const int32_t id = set.input_ids[src + t];
      const bool real = set.mask[src + t] != 0;
      b.input_ids[dst + t] = id;
      b.attention_mask[dst + t] = real ? 1 : 0;
      b.labels[dst + t] = real ? id : kIgnoreIndex;
    }
  }
  return b;
}

}  // namespace st
