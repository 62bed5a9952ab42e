// Tokenized, fixed-length training examples and batches for causal-LM fine-tuning: what the seed's
// tokenizer(..., truncation=True, max_length=T, padding="max_length") plus
// DataCollatorForLanguageModeling(mlm=False) produce. labels = input ids, with pad positions set to
// -100 (ignored by the loss). Not a sampler: which examples form a batch is decided elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {

inline constexpr int32_t kIgnoreIndex = -100;

struct CollateOptions {
  int64_t max_seq_len = 512;  // T: every example is truncated / padded to this length
  int32_t pad_id = -1;        // -1: the tokenizer's pad token, else its eos token
  bool pad_left = false;  // the default pads on the right (the seed's Gemma 4 tokenizer pads left)
  bool add_special_tokens = true;
};

// N examples of T tokens each, stored flat.
struct TokenizedSet {
  int64_t T = 0;
  std::vector<int32_t> input_ids;  // [N, T]
  std::vector<uint8_t> mask;       // [N, T] 1 = real token, 0 = padding
  int64_t truncated = 0;           // examples cut to T
  int64_t real_tokens = 0;         // sum of mask
  int64_t size() const { return T == 0 ? 0 : static_cast<int64_t>(input_ids.size()) / T; }
};

struct TokenBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> input_ids;       // [B, T]
  std::vector<int32_t> attention_mask;  // [B, T] 1 / 0
  std::vector<int32_t> labels;          // [B, T] input id, or kIgnoreIndex at padding
};

// The pad id to use: options.pad_id, else the tokenizer's pad, else its eos; error when none.
StatusOr<int32_t> ResolvePadId(const Tokenizer& tok, const CollateOptions& options);

// Appends one text as a T-long example (truncated like transformers, special tokens kept).
void AddExample(const Tokenizer& tok, std::string_view text, const CollateOptions& options,
                int32_t pad_id, TokenizedSet* set);

// Reads the data set's split, formats each record with the template and tokenizes it.
StatusOr<TokenizedSet> TokenizeDataset(const InstructionDataset& ds, const PromptTemplate& tmpl,
                                       const Tokenizer& tok, const CollateOptions& options,
                                       DatasetReport* report);

// Gathers examples `rows` of set into a batch (labels with kIgnoreIndex at padding).
TokenBatch Collate(const TokenizedSet& set, std::span<const int64_t> rows);

}  // namespace st
