// Instruction records from data files (one row interface, data/formats/rows.h), split
// resolution of directories (data/data_files.h), the split syntax and the prompt template.
#include "data/dataset.h"

#include <cerrno>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_files.h"
#include "data/utf8.h"
#include "io/files.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-' || s[0] == '+') {
    neg = s[0] == '-';
    i = 1;
  }
  if (i == s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

StatusOr<SplitSpec::Bound> ParseBound(std::string_view s, std::string_view whole) {
  SplitSpec::Bound b;
  s = Trim(s);
  if (s.empty()) return b;
  b.set = true;
  if (s.back() == '%') {
    b.percent = true;
    s.remove_suffix(1);
  }
  if (!ParseInt(Trim(s), &b.value))
    return InvalidArgument(StrCat("split '", whole, "': '", s, "' is not an integer"));
  if (b.percent && (b.value < -100 || b.value > 100))
    return InvalidArgument(StrCat("split '", whole, "': percentages must be in [-100%, 100%]"));
  return b;
}

// Python's round(): to the closest integer, halves to even.
int64_t RoundHalfEven(double x) {
  const int old = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double r = std::nearbyint(x);
  std::fesetround(old);
  return static_cast<int64_t>(r);
}

}  // namespace

bool SplitSpec::needs_count() const {
  auto needs = [](const Bound& b) { return b.set && (b.percent || b.value < 0); };
  return needs(begin) || needs(end);
}

std::pair<int64_t, int64_t> SplitSpec::Resolve(int64_t n) const {
  auto abs = [n](const Bound& b, int64_t dflt) {
    if (!b.set) return dflt;
    int64_t v = b.percent ? RoundHalfEven(static_cast<double>(b.value) * n / 100.0) : b.value;
    if (v < 0) v += n;
    return std::clamp<int64_t>(v, 0, n);
  };
  const int64_t b = abs(begin, 0), e = abs(end, n);
  return {b, std::max(b, e)};
}

std::string SplitSpec::ToString() const {
  if (!begin.set && !end.set) return name;
  auto s = [](const Bound& b) {
    return b.set ? StrCat(b.value, b.percent ? "%" : "") : std::string();
  };
  return StrCat(name, "[", s(begin), ":", s(end), "]");
}

StatusOr<SplitSpec> ParseSplit(std::string_view text) {
  SplitSpec spec;
  std::string_view t = Trim(text);
  size_t lb = t.find('[');
  spec.name = std::string(Trim(t.substr(0, lb)));
  if (spec.name.empty() || spec.name.find_first_of("[]:/\\ ") != std::string::npos)
    return InvalidArgument(StrCat("split '", text, "': expected a name like train or train[:10%]"));
  if (lb == std::string_view::npos) return spec;
  if (t.back() != ']') return InvalidArgument(StrCat("split '", text, "': missing ']'"));
  std::string_view inner = t.substr(lb + 1, t.size() - lb - 2);
  size_t colon = inner.find(':');
  if (colon == std::string_view::npos)
    return InvalidArgument(
        StrCat("split '", text, "': a slice needs ':' (train[:100], train[10:20], train[-10%:])"));
  ST_ASSIGN_OR_RETURN(spec.begin, ParseBound(inner.substr(0, colon), text));
  ST_ASSIGN_OR_RETURN(spec.end, ParseBound(inner.substr(colon + 1), text));
  return spec;
}

const char* LayoutName(DatasetLayout layout) {
  switch (layout) {
    case DatasetLayout::kDolly:
      return "dolly (instruction, context, response)";
    case DatasetLayout::kAlpaca:
      return "alpaca (instruction, input, output)";
    case DatasetLayout::kCustom:
      return "custom fields";
    case DatasetLayout::kConversation:
      return "conversation (role/content or from/value turns)";
    case DatasetLayout::kPreference:
      return "preference (prompt, chosen, rejected)";
    case DatasetLayout::kPrompt:
      return "prompt-only (prompt and the rewards' columns)";
    case DatasetLayout::kDetect:
      break;
  }
  return "undetected";
}

