#include "data/chat_template.h"

#include <algorithm>
#include <cctype>

#include "data/utf8.h"

namespace st {

StatusOr<TemplateKind> ParseTemplateKind(std::string_view name) {
  if (name == "auto") return TemplateKind::kAuto;
  if (name == "instruction") return TemplateKind::kInstruction;
  if (name == "gemma-chat") return TemplateKind::kGemmaChat;
  if (name == "none") return TemplateKind::kNone;
  return InvalidArgument(
      StrCat("--template must be auto, instruction, gemma-chat or none, got '", name, "'"));
}

const char* TemplateKindName(TemplateKind kind) {
  switch (kind) {
    case TemplateKind::kAuto:
      return "auto";
    case TemplateKind::kInstruction:
      return "instruction";
    case TemplateKind::kGemmaChat:
      return "gemma-chat";
    case TemplateKind::kNone:
      return "none";
  }
  return "?";
}

StatusOr<TrainOn> ParseTrainOn(std::string_view name) {
  if (name == "auto") return TrainOn::kAuto;
  if (name == "responses") return TrainOn::kResponses;
  if (name == "all") return TrainOn::kAll;
  return InvalidArgument(StrCat("--train-on must be auto, responses or all, got '", name, "'"));
}

const char* TrainOnName(TrainOn t) {
  switch (t) {
    case TrainOn::kAuto:
      return "auto";
    case TrainOn::kResponses:
      return "responses";
    case TrainOn::kAll:
      return "all";
  }
  return "?";
}

void RenderedExample::Truncate(size_t n) {
  if (ids.size() <= n) return;
  if (!image_spans.empty()) {  // the chat template only: no tail; an image is whole or absent
    size_t keep = 0;
    while (keep < image_spans.size() && image_spans[keep].second <= n) ++keep;
    if (keep < image_spans.size()) n = std::min(n, image_spans[keep].first);
    image_spans.resize(keep);
    images.resize(keep);
    ids.resize(n);
    trained.resize(n);
    return;
  }
  const size_t keep_tail = tail < n ? tail : 0;
  std::move(ids.end() - static_cast<std::ptrdiff_t>(keep_tail), ids.end(),
            ids.begin() + static_cast<std::ptrdiff_t>(n - keep_tail));
  std::move(trained.end() - static_cast<std::ptrdiff_t>(keep_tail), trained.end(),
            trained.begin() + static_cast<std::ptrdiff_t>(n - keep_tail));
  ids.resize(n);
  trained.resize(n);
}

namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Every turn's image parts against the images given: as many, in order.
Status CheckImageCount(const std::vector<ChatMessage>& messages, size_t images) {
  int64_t parts = 0;
  for (const ChatMessage& m : messages) parts += m.images();
  if (parts == static_cast<int64_t>(images)) return Status::Ok();
  return InvalidArgument(StrCat("the record has ", parts, " image part", parts == 1 ? "" : "s",
                                " in its turns and ", images, " image", images == 1 ? "" : "s",
                                "; each {\"type\": \"image\"} part takes the next image"));
}

}  // namespace

StatusOr<ExampleRenderer> ExampleRenderer::Create(const Tokenizer& tok, TemplateKind kind,
                                                  TrainOn train_on, const PromptTemplate& prompt) {
  ExampleRenderer r;
  r.tok_ = &tok;
  r.prompt_ = prompt;
  const std::optional<int32_t> open = tok.TokenToId("<|turn>"), close = tok.TokenToId("<turn|>");
  if (kind == TemplateKind::kAuto)
    kind =
        open && close && tok.bos_id() >= 0 ? TemplateKind::kGemmaChat : TemplateKind::kInstruction;
  if (kind == TemplateKind::kGemmaChat) {
    if (!open || !close || tok.bos_id() < 0)
      return InvalidArgument(
          "--template gemma-chat needs a tokenizer with the tokens <bos>, <|turn> and <turn|> "
          "(Gemma 4's); this one lacks them: use --template instruction");
    r.turn_open_ = *open;
    r.turn_close_ = *close;
    r.bos_ = tok.bos_id();
  }
  if (kind == TemplateKind::kNone) {
    r.prompt_.plain = "{instruction}\n{response}";
    r.prompt_.with_context = "{instruction}\n{context}\n{response}";
  }
  ST_RETURN_IF_ERROR(r.prompt_.Validate());
  r.kind_ = kind;
  r.train_on_ = train_on != TrainOn::kAuto         ? train_on
                : kind == TemplateKind::kGemmaChat ? TrainOn::kResponses
                                                   : TrainOn::kAll;
  return r;
}

