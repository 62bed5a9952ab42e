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
  auto detect = [&](const std::function<bool(const char*)>& has) {
    if (has("instruction") && has("response"))
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
  if (ds.layout_ == DatasetLayout::kDolly) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "context", ds.f_response_ = "response";
  } else if (ds.layout_ == DatasetLayout::kAlpaca) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "input", ds.f_response_ = "output";
  }
  if (ds.layout_ == DatasetLayout::kConversation) {
    ds.columns_ = {ds.f_messages_};
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

bool InstructionDataset::ToRecord(const Row& row, InstructionRecord* r, std::string* why) const {
  if (!row.value) return *why = std::string(row.error), false;
  json& rec = *row.value;  // the reader's scratch: strings are moved out, not copied
  r->line = row.position;
  r->messages.clear();
  if (layout_ == DatasetLayout::kConversation) {
    r->instruction.clear(), r->context.clear(), r->response.clear();
    auto it = rec.find(f_messages_);
    if (it == rec.end()) return *why = StrCat("no field '", f_messages_, "'"), false;
    if (!it->is_array())
      return *why = StrCat("field '", f_messages_, "' is not a list of turns"), false;
    bool answered = false;
    for (const json& turn : *it) {
      if (!turn.is_object())
        return *why = StrCat("a turn of '", f_messages_, "' is not an object"), false;
      const json* role = turn.contains("role")   ? &turn["role"]
                         : turn.contains("from") ? &turn["from"]
                                                 : nullptr;
      const json* content = turn.contains("content") ? &turn["content"]
                            : turn.contains("value") ? &turn["value"]
                                                     : nullptr;
      if (!role || !role->is_string() || !content)
        return *why = StrCat("a turn of '", f_messages_, "' has no role/content (or from/value)"),
               false;
      ChatMessage m;
      m.role = Normalise(role->get<std::string>());
      if (!ContentText(*content, &m.content))
        return *why = StrCat("a turn of '", f_messages_, "' has content that is not text"), false;
      answered |= m.role == "assistant";
      r->messages.push_back(std::move(m));
    }
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
