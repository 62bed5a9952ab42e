#include "data/tool_calls.h"

#include <algorithm>
#include <cctype>

#include "data/utf8.h"

namespace st {
namespace {

using json = nlohmann::json;

constexpr std::string_view kQuote = "<|\"|>";  // the template's string delimiter

// A recursive-descent reader of the template's format_argument syntax.
class ValueReader {
 public:
  explicit ValueReader(std::string_view s) : s_(s) {}

  StatusOr<json> Value() {
    if (++depth_ > 64) return Error("nested too deeply");
    StatusOr<json> v = ValueAt();
    --depth_;
    return v;
  }
  StatusOr<json> Object() {  // at '{'
    ++pos_;
    json out = json::object();
    if (Eat('}')) return out;
    while (true) {
      std::string key;
      if (s_.substr(pos_).starts_with(kQuote)) {
        ST_ASSIGN_OR_RETURN(key, String());
      } else {
        const size_t begin = pos_;
        while (pos_ < s_.size() && s_[pos_] != ':' && s_[pos_] != ',' && s_[pos_] != '}' &&
               s_[pos_] != '{')
          ++pos_;
        key = std::string(s_.substr(begin, pos_ - begin));
        if (key.empty()) return Error("a key is missing");
      }
      if (!Eat(':')) return Error("':' expected after key '" + key + "'");
      ST_ASSIGN_OR_RETURN(json v, Value());
      out[key] = std::move(v);
      if (Eat('}')) return out;
      if (!Eat(',')) return Error("',' or '}' expected");
    }
  }
  bool AtEnd() const { return pos_ == s_.size(); }
  size_t pos() const { return pos_; }
  Status Error(const std::string& what) const {
    return InvalidArgument(StrCat(what, " at character ", pos_));
  }

 private:
  StatusOr<json> ValueAt() {
    if (pos_ >= s_.size()) return Error("a value is missing");
    const char c = s_[pos_];
    if (c == '{') return Object();
    if (c == '[') {
      ++pos_;
      json out = json::array();
      if (Eat(']')) return out;
      while (true) {
        ST_ASSIGN_OR_RETURN(json v, Value());
        out.push_back(std::move(v));
        if (Eat(']')) return out;
        if (!Eat(',')) return Error("',' or ']' expected");
      }
    }
    if (s_.substr(pos_).starts_with(kQuote)) {
      ST_ASSIGN_OR_RETURN(std::string v, String());
      return json(std::move(v));
    }
    for (const auto& [word, value] :
         {std::pair<std::string_view, json>{"true", true}, {"false", false}, {"null", nullptr}})
      if (s_.substr(pos_).starts_with(word)) {
        pos_ += word.size();
        return value;
      }
    return Number();
  }
  StatusOr<std::string> String() {  // at <|"|>
    pos_ += kQuote.size();
    const size_t end = s_.find(kQuote, pos_);
    if (end == std::string_view::npos) return Error("a string is not closed");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + kQuote.size();
    return out;
  }
  StatusOr<json> Number() {
    size_t end = pos_;
    while (end < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[end])) ||
                               std::string_view("+-.eE").find(s_[end]) != std::string_view::npos))
      ++end;
    if (end == pos_) return Error("a value is expected");
    const std::string text(s_.substr(pos_, end - pos_));
    // JSON's own number grammar decides (no "1.", "+1" or "0x10").
    const json v = json::parse(text, nullptr, false);
    if (v.is_discarded() || !v.is_number()) return Error("'" + text + "' is not a number");
    pos_ = end;
    return v;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Jinja's dictsort (case-insensitive by default) over an object's keys.
std::vector<std::string> SortedKeys(const json& object) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : object.items()) keys.push_back(k);
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::stable_sort(keys.begin(), keys.end(),
                   [&](const std::string& a, const std::string& b) { return lower(a) < lower(b); });
  return keys;
}

// The template's format_argument.
std::string FormatArgument(const json& v, bool escape_keys = true) {
  if (v.is_null()) return "null";
  if (v.is_string()) return StrCat(kQuote, v.get<std::string>(), kQuote);
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const std::string& k : SortedKeys(v)) {
      if (!first) out += ",";
      first = false;
      out += escape_keys ? StrCat(kQuote, k, kQuote) : k;
      out += ":";
      out += FormatArgument(v.at(k), escape_keys);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ",";
      out += FormatArgument(v[i], escape_keys);
    }
    return out + "]";
  }
  return v.dump();  // a number
}