Status ExampleRenderer::Render(const InstructionRecord& r, RenderedExample* out) const {
  out->ids.clear();
  out->trained.clear();
  out->tail = 0;
  out->images.clear();
  out->image_spans.clear();
  if (kind_ == TemplateKind::kGemmaChat) return RenderChat(r, out);
  if (!r.images.empty())
    return InvalidArgument(StrCat("the record has images; --template ", TemplateKindName(kind_),
                                  " renders text only (use --template gemma-chat)"));
  RenderText(r, out);
  return Status::Ok();
}

Status ExampleRenderer::RenderTurn(const ChatMessage& m, bool all, bool trained,
                                   std::span<const ImageRef> images, int64_t* next_image,
                                   RenderedExample* out) const {
  auto add = [&](int32_t id, bool target) {
    out->ids.push_back(id);
    out->trained.push_back(target ? 1 : 0);
  };
  if (m.images() > 0 && !images_.count)
    return InvalidArgument(
        "the record has images and the model has no vision tower (a Gemma 4 model whose "
        "config.json has a vision_config, with processor_config.json, reads them)");
  const bool model = m.role == "assistant";
  const std::string header = (model ? std::string("model") : m.role) + "\n";
  add(turn_open_, all);
  // The text between images, each stretch tokenized alone (a text-only turn is one stretch).
  const std::string text_only =
      m.segments.empty() ? std::string(StripPythonWhitespace(m.content)) : std::string();
  const size_t stretches = m.segments.empty() ? 1 : m.segments.size();
  for (size_t k = 0; k < stretches; ++k) {
    const std::string& text = m.segments.empty() ? text_only : m.segments[k];
    const std::vector<int32_t> whole = tok_->Encode(k == 0 ? header + text : text, false);
    // The trained part starts at the first token that covers content (a token that merged the
    // header's last characters with the content's first counts, as in transformers' masks).
    size_t first = whole.size();
    if (trained && !all) first = k == 0 ? CommonPrefix(whole, tok_->Encode(header, false)) : 0;
    for (size_t j = 0; j < whole.size(); ++j) add(whole[j], all || j >= first);
    if (k + 1 == stretches) break;
    // An image block: the begin marker, one image token per soft token, the end marker; the
    // placeholders are never targets (the markers are under --train-on all, as the text).
    const int64_t index = (*next_image)++;
    const ImageRef& image = images[static_cast<size_t>(index)];
    auto count = images_.count(image);
    if (!count.ok())
      return count.status().WithContext(
          // A file's errors name it already; an embedded image is named by its stored path.
          StrCat("image ", index + 1,
                 image.bytes.empty() || image.path.empty() ? "" : " (" + image.path + ")"));
    const size_t begin = out->ids.size();
    add(images_.boi, all);
    for (int64_t c = 0; c < *count; ++c) add(images_.image, false);
    add(images_.eoi, all);
    out->images.push_back(image);
    out->image_spans.emplace_back(begin, out->ids.size());
  }
  add(turn_close_, all || trained);
  for (int32_t id : tok_->Encode("\n", false)) add(id, all);
  return Status::Ok();
}

Status ExampleRenderer::RenderChat(const InstructionRecord& r, RenderedExample* out,
                                   std::string_view tools) const {
  std::vector<ChatMessage> pair;
  const std::vector<ChatMessage>* messages = &r.messages;
  if (r.messages.empty()) {
    const bool context = !StripPythonWhitespace(r.context).empty();
    pair = {{"user", context ? r.instruction + "\n\n" + r.context : r.instruction},
            {"assistant", r.response}};
    messages = &pair;
  }
  ST_RETURN_IF_ERROR(CheckImageCount(*messages, r.images.size()));
  const bool all = train_on_ == TrainOn::kAll;
  out->ids.push_back(bos_);
  out->trained.push_back(all ? 1 : 0);
  int64_t next_image = 0;
  const bool system = !messages->empty() && messages->front().role == "system";
  if (!tools.empty() && !system)  // the declarations' own system turn
    ST_RETURN_IF_ERROR(RenderTurn({"system", ""}, all, false, {}, &next_image, out));
  for (size_t i = 0; i < messages->size(); ++i) {
    const ChatMessage& m = (*messages)[i];
    if (m.role == "system" && i != 0)
      return InvalidArgument(
          StrCat("message ", i + 1,
                 " is a system turn; Gemma's chat template takes one only as the first message "
                 "(move it first, or use --template instruction)"));
    ST_RETURN_IF_ERROR(RenderTurn(m, all, m.role == "assistant", r.images, &next_image, out));
  }
  if (!tools.empty()) {
    // Before the system turn's `<turn|>\n`: the declarations, their control tokens split out as
    // the tokenizer does for the template's whole string.
    size_t at = 1;  // after <bos>: the system turn's <turn|>
    while (at < out->ids.size() && out->ids[at] != turn_close_) ++at;
    ST_CHECK(at < out->ids.size()) << "a system turn";
    const std::vector<int32_t> ids = tok_->Encode(tools, false);
    out->ids.insert(out->ids.begin() + static_cast<int64_t>(at), ids.begin(), ids.end());
    out->trained.insert(out->trained.begin() + static_cast<int64_t>(at), ids.size(), all ? 1 : 0);
  }
  return Status::Ok();
}

