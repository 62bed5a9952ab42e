// How an instruction record becomes training tokens (--template) and which of them the loss
// covers (--train-on).
//
// - gemma-chat: Gemma 4's chat format, token for token what transformers' apply_chat_template
//   renders for the Gemma 4 tokenizer (tests/fixtures/chat, tools/make_chat_fixtures.py):
//     <bos><|turn>system\n{text}<turn|>\n<|turn>user\n{text}<turn|>\n<|turn>model\n{text}<turn|>\n
//   with `assistant` written as `model` and every content stripped of surrounding whitespace as
//   Python's str.strip does. The control tokens are emitted as ids, never parsed from text, and
//   the text between them is tokenized piece by piece (what a tokenizer that splits on its added
//   tokens does to the whole string). A Dolly/Alpaca record is the conversation
//   [user: instruction, or instruction + "\n\n" + context; model: response].
// - instruction: slicetrain's plain prompt (PromptTemplate: "Instruction: ...\nResponse: ..."),
//   tokenized as a whole with the tokenizer's own bos/eos, as the seed does.
// - none: the fields joined by newlines, no markers.
//
// Trained tokens (--train-on responses): the model turns' text and their end-of-turn token
// `<turn|>` (not the `<|turn>model\n` header, not the newline after `<turn|>`), which is what
// TRL's assistant_only_loss trains on; with the instruction or none template, the tokens that
// overlap the responses' characters. --train-on all trains on every token (the seed's
// DataCollatorForLanguageModeling).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "data/utf8.h"  // StripPythonWhitespace

namespace st {

enum class TemplateKind { kAuto, kInstruction, kGemmaChat, kNone };
enum class TrainOn { kAuto, kResponses, kAll };

StatusOr<TemplateKind> ParseTemplateKind(
    std::string_view name);  // auto|instruction|gemma-chat|none
const char* TemplateKindName(TemplateKind kind);
StatusOr<TrainOn> ParseTrainOn(std::string_view name);  // auto|responses|all
const char* TrainOnName(TrainOn t);

// The record's tokens and, per token, whether the loss covers it (as a target of the previous
// position).
struct RenderedExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  // Trailing special tokens (the tokenizer's eos) that truncation keeps, as transformers'
  // truncation=True does; 0 for the chat template, which is cut at the end.
  size_t tail = 0;
  // The images whose soft tokens the example holds, in order, and where each one's block (begin
  // marker, soft tokens, end marker) lies in `ids`: [begin, end).
  std::vector<ImageRef> images;
  std::vector<std::pair<size_t, size_t>> image_spans;
  // Cuts the example to at most n tokens (n >= 1), keeping the tail when it fits. A cut inside an
  // image's block cuts before the block: an image is whole or absent.
  void Truncate(size_t n);
};

// What image parts render to (a model with a vision tower): Gemma 4's begin marker `<|image>`, one
// `<|image|>` per soft token, the end marker `<image|>`, as its processor expands the template's
// `<|image|>`.
struct ImageTokens {
  int32_t boi = -1, image = -1, eoi = -1;
  // The soft tokens an image becomes (the image processor's count; decodes the image). Its errors
  // name what is wrong with the image; the renderer adds the record.
  std::function<StatusOr<int64_t>(const ImageRef&)> count;
};

class ExampleRenderer {
 public:
  // kAuto: gemma-chat when the tokenizer has `<|turn>` and `<turn|>`, else instruction. TrainOn
  // kAuto: responses with gemma-chat, all otherwise (the seed's behaviour). gemma-chat needs those
  // two tokens and a bos token. The tokenizer must outlive the renderer.
  static StatusOr<ExampleRenderer> Create(const Tokenizer& tok, TemplateKind kind, TrainOn train_on,
                                          const PromptTemplate& prompt = {});

  // Renders one record into *out (replacing it). InvalidArgument for a conversation the template
  // cannot express (a system turn after the first message).
  Status Render(const InstructionRecord& r, RenderedExample* out) const;

  // The tokens that ask the model for its turn after `messages` (a first system turn, then user
  // turns), appended to *out: gemma-chat renders them as Render does and adds the generation
  // prompt `<|turn>model\n` (what the model was fine-tuned to answer after; add_generation_prompt
  // of the training template); instruction and none render the last user turn (a system turn as
  // its context) with an empty response, trailing whitespace removed. `start`: the sequence's
  // first tokens (bos first); false continues a conversation after the model's `<turn|>` (the
  // newline that closes it comes first).
  // A user turn's image parts (ChatMessage::segments, gemma-chat only) take `images` in order,
  // rendered as Render renders them.
  Status RenderPrompt(const std::vector<ChatMessage>& messages, bool start,
                      std::vector<int32_t>* out, std::span<const ImageRef> images = {}) const;
  // gemma-chat only: the tokens of a whole conversation (any turns) as apply_chat_template
  // renders it, plus the generation prompt `<|turn>model\n` when asked; what TRL tokenizes a
  // conversational preference pair with.
  // tools: the declarations of data/tool_calls.h's ToolDeclarations ("" = none), written at the
  // end of the system turn (a system turn of their own when the conversation has none), as the
  // template does with apply_chat_template(tools=...).
  Status RenderConversation(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                            std::vector<int32_t>* out, std::string_view tools = {}) const;
  // The id of `<turn|>` with gemma-chat (where a model turn ends), else -1.
  int32_t turn_close() const { return kind_ == TemplateKind::kGemmaChat ? turn_close_ : -1; }
  // Image parts render as `tokens` says (gemma-chat only); without it a record with images is
  // refused with a line naming a vision model.
  void SetImageTokens(ImageTokens tokens) { images_ = std::move(tokens); }

  TemplateKind kind() const { return kind_; }
  TrainOn train_on() const { return train_on_; }

 private:
  ExampleRenderer() = default;
  Status RenderChat(const InstructionRecord& r, RenderedExample* out,
                    std::string_view tools = {}) const;
  void RenderText(const InstructionRecord& r, RenderedExample* out) const;
  // Appends a turn's header and content (text, or text and image blocks taking images from
  // `images` at *next_image on) to out; content tokens are targets when `trained`, the header's
  // never unless `all`.
  Status RenderTurn(const ChatMessage& m, bool all, bool trained, std::span<const ImageRef> images,
                    int64_t* next_image, RenderedExample* out) const;

  const Tokenizer* tok_ = nullptr;
  TemplateKind kind_ = TemplateKind::kInstruction;
  TrainOn train_on_ = TrainOn::kAll;
  PromptTemplate prompt_;
  int32_t bos_ = -1, turn_open_ = -1, turn_close_ = -1;
  ImageTokens images_;
};

}  // namespace st
