#include "data/prompts.h"

#include "data/tool_calls.h"

namespace st {

Status PromptSet::Add(const InstructionRecord& r, const Tokenizer& tok,
                      const ExampleRenderer* chat) {
  std::vector<int32_t> ids;
  // The row's tools (datasets often keeps them as JSON text), else the run's.
  nlohmann::json row_tools;
  if (auto t = r.columns.find("tools"); t != r.columns.end() && !t->is_null()) {
    row_tools = t->is_string() ? nlohmann::json::parse(t->get<std::string>(), nullptr, false) : *t;
    if (row_tools.is_discarded() || !row_tools.is_array())
      return InvalidArgument("the 'tools' column is not a list of tool schemas (or its JSON text)");
  }
  const nlohmann::json& declared = row_tools.is_null() ? tools : row_tools;
  std::string declarations;
  if (!declared.is_null() && !declared.empty()) {
    ST_ASSIGN_OR_RETURN(declarations, ToolDeclarations(declared));
    if (!r.conversational)
      return InvalidArgument(
          "a text prompt cannot declare tools: write the prompt as a conversation ([{\"role\": "
          "\"user\", \"content\": ...}]) so the chat template can");
    if (!tok.TokenToId("<|tool>") || !tok.TokenToId("<tool|>"))
      return InvalidArgument(
          "the prompts declare tools but the tokenizer has no <|tool> and <tool|> tokens (Gemma "
          "4's tokenizer has them)");
  }
  if (r.conversational) {
    if (!chat)
      return InvalidArgument(
          "conversational prompts need a chat template: --template gemma-chat (or auto with a "
          "tokenizer that has Gemma's turn markers)");
    ST_RETURN_IF_ERROR(chat->RenderConversation(r.prompt_turns, true, &ids, declarations));
  } else {
    ids = tok.Encode(r.prompt);
  }
  if (static_cast<int64_t>(ids.size()) > max_len) {
    ++dropped;
    return Status::Ok();
  }
  const std::vector<uint8_t> trained(ids.size(), 1);
  prompts.Add(ids, trained);
  rows.push_back(r.columns);
  lines.push_back(r.line);
  return Status::Ok();
}

}  // namespace st
