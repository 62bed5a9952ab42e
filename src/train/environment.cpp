#include "train/environment.h"

namespace st {
namespace {

using json = nlohmann::json;

// One answer line: a user turn or tool results; nullopt when the episode is over (or, with *why
// set, when the line is none of the accepted forms).
struct Answer {
  std::string user;
  std::vector<ToolResult> tools;  // empty for a user turn; names may be empty (the call's)
};

std::string ParseToolResult(const json& j, std::vector<ToolResult>* out) {
  if (!j.is_object()) return "a tool result that is not an object";
  auto c = j.find("content");
  if (c == j.end()) return "a tool result without 'content'";
  auto n = j.find("name");
  if (n != j.end() && !n->is_string()) return "a tool result whose 'name' is not a string";
  out->push_back({n == j.end() ? "" : n->get<std::string>(), *c});
  return "";
}

std::optional<Answer> ParseAnswer(std::string_view line, std::string* why) {
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) return *why = "not JSON", std::nullopt;
  if (j.is_null()) return std::nullopt;
  Answer a;
  if (j.is_array()) {
    if (j.empty()) return *why = "an empty list", std::nullopt;
    for (const json& t : j) {
      if (!t.is_object() || t.value("role", "") != "tool")
        return *why = "a list whose items are not all tool results (role 'tool')", std::nullopt;
      if (std::string w = ParseToolResult(t, &a.tools); !w.empty()) return *why = w, std::nullopt;
    }
    return a;
  }
  if (!j.is_object()) return *why = "not an object", std::nullopt;
  if (j.empty()) return std::nullopt;
  if (auto d = j.find("done");
      d != j.end() && d->is_boolean() && d->get<bool>() && !j.contains("content"))
    return std::nullopt;
  auto r = j.find("role");
  if (r != j.end() && !r->is_string()) return *why = "a role that is not a string", std::nullopt;
  const std::string role = r == j.end() ? "user" : r->get<std::string>();
  if (role == "tool") {
    if (std::string w = ParseToolResult(j, &a.tools); !w.empty()) return *why = w, std::nullopt;
    return a;
  }
  if (role != "user")
    return *why = "the role '" + role + "' (a turn is 'user' or 'tool')", std::nullopt;
  auto c = j.find("content");
  if (c == j.end() || !c->is_string()) return *why = "no string 'content'", std::nullopt;
  a.user = c->get<std::string>();
  return a;
}

constexpr const char* kForms =
    "; answer null, {\"done\": true}, {\"role\": \"user\", \"content\": \"...\"} or tool results "
    "{\"role\": \"tool\", \"name\": \"...\", \"content\": ...} (one, or a list)";

}  // namespace

Environment::Environment(std::unique_ptr<JsonLinesProgram> program, const ExampleRenderer& renderer,
                         const Tokenizer& tok)
    : program_(std::move(program)),
      renderer_(&renderer),
      tok_(&tok),
      tools_(ToolCallFormat::Of(tok)) {}

json Environment::AssistantMessage(std::span<const int32_t> ids) const {
  if (tools_) return tools_->AssistantMessage(ids);
  return json{{"role", "assistant"}, {"content", tok_->Decode(ids, true)}};
}

StatusOr<std::vector<std::optional<std::vector<int32_t>>>> Environment::Next(
    const std::vector<EndedTurn>& ended) {
  std::vector<json> states;
  states.reserve(ended.size());
  for (const EndedTurn& e : ended) {
    e.episode->push_back(AssistantMessage(e.ids));
    json s = e.row;
    s["messages"] = *e.episode;
    s["completion"] = e.episode->back()["content"];
    s["turn"] = e.turn;
    states.push_back(std::move(s));
  }
  ST_ASSIGN_OR_RETURN(const std::vector<std::string> lines,
                      program_->Ask(states, [](std::string_view line) {
                        std::string why;
                        ParseAnswer(line, &why);
                        return why.empty() ? why : why + kForms;
                      }));
  const std::vector<int32_t> newline = tok_->Encode("\n", false);
  std::vector<std::optional<std::vector<int32_t>>> out;
  out.reserve(lines.size());
  for (size_t k = 0; k < lines.size(); ++k) {
    std::string why;
    std::optional<Answer> a = ParseAnswer(lines[k], &why);
    if (!a) {
      out.emplace_back();
      continue;
    }
    const EndedTurn& e = ended[k];
    const bool called = !e.ids.empty() && e.ids.back() == tool_stop();
    json& episode = *e.episode;
    std::vector<int32_t> ids;
    if (!a->tools.empty()) {
      if (!called)
        return program_->Fail(InvalidArgument(StrCat(
            program_->Quoted(), " answered line ",
            program_->lines_read() - static_cast<int64_t>(lines.size() - k) + 1, " (completion ", k,
            ") with tool results, but that model turn called no tool (it did not stop at "
            "<|tool_response>); answer tool results only to a turn whose message has tool_calls")));
      const json& last = episode.back();
      const json calls = last.value("tool_calls", json::array());
      for (size_t i = 0; i < a->tools.size(); ++i) {
        ToolResult& t = a->tools[i];
        if (t.name.empty())
          t.name = i < calls.size() ? calls[i].at("function").value("name", "unknown") : "unknown";
        episode.push_back({{"role", "tool"}, {"name", t.name}, {"content", t.content}});
      }
      ids = tools_->RenderResults(a->tools);
    } else {
      episode.push_back({{"role", "user"}, {"content", a->user}});
      ST_RETURN_IF_ERROR(renderer_->RenderPrompt({ChatMessage{"user", a->user}},
                                                 /*start=*/false, &ids));
      // After a tool call the model's turn is still open: the template writes the user's turn
      // right after <|tool_response>, without the newline that follows a closed turn.
      if (called &&
          std::equal(newline.begin(), newline.end(), ids.begin(),
                     ids.begin() + static_cast<int64_t>(std::min(ids.size(), newline.size()))))
        ids.erase(ids.begin(), ids.begin() + static_cast<int64_t>(newline.size()));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

StatusOr<std::unique_ptr<Environment>> MakeCommandEnvironment(const std::string& command,
                                                              double timeout_s,
                                                              const ExampleRenderer& renderer,
                                                              const Tokenizer& tok) {
  ST_ASSIGN_OR_RETURN(
      std::unique_ptr<JsonLinesProgram> p,
      MakeJsonLinesProgram(command, timeout_s, "environment command", "--reward-timeout"));
  return std::make_unique<Environment>(std::move(p), renderer, tok);
}

}  // namespace st
