// Tokenized training examples of varying length and the batches made from them, for causal-LM
// fine-tuning. An example is its rendered tokens (data/chat_template.h) and, per token, whether the
// loss covers it; how examples are grouped, padded or packed into rows is data/batching.h's.
// Labels follow transformers: label = input id where trained, kIgnoreIndex (-100) elsewhere and at
// padding; the engine shifts them (position t predicts label t+1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {

inline constexpr int32_t kIgnoreIndex = -100;

struct CollateOptions {
  int64_t max_seq_len = 512;  // T: the longest row; longer examples are truncated (or split)
  int32_t pad_id = -1;        // -1: the tokenizer's pad token, else its eos token
  bool pad_left = false;  // the default pads on the right (the seed's Gemma 4 tokenizer pads left)
  // Examples longer than T become several examples of at most T tokens each (--packing split)
  // instead of being cut at T.
  bool split_long = false;
};

// N examples, their tokens stored one after another.
struct TokenizedSet {
  int64_t T = 0;                    // no example is longer
  std::vector<int32_t> ids;         // every example's tokens
  std::vector<uint8_t> trained;     // per token: 1 = a target of the loss
  std::vector<int64_t> offsets{0};  // [N+1]: example i is [offsets[i], offsets[i+1])
  int64_t truncated = 0;            // examples cut to T
  int64_t split = 0;                // examples split into pieces of at most T (split_long)
  int64_t untrained = 0;            // examples (pieces) with no trained token after the first
  // The examples' images (a vision set), in order: example i holds images
  // [image_offsets[i], image_offsets[i+1]). image_offsets stays {0} for a text set.
  std::vector<ImageRef> images;
  std::vector<int64_t> image_offsets{0};
  int64_t images_dropped = 0;  // images cut off by truncation (with the rest of their example)

  int64_t size() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[i + 1] - offsets[i]; }
  int64_t tokens() const { return static_cast<int64_t>(ids.size()); }
  // Appends one example (ids and trained of equal length, at most T) and its images.
  void Add(std::span<const int32_t> ids, std::span<const uint8_t> trained,
           std::span<const ImageRef> example_images = {});
  bool has_images() const { return !images.empty(); }
};

// A batch as the engine takes it: [B, T] rows, flat.
struct TokenBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> input_ids;       // [B, T]
  std::vector<uint8_t> attention_mask;  // [B, T] 1 / 0 (the engine's Batch mask as it is)
  std::vector<int32_t> labels;          // [B, T] input id, or kIgnoreIndex
  std::vector<int32_t> position_ids;    // [B, T] when rows hold packed examples, else empty
  int64_t real_tokens = 0;              // attention-mask ones
  // The images of the batch's examples, row after row in position order (the order of their
  // soft tokens in input_ids); pointers into the TokenizedSet.
  std::vector<const ImageRef*> images;
  // Their soft tokens [images' soft tokens, d] once a vision model encoded them (the trainer,
  // evaluate), and the id of the positions they take; the engine places them (model/gemma4.h).
  std::vector<float> soft_tokens;
  int64_t soft_token_rows = 0;
  int32_t soft_token_id = -1;
};

// The pad id to use: options.pad_id, else the tokenizer's pad, else its eos; error when none.
StatusOr<int32_t> ResolvePadId(const Tokenizer& tok, const CollateOptions& options);

// Adds a rendered example: truncated to T (keeping its tail as transformers' truncation=True
// does), or split into pieces of T when options.split_long.
void AddExample(RenderedExample example, const CollateOptions& options, TokenizedSet* set);

// Reads the data set's split and renders, tokenizes and adds each record.
StatusOr<TokenizedSet> TokenizeDataset(const InstructionDataset& ds,
                                       const ExampleRenderer& renderer,
                                       const CollateOptions& options, DatasetReport* report);

// Gathers examples `rows` of set into a [rows, T] batch, each example padded to T (set.T unless
// T > 0 is given).
TokenBatch Collate(const TokenizedSet& set, std::span<const int64_t> rows, int32_t pad_id,
                   bool pad_left = false, int64_t T = 0);

}  // namespace st
