#include "data/prompts.h"

namespace st {

Status PromptSet::Add(const InstructionRecord& r, const Tokenizer& tok,
                      const ExampleRenderer* chat) {
  std::vector<int32_t> ids;
  if (r.conversational) {
    if (!chat)
      return InvalidArgument(
          "conversational prompts need a chat template: --template gemma-chat (or auto with a "
          "tokenizer that has Gemma's turn markers)");
    ST_RETURN_IF_ERROR(chat->RenderConversation(r.prompt_turns, true, &ids));
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
