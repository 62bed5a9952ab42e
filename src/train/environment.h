// Multi-turn episodes of online RL (finetune --objective grpo --environment-command CMD): after
// each model turn of a completion an environment program answers with the next user turn (a
// reply, a tool's result written as the user's turn) or ends the episode. The program speaks the
// reward programs' protocol (train/rewards.h's JsonLinesProgram): per finished turn one JSON
// object in, one line out.
//   in:  {"prompt": <the row's prompt>, "messages": [<the episode's turns after the prompt:
//         {"role": "assistant" | "user", "content": text}, ...>], "completion": <the model's last
//         turn, text>, "turn": <1 for the first model turn>, <every other column of the row>}
//   out: null, {} or {"done": true}       the episode is over;
//        {"role": "user", "content": "..."} (role optional) the next turn, after which the model
//         answers again (up to --max-turns model turns and --max-completion-length tokens).
// The loss covers only the model's turns; the rewards see the whole episode.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/rewards.h"

namespace st {

class Environment {
 public:
  explicit Environment(std::unique_ptr<JsonLinesProgram> program) : program_(std::move(program)) {}
  // The next turn's text for each state (nullopt: the episode is over). Errors name the program.
  StatusOr<std::vector<std::optional<std::string>>> Next(const std::vector<nlohmann::json>& states);

 private:
  std::unique_ptr<JsonLinesProgram> program_;
};

StatusOr<std::unique_ptr<Environment>> MakeCommandEnvironment(const std::string& command,
                                                              double timeout_s);

}  // namespace st
