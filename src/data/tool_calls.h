// Gemma 4's tool calls, as its chat template writes them (TRL's copy of Google's template,
// trl/chat_templates/gemma4_v5.jinja; goldens in tests/fixtures/tool_turns from
// tools/make_tool_turn_fixtures.py):
//   a model turn that calls tools:  <|tool_call>call:NAME{key:VALUE,...}<tool_call|>...
//   <|tool_response> (generation stops at <|tool_response>), then per result, fed back inside the
//   same model turn:
//   [<|tool_response>]response:NAME{value:VALUE}<tool_response|>   (the first one's opener is the
//   model's stop token), after which the model goes on with its turn.
// VALUE is the template's format_argument: strings between <|"|> markers, numbers, true, false,
// null, [a,b] and {key:value} with bare keys. A result's content is text (a string), or a number,
// true, false or null as the template writes them; objects and lists, which the template does not
// render in a tool message, are written as their compact JSON text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace st {

// `call:NAME{...}` (the text between <|tool_call> and <tool_call|>) as an OpenAI-style call,
// {"type": "function", "function": {"name": NAME, "arguments": {...}}}, as TRL's response parser
// reads it (an object's keys sorted, as
// nlohmann::json holds them and the template writes them); an error says where the text stops being
// a call.
StatusOr<nlohmann::json> ParseToolCall(std::string_view text);

// The tools a prompt declares (a list of OpenAI-style schemas, {"type": "function", "function":
// {"name", "description", "parameters": JSON schema}}, as transformers' apply_chat_template(tools=)
// takes them; a bare function schema is taken as its "function") as the template writes them in
// the system turn: <|tool>declaration:NAME{description:...,parameters:{...}}<tool|> per tool, the
// template's format_function_declaration and format_parameters. Text with control tokens: encode
// it with the tokenizer's added tokens split out.
StatusOr<std::string> ToolDeclarations(const nlohmann::json& tools);

// One tool result fed back to the model.
struct ToolResult {
  std::string name;
  nlohmann::json content;
};

class ToolCallFormat {
 public:
  // nullopt when the tokenizer lacks Gemma 4's tool-call tokens (<|tool_call>, <tool_call|>,
  // <|tool_response>, <tool_response|>). The tokenizer must outlive the format.
  static std::optional<ToolCallFormat> Of(const Tokenizer& tok);

  // <|tool_response>: the token a model turn that calls tools stops at.
  int32_t response_open() const { return response_open_; }

  // A model turn (its tokens as drawn, the stop token included) as the assistant message TRL's
  // parse_response makes of it: {"role": "assistant", "content": the text outside the calls
  // (special tokens skipped), "tool_calls": [...] (only when the turn holds calls)}. A call that
  // does not parse makes the whole turn plain content, as TRL falls back.
  nlohmann::json AssistantMessage(std::span<const int32_t> ids) const;

  // The tokens fed after a turn that stopped at <|tool_response>: each result's block, the
  // first without its opener (the model drew it).
  std::vector<int32_t> RenderResults(const std::vector<ToolResult>& results) const;

 private:
  const Tokenizer* tok_ = nullptr;
  int32_t call_open_ = -1, call_close_ = -1, response_open_ = -1;
};

}  // namespace st
