// Multi-turn episodes of online RL (finetune --objective grpo --environment-command CMD): after
// each model turn of a completion an environment program answers with the next user turn, the
// results of the tools the model called, or the end of the episode. The program speaks the reward
// programs' protocol (train/rewards.h's JsonLinesProgram): per finished turn one JSON object in,
// one line out.
//   in:  {"prompt": <the row's prompt>, "messages": [<the episode's messages after the prompt, as
//         TRL and OpenAI write them: {"role": "assistant", "content": text, "tool_calls": [{"type":
//         "function", "function": {"name", "arguments"}}, ...] (when the turn calls tools)},
//         {"role": "tool", "name", "content"}, {"role": "user", "content"}, ...>],
//         "completion": <the model's last turn, its text>, "turn": <1 for the first model turn>,
//         <every other column of the row>}
//   out: null, {} or {"done": true}       the episode is over;
//        {"role": "user", "content": "..."} (role optional) the next user turn;
//        {"role": "tool", "content": ..., "name": "..."} or a list of them: the results of the
//         calls of a turn that stopped at <|tool_response> (name defaults to the call's at the
//         same position), fed inside the model's turn as Gemma 4's template writes them
//         (data/tool_calls.h);
//        after either the model answers again (up to --max-turns model turns and
//        --max-completion-length tokens).
// The loss covers only the model's turns; the rewards see the whole episode.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "data/tool_calls.h"
#include "train/rewards.h"

namespace st {

class Environment {
 public:
  // renderer (gemma-chat or another template) and tok outlive the environment; tool results need
  // the tokenizer's Gemma 4 tool-call tokens.
  Environment(std::unique_ptr<JsonLinesProgram> program, const ExampleRenderer& renderer,
              const Tokenizer& tok);

  // A model turn that ended at one of the rollout's stops.
  struct EndedTurn {
    std::span<const int32_t> ids;  // the model's tokens of the turn, the stop token last
    nlohmann::json row;            // the prompt's row (its columns go to the program)
    int64_t turn = 1;              // 1 for the first model turn of the episode
    nlohmann::json* episode;       // the messages after the prompt; the turn and the answer are
                                   // appended
  };
  // The tokens to feed each episode next (nullopt: it is over). Errors name the program.
  StatusOr<std::vector<std::optional<std::vector<int32_t>>>> Next(
      const std::vector<EndedTurn>& ended);

  // A model turn as its assistant message (content and the tool calls it makes).
  nlohmann::json AssistantMessage(std::span<const int32_t> ids) const;
  // The stop token of a turn that calls tools (<|tool_response>), -1 when the tokenizer has none.
  int32_t tool_stop() const { return tools_ ? tools_->response_open() : -1; }

 private:
  std::unique_ptr<JsonLinesProgram> program_;
  const ExampleRenderer* renderer_;
  const Tokenizer* tok_;
  std::optional<ToolCallFormat> tools_;
};

StatusOr<std::unique_ptr<Environment>> MakeCommandEnvironment(const std::string& command,
                                                              double timeout_s,
                                                              const ExampleRenderer& renderer,
                                                              const Tokenizer& tok);

}  // namespace st