std::string DatasetReport::Summary() const {
  std::string s = StrCat("dataset ", file, " records [", begin, ", ", end, "): ", used, " used, ",
                         skipped, " skipped");
  if (skipped > 0) {
    s += " (";
    for (size_t i = 0; i < skipped_lines.size(); ++i)
      s += StrCat(i ? "; " : "", unit, " ", skipped_lines[i].first, ": ", skipped_lines[i].second);
    if (skipped > static_cast<int64_t>(skipped_lines.size())) s += "; ...";
    s += ")";
  }
  return s;
}

namespace {

// Reads one field: absent -> nullopt with no error; a string -> value; else error text.
bool GetString(json& rec, const std::string& field, std::string* out, std::string* why) {
  auto it = rec.find(field);
  if (it == rec.end()) {
    *why = StrCat("no field '", field, "'");
    return false;
  }
  if (it->is_null()) {
    out->clear();
    return true;
  }
  if (!it->is_string()) {
    *why = StrCat("field '", field, "' is not a string");
    return false;
  }
  *out = std::move(it->get_ref<std::string&>());
  return true;
}

}  // namespace

namespace {

bool HasGlob(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

std::string Normalise(const std::string& role) {
  if (role == "human" || role == "user") return "user";
  if (role == "gpt" || role == "assistant" || role == "model" || role == "chatgpt")
    return "assistant";
  return role;
}

bool IsImagePart(const json& part) {
  return part.is_object() && part.contains("type") && part["type"].is_string() &&
         part["type"].get<std::string>() == "image";
}

// A content list with image parts: the stretches of text between them, each text part stripped
// as Gemma 4's chat template strips it ({{ item['text'] | trim }}).
bool ContentSegments(const json& c, ChatMessage* m) {
  m->segments.assign(1, std::string());
  m->content.clear();
  for (const json& part : c) {
    if (IsImagePart(part)) {
      m->segments.emplace_back();
      continue;
    }
    std::string_view text;
    if (part.is_string())
      text = part.get_ref<const std::string&>();
    else if (part.is_object() && part.contains("text") && part["text"].is_string())
      text = part["text"].get_ref<const std::string&>();
    else
      return false;
    m->segments.back() += StripPythonWhitespace(text);
    m->content += StripPythonWhitespace(text);
  }
  return true;
}

// A turn's content: a string, null, or a list of parts ({"type": "text", "text": ...}).
bool ContentText(const json& c, std::string* out) {
  if (c.is_null()) return out->clear(), true;
  if (c.is_string()) return *out = c.get<std::string>(), true;
  if (!c.is_array()) return false;
  out->clear();
  for (const json& part : c) {
    if (part.is_string()) {
      *out += part.get<std::string>();
    } else if (part.is_object() && part.contains("text") && part["text"].is_string()) {
      *out += part["text"].get<std::string>();
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<InstructionDataset> InstructionDataset::Open(const DatasetOptions& options) {
  InstructionDataset ds;
  ST_ASSIGN_OR_RETURN(ds.split_, ParseSplit(options.split));
  const std::string& path = options.path;
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    ST_ASSIGN_OR_RETURN(std::vector<std::string> listing, ListRepoFiles(path));
    const fs::path readme = fs::path(path) / "README.md";
    std::string readme_text;
    if (fs::exists(readme, ec)) {
      ST_ASSIGN_OR_RETURN(readme_text, ReadTextFile(readme.string()));
    }
    StatusOr<SplitFiles> sf =
        ResolveSplitFiles(listing, readme_text, options.config, ds.split_.name);
    if (!sf.ok()) {
      // Earlier slicetrain read <dir>/<split>.jsonl or .json for any split name; kept.
      for (const char* ext : {".jsonl", ".json"}) {
        const fs::path p = fs::path(path) / (ds.split_.name + ext);
        if (options.config.empty() && fs::is_regular_file(p, ec)) paths = {p.string()};
      }
      if (paths.empty()) return sf.status().WithContext("data set " + path);
    } else {
      ds.config_ = sf->config;
      for (const std::string& f : sf->files) paths.push_back((fs::path(path) / f).string());
    }
  } else if (fs::exists(path, ec) || HasGlob(path)) {
    if (ds.split_.name != "train")
      return InvalidArgument(StrCat(
          path, ": data files given as a file or glob are the 'train' split (got '", ds.split_.name,
          "'); select rows with train[...], or pass a directory whose files name their splits"));
    if (!options.config.empty())
      return InvalidArgument(
          StrCat(path, ": --dataset-config needs a data set directory or hub id"));
    if (fs::exists(path, ec)) {
      paths = {path};
    } else {
      // The directory part before the first wildcard is listed; the rest is matched.
      const size_t wild = path.find_first_of("*?[");
      const size_t slash = path.rfind('/', wild);
      const std::string base = slash == std::string::npos ? "." : path.substr(0, slash);
      const std::string pattern = slash == std::string::npos ? path : path.substr(slash + 1);
      if (fs::is_directory(base, ec)) {
        ST_ASSIGN_OR_RETURN(std::vector<std::string> listing, ListRepoFiles(base));
        for (const std::string& f : listing)
          if (GlobMatch(pattern, f))
            paths.push_back(slash == std::string::npos ? f : (fs::path(base) / f).string());
      }
      if (paths.empty()) return NotFound(StrCat(path, ": no file matches"));
    }
  } else {
    return NotFound(StrCat(path, ": no such data set file or directory"));
  }
  for (const std::string& p : paths) {
    ST_ASSIGN_OR_RETURN(RowFile f, RowFile::Open(p, options.json_field));
    ds.files_.push_back(std::move(f));
  }

  // The layout, from the field names given or the first file's columns (or first record).
  const bool custom = !options.instruction_field.empty() || !options.context_field.empty() ||
                      !options.response_field.empty();
  if (custom) {
    ds.layout_ = DatasetLayout::kCustom;
    ds.f_instruction_ =
        options.instruction_field.empty() ? "instruction" : options.instruction_field;
    ds.f_context_ = options.context_field.empty() ? "context" : options.context_field;
    ds.f_response_ = options.response_field.empty() ? "response" : options.response_field;
  } else if (!options.messages_field.empty()) {
    ds.layout_ = DatasetLayout::kConversation;
    ds.f_messages_ = options.messages_field;
  }
  if (options.preference && (custom || !options.messages_field.empty()))
    return InvalidArgument(
        "preference data is read from its prompt/chosen/rejected columns: drop "
        "--instruction-field, --context-field, --response-field and --messages-field");
  if (options.prompts && (custom || !options.messages_field.empty()))
    return InvalidArgument(
        "prompt-only data is read from its 'prompt' column: drop --instruction-field, "
        "--context-field, --response-field and --messages-field");
  auto detect = [&](const std::function<bool(const char*)>& has) {
    if (options.prompts && has("prompt") && !(has("chosen") && has("rejected")))
      ds.layout_ = DatasetLayout::kPrompt;
    else if (has("chosen") && has("rejected"))
      ds.layout_ = DatasetLayout::kPreference;
    else if (has("instruction") && has("response"))
      ds.layout_ = DatasetLayout::kDolly;
    else if (has("instruction") && has("output"))
      ds.layout_ = DatasetLayout::kAlpaca;
    else if (has("messages"))
      ds.layout_ = DatasetLayout::kConversation, ds.f_messages_ = "messages";
    else if (has("conversations"))
      ds.layout_ = DatasetLayout::kConversation, ds.f_messages_ = "conversations";
  };
  const RowFile& first = ds.files_.front();
  std::string first_bad;  // why the first unusable record is unusable, for the error below
  std::string seen;       // the columns the detection saw
  if (!first.columns().empty()) {
    const auto& cols = first.columns();
    auto has = [&](const char* c) { return std::find(cols.begin(), cols.end(), c) != cols.end(); };
    if (ds.layout_ == DatasetLayout::kDetect) detect(has);
    for (const std::string& c : cols) seen += (seen.empty() ? "" : ", ") + c;
    std::vector<std::string> need;
    if (ds.layout_ == DatasetLayout::kCustom) need = {ds.f_instruction_, ds.f_response_};
    if (ds.layout_ == DatasetLayout::kConversation) need = {ds.f_messages_};
    for (const std::string& n : need)
      if (!has(n.c_str()))
        return InvalidArgument(StrCat(first.path(), ": no column '", n, "' (columns: ", seen,
                                      "); name the fields with --instruction-field, "
                                      "--context-field, --response-field or --messages-field"));
  } else if (ds.layout_ == DatasetLayout::kDetect) {
    Status s = first.ForEach(0, INT64_MAX, {}, [&](const Row& row) -> Status {
      if (!row.value) {
        if (first_bad.empty())
          first_bad = StrCat("; ", first.position_unit(), " ", row.position, " is ", row.error);
        return Status::Ok();
      }
      detect([&](const char* c) { return row.value->contains(c); });
      return ds.layout_ == DatasetLayout::kDetect ? Status::Ok() : StopScan();
    });
    if (!s.ok()) return s;
  }
  if (ds.layout_ == DatasetLayout::kDetect)
    return InvalidArgument(
        StrCat(first.path(),
               ": no record has Dolly's fields (instruction, response), Alpaca's "
               "(instruction, output) or a conversation (messages, conversations)",
               seen.empty() ? "" : " (columns: " + seen + ")",
               "; name the fields with --instruction-field, --context-field, --response-field "
               "or --messages-field",
               first_bad));
  if (options.preference && ds.layout_ != DatasetLayout::kPreference)
    return InvalidArgument(
        StrCat(first.path(),
               ": a preference objective needs preference data: 'chosen' and 'rejected' "
               "columns (and 'prompt' unless it is implicit), as TRL's DPOTrainer reads them",
               seen.empty() ? "" : " (columns: " + seen + ")"));
  if (options.prompts && ds.layout_ != DatasetLayout::kPrompt)
    return InvalidArgument(
        StrCat(first.path(),
               ": online RL (--objective grpo) needs prompt-only data: a 'prompt' column (text "
               "or a conversation) and the columns the rewards read, as TRL's GRPOTrainer takes",
               seen.empty() ? "" : " (columns: " + seen + ")"));
  if (!options.preference && ds.layout_ == DatasetLayout::kPreference)
    return InvalidArgument(StrCat(first.path(),
                                  ": this is preference data (chosen, rejected): train on it with "
                                  "--objective dpo or --objective orpo"));
  if (ds.layout_ == DatasetLayout::kDolly) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "context", ds.f_response_ = "response";
  } else if (ds.layout_ == DatasetLayout::kAlpaca) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "input", ds.f_response_ = "output";
  }
  if (ds.layout_ == DatasetLayout::kPrompt) {
    ds.columns_.clear();  // every column: the rewards may read any
  } else if (ds.layout_ == DatasetLayout::kConversation) {
    ds.columns_ = {ds.f_messages_};
    const auto& cols = first.columns();
    auto has = [&](const std::string& c) {
      return std::find(cols.begin(), cols.end(), c) != cols.end();
    };
    ds.f_images_ = options.images_field;
    if (!ds.f_images_.empty() && !cols.empty() && !has(ds.f_images_))
      return InvalidArgument(
          StrCat(first.path(), ": no column '", ds.f_images_, "' (--images-field)"));
    if (ds.f_images_.empty() && !cols.empty())
      ds.f_images_ = has("images") ? "images" : has("image") ? "image" : "";
    if (!ds.f_images_.empty()) ds.columns_.push_back(ds.f_images_);
  } else if (ds.layout_ == DatasetLayout::kPreference) {
    ds.columns_ = {"chosen", "rejected"};
    const auto& cols = first.columns();
    if (cols.empty() || std::find(cols.begin(), cols.end(), "prompt") != cols.end())
      ds.columns_.push_back("prompt");
  } else {
    ds.columns_ = {ds.f_instruction_, ds.f_response_};
    const auto& cols = first.columns();
    if (cols.empty() || std::find(cols.begin(), cols.end(), ds.f_context_) != cols.end())
      ds.columns_.push_back(ds.f_context_);
  }
  if (ds.split_.needs_count()) {
    int64_t count = 0;
    for (const RowFile& f : ds.files_) {
      ST_ASSIGN_OR_RETURN(int64_t n, f.CountRows());
      count += n;
    }
    std::tie(ds.begin_, ds.end_) = ds.split_.Resolve(count);
  } else {
    ds.begin_ = ds.split_.begin.set ? ds.split_.begin.value : 0;
    ds.end_ = ds.split_.end.set ? ds.split_.end.value : INT64_MAX;
    ds.end_ = std::max(ds.begin_, ds.end_);
  }
  return ds;
}

std::vector<std::string> InstructionDataset::files() const {
  std::vector<std::string> out;
  for (const RowFile& f : files_) out.push_back(f.path());
  return out;
}

namespace {

// The turns of a conversation field (role/content or ShareGPT's from/value).
bool ParseTurns(const json& list, const std::string& field, std::vector<ChatMessage>* out,
                std::string* why) {
  out->clear();
  if (!list.is_array()) return *why = StrCat("field '", field, "' is not a list of turns"), false;
  for (const json& turn : list) {
    if (!turn.is_object()) return *why = StrCat("a turn of '", field, "' is not an object"), false;
    const json* role = turn.contains("role")   ? &turn["role"]
                       : turn.contains("from") ? &turn["from"]
                                               : nullptr;
    const json* content = turn.contains("content") ? &turn["content"]
                          : turn.contains("value") ? &turn["value"]
                                                   : nullptr;
    if (!role || !role->is_string() || !content)
      return *why = StrCat("a turn of '", field, "' has no role/content (or from/value)"), false;
    ChatMessage m;
    m.role = Normalise(role->get<std::string>());
    const bool images =
        content->is_array() && std::any_of(content->begin(), content->end(), IsImagePart);
    if (images ? !ContentSegments(*content, &m) : !ContentText(*content, &m.content))
      return *why = StrCat("a turn of '", field, "' has content that is not text or images"), false;
    out->push_back(std::move(m));
  }
  return true;
}

// An image column's value: a list of images (TRL's `images`) or one (`image`); each datasets'
// Image struct ({"bytes": ..., "path": ...}, bytes taking precedence) or a path.
bool ParseImages(const json& v, const std::string& field, std::vector<ImageRef>* out,
                 std::string* why) {
  auto one = [&](const json& x, size_t k) {
    ImageRef ref;
    if (x.is_string()) {
      ref.path = x.get<std::string>();
    } else if (x.is_object()) {
      if (auto b = x.find("bytes"); b != x.end() && b->is_string())
        ref.bytes = b->get<std::string>();
      if (auto p = x.find("path"); p != x.end() && p->is_string()) ref.path = p->get<std::string>();
    }
    if (ref.bytes.empty() && ref.path.empty())
      return *why = StrCat("image ", k + 1, " of '", field,
                           "' is neither a path nor a struct with bytes or a path"),
             false;
    out->push_back(std::move(ref));
    return true;
  };
  if (!v.is_array()) return one(v, 0);
  for (size_t k = 0; k < v.size(); ++k)
    if (!one(v[k], k)) return false;
  return true;
}

// TRL's extract_prompt over Python sequences (turns, or a string's code points): the first index
// where chosen and rejected differ, one back when the element before is a space (text), and, when
// one is a prefix of the other, the shorter one's last index (the loop variable's last value).
template <typename Seq, typename Eq, typename IsSpace>
int64_t ImplicitPromptLength(const Seq& c, const Seq& r, int64_t n, Eq eq, IsSpace is_space) {
  int64_t idx = 0;
  for (idx = 0; idx < n; ++idx)
    if (!eq(c[idx], r[idx])) {
      if (idx > 0 && is_space(c[idx - 1])) --idx;
      return idx;
    }
  return n - 1;
}

std::u32string CodePoints(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (int k = 1; k < len && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

// The byte length of the first n code points of s.
size_t BytesOfCodePoints(const std::string& s, int64_t n) {
  size_t i = 0;
  for (int64_t k = 0; k < n && i < s.size(); ++k) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    i += b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  }
  return std::min(i, s.size());
}

}  // namespace

bool InstructionDataset::ToPreference(json& rec, InstructionRecord* r, std::string* why) const {
  r->prompt.clear(), r->chosen.clear(), r->rejected.clear();
  r->prompt_turns.clear(), r->chosen_turns.clear(), r->rejected_turns.clear();
  auto side = [&](const char* name) -> json* {
    auto it = rec.find(name);
    return it == rec.end() || it->is_null() ? nullptr : &*it;
  };
  json* chosen = side("chosen");
  json* rejected = side("rejected");
  json* prompt = side("prompt");
  if (!chosen) return *why = "no 'chosen' completion", false;
  if (!rejected) return *why = "no 'rejected' completion", false;
  r->conversational = chosen->is_array();
  if (rejected->is_array() != r->conversational)
    return *why = "'chosen' and 'rejected' are not both text or both conversations", false;
  // TRL's maybe_extract_prompt: a prompt column of the other kind than the completions (text
  // beside conversations) is ignored and the prompt extracted.
  if (prompt && prompt->is_array() != r->conversational) prompt = nullptr;
  if (r->conversational) {
    if (!ParseTurns(*chosen, "chosen", &r->chosen_turns, why) ||
        !ParseTurns(*rejected, "rejected", &r->rejected_turns, why))
      return false;
    if (prompt) {
      if (!ParseTurns(*prompt, "prompt", &r->prompt_turns, why)) return false;
    } else {
      auto& c = r->chosen_turns;
      auto& j = r->rejected_turns;
      const int64_t n = static_cast<int64_t>(std::min(c.size(), j.size()));
      if (n == 0) return *why = "an empty 'chosen' or 'rejected' conversation", false;
      const int64_t k = ImplicitPromptLength(
          c, j, n,
          [](const ChatMessage& a, const ChatMessage& b) {
            return a.role == b.role && a.content == b.content;
          },
          [](const ChatMessage&) { return false; });
      r->prompt_turns.assign(c.begin(), c.begin() + k);
      c.erase(c.begin(), c.begin() + k);
      j.erase(j.begin(), j.begin() + k);
    }
    if (r->chosen_turns.empty() || r->rejected_turns.empty())
      return *why = "an empty 'chosen' or 'rejected' completion", false;
    if (r->chosen_turns.size() == r->rejected_turns.size() &&
        std::equal(r->chosen_turns.begin(), r->chosen_turns.end(), r->rejected_turns.begin(),
                   [](const ChatMessage& a, const ChatMessage& b) {
                     return a.role == b.role && a.content == b.content;
                   }))
      return *why = "'chosen' equals 'rejected' (nothing to prefer)", false;
    return true;
  }
  if (!chosen->is_string() || !rejected->is_string())
    return *why = "'chosen' and 'rejected' are neither text nor conversations", false;
  r->chosen = std::move(chosen->get_ref<std::string&>());
  r->rejected = std::move(rejected->get_ref<std::string&>());
  if (prompt) {
    if (!prompt->is_string()) return *why = "field 'prompt' is not a string", false;
    r->prompt = std::move(prompt->get_ref<std::string&>());
  } else {
    const std::u32string c = CodePoints(r->chosen), j = CodePoints(r->rejected);
    const int64_t n = static_cast<int64_t>(std::min(c.size(), j.size()));
    if (n == 0) return *why = "an empty 'chosen' or 'rejected' completion", false;
    const int64_t k = ImplicitPromptLength(
        c, j, n, [](char32_t a, char32_t b) { return a == b; },
        [](char32_t a) { return a == U' '; });
    const size_t bc = BytesOfCodePoints(r->chosen, k), bj = BytesOfCodePoints(r->rejected, k);
    r->prompt = r->chosen.substr(0, bc);
    r->chosen.erase(0, bc);
    r->rejected.erase(0, bj);
  }
  if (r->chosen.empty() || r->rejected.empty())
    return *why = "an empty 'chosen' or 'rejected' completion", false;
  if (r->chosen == r->rejected)
    return *why = "'chosen' equals 'rejected' (nothing to prefer)", false;
  return true;
}

bool InstructionDataset::ToRecord(const Row& row, InstructionRecord* r, std::string* why) const {
  if (!row.value) return *why = std::string(row.error), false;
  json& rec = *row.value;  // the reader's scratch: strings are moved out, not copied
  r->line = row.position;
  r->messages.clear();
  if (layout_ == DatasetLayout::kPreference) return ToPreference(rec, r, why);
  if (layout_ == DatasetLayout::kPrompt) {
    auto it = rec.find("prompt");
    if (it == rec.end() || it->is_null()) return *why = "no 'prompt'", false;
    r->prompt.clear(), r->prompt_turns.clear();
    r->conversational = it->is_array();
    if (r->conversational) {
      if (!ParseTurns(*it, "prompt", &r->prompt_turns, why)) return false;
      if (r->prompt_turns.empty()) return *why = "an empty 'prompt' conversation", false;
    } else if (it->is_string()) {
      r->prompt = it->get<std::string>();
      if (r->prompt.empty()) return *why = "an empty 'prompt'", false;
    } else {
      return *why = "'prompt' is neither text nor a conversation", false;
    }
    r->columns = std::move(rec);  // the prompt included: a reward sees the row as it is
    return true;
  }
  if (layout_ == DatasetLayout::kConversation) {
    r->instruction.clear(), r->context.clear(), r->response.clear();
    auto it = rec.find(f_messages_);
    if (it == rec.end()) return *why = StrCat("no field '", f_messages_, "'"), false;
    if (!ParseTurns(*it, f_messages_, &r->messages, why)) return false;
    r->images.clear();
    const std::string& field =
        f_images_.empty() ? (rec.contains("images") ? "images" : "image") : f_images_;
    if (auto im = rec.find(field); im != rec.end() && !im->is_null())
      if (!ParseImages(*im, field, &r->images, why)) return false;
    bool answered = false;
    for (const ChatMessage& m : r->messages) answered |= m.role == "assistant";
    if (!answered) return *why = "the conversation has no assistant turn", false;
    return true;
  }
  if (!GetString(rec, f_instruction_, &r->instruction, why) ||
      !GetString(rec, f_response_, &r->response, why))
    return false;
  r->context.clear();
  if (rec.contains(f_context_) && !GetString(rec, f_context_, &r->context, why)) return false;
  return true;
}

Status InstructionDataset::ForEach(const std::function<Status(const InstructionRecord&)>& fn,
                                   DatasetReport* report) const {
  DatasetReport rep;
  rep.file = files_.size() == 1
                 ? files_[0].path()
                 : StrCat(files_[0].path(), " and ", files_.size() - 1, " more files");
  rep.layout = layout_;
  rep.unit = files_[0].position_unit();
  rep.begin = begin_;
  int64_t last = begin_;
  InstructionRecord r;
  int64_t offset = 0;  // rows of the files before this one
  Status s = Status::Ok();
  for (size_t fi = 0; fi < files_.size() && offset < end_ && s.ok(); ++fi) {
    const RowFile& f = files_[fi];
    int64_t rows_here = -1;
    s = f.ForEach(std::max<int64_t>(0, begin_ - offset), end_ - offset, columns_,
                  [&](const Row& row) -> Status {
                    last = offset + row.index + 1;
                    rows_here = row.index + 1;
                    std::string why;
                    if (!ToRecord(row, &r, &why)) {
                      ++rep.skipped;
                      if (rep.skipped_lines.size() < DatasetReport::kMaxListed)
                        rep.skipped_lines.emplace_back(
                            row.position,
                            files_.size() > 1
                                ? StrCat(fs::path(f.path()).filename().string(), ": ", why)
                                : why);
                      return Status::Ok();
                    }
                    ++rep.used;
                    // Image paths relative to the data set: to the data file's folder.
                    for (ImageRef& im : r.images)
                      if (im.bytes.empty() && fs::path(im.path).is_relative())
                        im.path = (fs::path(f.path()).parent_path() / im.path).string();
                    return fn(r);
                  });
    if (!s.ok()) break;
    if (rows_here < 0) {  // no row of this file was in the slice: skip past all of it
      StatusOr<int64_t> n = f.CountRows();
      if (!n.ok()) return n.status();
      rows_here = *n;
    }
    // Otherwise the scan either reached the file's end (rows_here is its row count) or the
    // slice's end (and the loop stops).
    offset += rows_here;
  }
  rep.end = std::min(end_, last);
  if (report) *report = rep;
  if (!s.ok()) return s;
  if (rep.used == 0)
    return InvalidArgument(
        StrCat(rep.Summary(), ": no usable record in split '", split_.ToString(), "'"));
  return Status::Ok();
}

Status PromptTemplate::Validate() const {
  for (const std::string* t : {&plain, &with_context}) {
    for (size_t i = 0; i < t->size(); ++i) {
      char c = (*t)[i];
      if ((c == '{' || c == '}') && i + 1 < t->size() && (*t)[i + 1] == c) {
        ++i;
        continue;
      }
      if (c == '}') return InvalidArgument(StrCat("prompt template '", *t, "': stray '}'"));
      if (c != '{') continue;
      size_t close = t->find('}', i);
      if (close == std::string::npos)
        return InvalidArgument(StrCat("prompt template '", *t, "': unclosed '{'"));
      std::string name = t->substr(i + 1, close - i - 1);
      if (name != "instruction" && name != "context" && name != "response")
        return InvalidArgument(StrCat("prompt template '", *t, "': unknown placeholder {", name,
                                      "} (use {instruction}, {context}, {response})"));
      i = close;
    }
  }
  return Status::Ok();
}

std::string PromptTemplate::Format(const InstructionRecord& r, std::vector<CharSpan>* responses,
                                   size_t base) const {
  if (!r.messages.empty()) {
    // One exchange per assistant turn: the user turns before it are the instruction, a system
    // turn the context.
    std::string out;
    InstructionRecord x;
    for (const ChatMessage& m : r.messages) {
      if (m.role == "system") {
        x.context = m.content;
      } else if (m.role == "assistant") {
        x.response = m.content;
        if (!out.empty()) out += "\n";
        out += Format(x, responses, base + out.size());
        x = InstructionRecord{};
      } else {
        x.instruction += (x.instruction.empty() ? "" : "\n") + m.content;
      }
    }
    return out;
  }
  const std::string& t = r.context.empty() ? plain : with_context;
  std::string out;
  out.reserve(t.size() + r.instruction.size() + r.context.size() + r.response.size());
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if ((c == '{' || c == '}') && i + 1 < t.size() && t[i + 1] == c) {
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '{') {
      size_t close = t.find('}', i);
      if (close != std::string::npos) {
        std::string_view name(t.data() + i + 1, close - i - 1);
        if (name == "instruction")
          out += r.instruction;
        else if (name == "context")
          out += r.context;
        else if (name == "response") {
          if (responses)
            responses->push_back({base + out.size(), base + out.size() + r.response.size()});
          out += r.response;
        }
        i = close;
        continue;
      }
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace st
