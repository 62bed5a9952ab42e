// Prompt-only data for online RL (finetune --objective grpo), as TRL's GRPOTrainer takes it: a
// `prompt` column, text (tokenized as it is, special tokens added) or a conversation (rendered
// with the chat template and the generation prompt, apply_chat_template(add_generation_prompt=
// True)), and every column of the row kept for the rewards.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/collate.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {

struct PromptSet {
  int64_t max_len = 0;               // the longest prompt kept (--max-seq-len)
  TokenizedSet prompts;              // the prompts' tokens: what an epoch plans over
  std::vector<nlohmann::json> rows;  // per prompt: its row (the prompt and every other column)
  std::vector<int64_t> lines;        // per prompt: its record's line (or row)
  int64_t dropped = 0;               // prompts longer than max_len (left out, counted)
  // The tools a conversational prompt declares when its row has no `tools` column (a list of
  // function schemas, data/tool_calls.h; null: none).
  nlohmann::json tools;

  explicit PromptSet(int64_t max_seq_len = 0) : max_len(max_seq_len) { prompts.T = max_seq_len; }
  int64_t size() const { return prompts.size(); }
  bool conversational(int64_t i) const { return rows[static_cast<size_t>(i)]["prompt"].is_array(); }
  // Tokenizes r's prompt (chat: the renderer of a chat template, needed for conversations; with
  // the tools of its `tools` column, a list or its JSON text, else `tools`) and adds it, or counts
  // it as dropped when it is longer than max_len.
  Status Add(const InstructionRecord& r, const Tokenizer& tok, const ExampleRenderer* chat);
};

}  // namespace st