Status ExampleRenderer::RenderConversation(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt, std::vector<int32_t>* out,
                                           std::string_view tools) const {
  if (kind_ != TemplateKind::kGemmaChat)
    return InvalidArgument(
        "conversations need a chat template: the tokenizer has no <|turn> and <turn|> tokens "
        "(or --template is not gemma-chat)");
  if (messages.empty() && tools.empty()) {  // apply_chat_template of [] is the bos alone
    out->assign(1, bos_);
  } else {
    InstructionRecord r;
    r.messages = messages;
    RenderedExample ex;
    ST_RETURN_IF_ERROR(RenderChat(r, &ex, tools));
    *out = std::move(ex.ids);
  }
  if (add_generation_prompt) {
    out->push_back(turn_open_);
    for (int32_t id : tok_->Encode("model\n", false)) out->push_back(id);
  }
  return Status::Ok();
}

Status ExampleRenderer::RenderPrompt(const std::vector<ChatMessage>& messages, bool start,
                                     std::vector<int32_t>* out,
                                     std::span<const ImageRef> images) const {
  ST_RETURN_IF_ERROR(CheckImageCount(messages, images.size()));
  if (!images.empty() && kind_ != TemplateKind::kGemmaChat)
    return InvalidArgument(
        StrCat("images need --template gemma-chat, not ", TemplateKindName(kind_)));
  if (messages.empty() || messages.back().role != "user")
    return InvalidArgument("a prompt must end with a user message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "user" && role != "system")
      return InvalidArgument(StrCat("a prompt holds user and system messages, not '", role, "'"));
    if (role == "system" && (i != 0 || !start))
      return InvalidArgument("a system message can only open a conversation");
  }
  if (kind_ == TemplateKind::kGemmaChat) {
    if (start)
      out->push_back(bos_);
    else
      for (int32_t id : tok_->Encode("\n", false)) out->push_back(id);
    RenderedExample turns;
    int64_t next_image = 0;
    for (const ChatMessage& m : messages)
      ST_RETURN_IF_ERROR(RenderTurn(m, true, false, images, &next_image, &turns));
    out->insert(out->end(), turns.ids.begin(), turns.ids.end());
    out->push_back(turn_open_);
    for (int32_t id : tok_->Encode("model\n", false)) out->push_back(id);
    return Status::Ok();
  }
  InstructionRecord r;
  r.instruction = messages.back().content;
  if (messages.front().role == "system") r.context = messages.front().content;
  std::string text = prompt_.Format(r);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (start) {
    std::vector<int32_t> prefix, suffix;
    tok_->SpecialsAround(&prefix, &suffix);
    out->insert(out->end(), prefix.begin(), prefix.end());
  } else {
    text = "\n" + text;
  }
  for (int32_t id : tok_->Encode(text, false)) out->push_back(id);
  return Status::Ok();
}

void ExampleRenderer::RenderText(const InstructionRecord& r, RenderedExample* out) const {
  std::vector<PromptTemplate::CharSpan> spans;
  const std::string text = prompt_.Format(r, train_on_ == TrainOn::kAll ? nullptr : &spans);
  std::vector<int32_t> prefix, suffix;
  tok_->SpecialsAround(&prefix, &suffix);
  const std::vector<int32_t> plain = tok_->Encode(text, false);
  std::vector<uint8_t> trained(plain.size(), train_on_ == TrainOn::kAll ? 1 : 0);
  // The tokens that overlap each response's bytes: where the text's tokens and those of the text
  // cut at the boundary part ways (a token across the boundary belongs to the response).
  for (const PromptTemplate::CharSpan& s : spans) {
    const std::vector<int32_t> to_begin =
        tok_->Encode(std::string_view(text).substr(0, s.begin), false);
    const std::vector<int32_t> to_end =
        tok_->Encode(std::string_view(text).substr(0, s.end), false);
    const size_t b = CommonPrefix(plain, to_begin);
    size_t e = CommonPrefix(plain, to_end);
    if (e < to_end.size()) ++e;
    for (size_t j = b; j < std::min(e, plain.size()); ++j) trained[j] = 1;
  }
  const uint8_t special = train_on_ == TrainOn::kAll ? 1 : 0;
  out->ids = prefix;
  out->trained.assign(prefix.size(), special);
  out->ids.insert(out->ids.end(), plain.begin(), plain.end());
  out->trained.insert(out->trained.end(), trained.begin(), trained.end());
  out->ids.insert(out->ids.end(), suffix.begin(), suffix.end());
  out->trained.insert(out->trained.end(), suffix.size(), special);
  out->tail = suffix.size();
}

}  // namespace st
