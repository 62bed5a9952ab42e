// Preference pairs (DPO, ORPO) as TRL's DPOTrainer (1.16) tokenizes them, and their batches.
//
// Tokenization, per record (data/dataset.h's kPreference layout):
// - text: the tokenizer's eos text is appended to chosen and rejected unless they end with it;
//   then prompt, prompt + chosen and prompt + rejected are each tokenized whole, with the
//   tokenizer's special tokens (bos), as `tokenizer(text)` does;
// - conversations: the prompt turns with the generation prompt, and prompt + chosen and
//   prompt + rejected turns without it, each rendered by the chat template (gemma-chat).
// The completion starts where the prompt's tokens and each whole sequence's first differ (TRL's
// common_prefix_length: a template may render the prompt alone differently, or tokens may merge
// across the boundary), the smaller of the two; the prompt is that common part.
// Truncation (DataCollatorForPreference, keep_start): each of prompt + chosen and prompt + rejected
// is cut to max_len tokens; a pair whose prompt alone has max_len tokens or more has nothing left
// to train and is dropped (counted), as TRL's dataset filter drops it.
//
// A pair is one example of a TokenizedSet: its chosen sequence then its rejected one, trained =
// the completion tokens. In a batch every sequence keeps its own positions and attention
// (Batch::position_ids), so the two sides of a pair, and the pairs packed into one row, never see
// each other's tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "data/batching.h"
#include "data/chat_template.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {

// One record's tokens before truncation.
struct PreferenceTokens {
  std::vector<int32_t> prompt, chosen, rejected;  // chosen/rejected: the completions alone
  bool prompt_diverged = false;  // the prompt's tokens are not a prefix of a whole sequence
};

// `chat` renders conversational records (null: such a record is an error).
Status TokenizePreference(const InstructionRecord& r, const Tokenizer& tok,
                          const ExampleRenderer* chat, PreferenceTokens* out);

struct PreferenceSet {
  int64_t max_len = 0;              // per sequence (--max-seq-len); pairs.T is twice it
  TokenizedSet pairs;               // example p: chosen sequence, then rejected sequence
  std::vector<int64_t> chosen_len;  // [pairs] tokens of p's chosen sequence (prompt included)
  std::vector<int64_t> prompt_len;  // [pairs] the prompt tokens that start both sequences
  std::vector<int64_t> lines;       // [pairs] the record's line (or row) in its file
  int64_t truncated = 0;            // sequences cut to max_len
  int64_t dropped = 0;              // pairs whose prompt fills max_len
  int64_t prompt_diverged = 0;      // pairs whose prompt is not a token prefix (TRL warns)

  explicit PreferenceSet(int64_t max_seq_len = 0) : max_len(max_seq_len) {
    pairs.T = 2 * max_seq_len;
  }
  int64_t size() const { return pairs.size(); }
  // Adds a pair, truncated as TRL's collator does; false (and counted) when it is dropped.
  bool Add(const PreferenceTokens& t, int64_t line);
};

// A step's pairs laid out for the engine. Row r of the batch holds the pairs of rows[r], each as
// its chosen then its rejected sequence, every sequence restarting its positions; pad after.
struct PairBatch {
  TokenBatch batch;
  // [B,T]: for each token, the sequence it belongs to in this batch (2k: the chosen side of the
  // batch's k-th pair, 2k+1: its rejected side; -1: padding), and whether it is a completion
  // token (TRL's completion_mask: the log-probs a DPO sum covers).
  std::vector<int32_t> sequence;
  std::vector<uint8_t> completion;
  std::vector<int64_t> pair_ids;           // [pairs in the batch]: indices into the set
  std::vector<int64_t> completion_tokens;  // [2 x pairs]: per sequence, its completion tokens
  std::vector<int64_t> sequence_tokens;    // [2 x pairs]: per sequence, all its tokens
  int64_t pairs() const { return static_cast<int64_t>(pair_ids.size()); }
};

// The batch of one step's rows (data/batching.h's StepRows over the pair set; an empty `rows` is
// one padding row with no target). Labels: the completion tokens; label_prompt adds the prompt's
// (ORPO's NLL term covers the whole chosen sequence), never a sequence's first token. Rows are
// padded to the longest, rounded up to 8 (max_length padding: to options.max_seq_len).
PairBatch CollatePairs(const PreferenceSet& set, const StepRows& rows,
                       const BatchingOptions& options, bool label_prompt);

}  // namespace st