// Jinja truthiness of an optional member (absent, null, false, 0, "" and empty containers are
// false).
bool Truthy(const json& object, const char* key) {
  if (!object.is_object()) return false;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_string() || it->is_array() || it->is_object()) return !it->empty();
  if (it->is_number()) return it->get<double>() != 0;
  return true;
}

std::string Upper(const json& object, const char* key) {
  std::string s;
  if (auto it = object.find(key); it != object.end() && it->is_string()) s = it->get<std::string>();
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string QuotedList(const json& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i)
    out += StrCat(i ? "," : "", kQuote,
                  items[i].is_string() ? items[i].get<std::string>() : items[i].dump(), kQuote);
  return out + "]";
}

// The template's format_parameters: one `key:{...}` per property, keys in dictsort order; with
// filter_keys the schema's own keys (description, type, ...) are skipped.
std::string FormatParameters(const json& properties, bool filter_keys = false) {
  static const std::vector<std::string> kStandard = {"description", "type", "properties",
                                                     "required", "nullable"};
  std::string out;
  bool found_first = false;
  for (const std::string& key : SortedKeys(properties)) {
    if (filter_keys && std::find(kStandard.begin(), kStandard.end(), key) != kStandard.end())
      continue;
    const json& value = properties.at(key);
    if (found_first) out += ",";
    found_first = true;
    out += key;
    out += ":{";
    bool comma = false;
    auto sep = [&] {
      if (comma) out += ",";
      comma = true;
    };
    if (Truthy(value, "description")) {
      const json& d = value["description"];
      out +=
          StrCat("description:", kQuote, d.is_string() ? d.get<std::string>() : d.dump(), kQuote);
      comma = true;
    }
    const std::string type = value.is_object() ? Upper(value, "type") : "";
    if (type == "STRING") {
      if (Truthy(value, "enum")) {
        sep();
        out += "enum:";
        out += FormatArgument(value["enum"]);
      }
    } else if (type == "ARRAY") {
      if (Truthy(value, "items") && value["items"].is_object()) {
        sep();
        out += "items:{";
        bool first_item = true;
        const json& items = value["items"];
        for (const std::string& ik : SortedKeys(items)) {
          const json& iv = items.at(ik);
          if (iv.is_null()) continue;
          if (!first_item) out += ",";
          first_item = false;
          if (ik == "properties") {
            out += StrCat("properties:{", iv.is_object() ? FormatParameters(iv) : "", "}");
          } else if (ik == "required") {
            out += StrCat("required:", QuotedList(iv));
          } else if (ik == "type") {
            if (iv.is_string()) {
              out += StrCat("type:", FormatArgument(Upper(items, "type")));
            } else {
              json up = json::array();
              for (const json& t : iv) up.push_back(Upper(json{{"t", t}}, "t"));
              out += StrCat("type:", FormatArgument(up));
            }
          } else {
            out += StrCat(ik, ":", FormatArgument(iv));
          }
        }
        out += "}";
      }
    }
    if (Truthy(value, "nullable")) {
      sep();
      out += "nullable:true";
    }
    if (type == "OBJECT") {
      if (value.contains("properties") && value["properties"].is_object()) {
        sep();
        out += StrCat("properties:{", FormatParameters(value["properties"]), "}");
      } else if (value.is_object()) {
        sep();
        out += StrCat("properties:{", FormatParameters(value, /*filter_keys=*/true), "}");
      }
      if (Truthy(value, "required")) {
        sep();
        out += StrCat("required:", QuotedList(value["required"]));
      }
    }
    sep();
    out += StrCat("type:", kQuote, type, kQuote, "}");
  }
  return out;
}

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// The template's format_argument for a result's content.
std::string ResultValue(const json& content) {
  if (content.is_string()) return StrCat(kQuote, content.get<std::string>(), kQuote);
  if (content.is_object() || content.is_array()) return StrCat(kQuote, content.dump(), kQuote);
  return content.dump();  // a number, true, false, null
}

}  // namespace

StatusOr<json> ParseToolCall(std::string_view text) {
  if (!text.starts_with("call:")) return InvalidArgument("a tool call starts with 'call:'");
  size_t n = 5;
  while (n < text.size() && IsNameChar(text[n])) ++n;
  if (n == 5) return InvalidArgument("a tool call names its function after 'call:'");
  const std::string name(text.substr(5, n - 5));
  if (n == text.size() || text[n] != '{')
    return InvalidArgument(StrCat("'{' expected after 'call:", name, "'"));
  ValueReader r(text.substr(n));
  StatusOr<json> args = r.Object();
  if (!args.ok())
    return InvalidArgument(StrCat("the arguments of '", name, "': ", args.status().message()));
  if (!r.AtEnd()) return InvalidArgument(StrCat("text after the arguments of '", name, "'"));
  return json{{"type", "function"},
              {"function", {{"name", name}, {"arguments", *std::move(args)}}}};
}

