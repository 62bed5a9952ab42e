#include "train/environment.h"

namespace st {
namespace {

using json = nlohmann::json;

// The next turn of an answer line, nullopt when the episode is over; *why set when the line is
// none of the accepted forms.
std::optional<std::string> ParseTurn(std::string_view line, std::string* why) {
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) return *why = "not JSON", std::nullopt;
  if (j.is_null()) return std::nullopt;
  if (!j.is_object()) return *why = "not an object", std::nullopt;
  if (j.empty()) return std::nullopt;
  if (auto d = j.find("done");
      d != j.end() && d->is_boolean() && d->get<bool>() && !j.contains("content"))
    return std::nullopt;
  auto c = j.find("content");
  if (c == j.end() || !c->is_string()) return *why = "no string 'content'", std::nullopt;
  if (auto r = j.find("role"); r != j.end() && (!r->is_string() || r->get<std::string>() != "user"))
    return *why = "a role other than 'user' (the chat template renders user turns)", std::nullopt;
  return c->get<std::string>();
}

constexpr const char* kForms =
    "; answer null, {\"done\": true} or {\"role\": \"user\", \"content\": \"...\"}";

}  // namespace

StatusOr<std::vector<std::optional<std::string>>> Environment::Next(
    const std::vector<json>& states) {
  ST_ASSIGN_OR_RETURN(const std::vector<std::string> lines,
                      program_->Ask(states, [](std::string_view line) {
                        std::string why;
                        ParseTurn(line, &why);
                        return why.empty() ? why : why + kForms;
                      }));
  std::vector<std::optional<std::string>> out;
  out.reserve(lines.size());
  for (const std::string& line : lines) {
    std::string why;
    out.push_back(ParseTurn(line, &why));
  }
  return out;
}

StatusOr<std::unique_ptr<Environment>> MakeCommandEnvironment(const std::string& command,
                                                              double timeout_s) {
  ST_ASSIGN_OR_RETURN(
      std::unique_ptr<JsonLinesProgram> p,
      MakeJsonLinesProgram(command, timeout_s, "environment command", "--reward-timeout"));
  return std::make_unique<Environment>(std::move(p));
}

}  // namespace st