StatusOr<std::string> ToolDeclarations(const json& tools) {
  if (!tools.is_array()) return InvalidArgument("tools are a list of function schemas");
  std::string out;
  for (size_t i = 0; i < tools.size(); ++i) {
    // {"type": "function", "function": {...}} as transformers passes them; a bare function schema
    // ({"name", "description", "parameters"}) is taken as its "function".
    const json& t = tools[i];
    const json& f = t.is_object() && t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      return InvalidArgument(StrCat("tool ", i + 1, " has no 'function' with a string 'name'"));
    const std::string name = f["name"].get<std::string>();
    for (const char* key : {"description", "parameters"})
      if (f.contains(key) && !f[key].is_null() &&
          !(std::string_view(key) == "description" ? f[key].is_string() : f[key].is_object()))
        return InvalidArgument(
            StrCat("tool '", name, "': '", key, "' is not ",
                   std::string_view(key) == "description" ? "text" : "an object"));
    std::string d = StrCat("declaration:", name, "{description:", kQuote,
                           f.contains("description") && f["description"].is_string()
                               ? f["description"].get<std::string>()
                               : std::string(),
                           kQuote);
    if (Truthy(f, "parameters")) {
      const json& params = f["parameters"];
      d += ",parameters:{";
      if (Truthy(params, "properties") && params["properties"].is_object())
        d += StrCat("properties:{", FormatParameters(params["properties"]), "},");
      if (Truthy(params, "required")) d += StrCat("required:", QuotedList(params["required"]), ",");
      if (Truthy(params, "type")) d += StrCat("type:", kQuote, Upper(params, "type"), kQuote, "}");
    }
    if (f.contains("response")) {
      const json& r = f["response"];
      d += ",response:{";
      if (Truthy(r, "description"))
        d += StrCat("description:", kQuote, r["description"].get<std::string>(), kQuote, ",");
      if (Upper(r, "type") == "OBJECT") d += StrCat("type:", kQuote, "OBJECT", kQuote, "}");
    }
    d += "}";
    out += StrCat("<|tool>", StripPythonWhitespace(d), "<tool|>");
  }
  return out;
}

std::optional<ToolCallFormat> ToolCallFormat::Of(const Tokenizer& tok) {
  ToolCallFormat f;
  f.tok_ = &tok;
  const auto open = tok.TokenToId("<|tool_call>"), close = tok.TokenToId("<tool_call|>"),
             response = tok.TokenToId("<|tool_response>"),
             response_close = tok.TokenToId("<tool_response|>");
  if (!open || !close || !response || !response_close) return std::nullopt;
  f.call_open_ = *open;
  f.call_close_ = *close;
  f.response_open_ = *response;
  return f;
}

json ToolCallFormat::AssistantMessage(std::span<const int32_t> ids) const {
  std::vector<int32_t> text;
  json calls = json::array();
  bool parsed = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != call_open_) {
      text.push_back(ids[i]);
      continue;
    }
    size_t end = i + 1;
    while (end < ids.size() && ids[end] != call_close_) ++end;
    StatusOr<json> call = ParseToolCall(tok_->Decode(ids.subspan(i + 1, end - i - 1), false));
    if (end == ids.size() || !call.ok()) {  // unclosed or malformed: the turn is plain text
      parsed = false;
      break;
    }
    calls.push_back(*std::move(call));
    i = end;
  }
  if (!parsed) return json{{"role", "assistant"}, {"content", tok_->Decode(ids, true)}};
  json m = {{"role", "assistant"}, {"content", tok_->Decode(text, true)}};
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  return m;
}

std::vector<int32_t> ToolCallFormat::RenderResults(const std::vector<ToolResult>& results) const {
  std::string text;
  for (size_t i = 0; i < results.size(); ++i)
    text += StrCat(i > 0 ? "<|tool_response>" : "", "response:", results[i].name,
                   "{value:", ResultValue(results[i].content), "}<tool_response|>");
  return tok_->Encode(text, false);
}

}  // namespace st
