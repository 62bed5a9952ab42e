// Streaming readers for JSONL and JSON-array instruction files, the split syntax and the prompt
// template.
#include "data/dataset.h"

#include <cerrno>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace st {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Ends a scan early (not an error).
Status Stop() {
  return Internal("(scan stopped)");
}
bool IsStop(const Status& s) {
  return s.code() == StatusCode::kInternal && s.message() == "(scan stopped)";
}

// One raw record of a file: its text and the line it starts on.
using RawFn = std::function<Status(int64_t index, int64_t line, std::string_view text)>;

std::string TooLong(const std::string& path, int64_t line, const char* what) {
  return StrCat(path, ": line ", line, ": ", what, " longer than ", kMaxDatasetRecordBytes >> 20,
                " MiB; is this a JSONL/JSON data set?");
}

// Calls fn for every non-blank line. Stops early when fn returns an error. Reads in blocks so that
// a line longer than kMaxDatasetRecordBytes is refused before it is held whole.
Status ScanJsonl(const std::string& path, const RawFn& fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::string line;
  int64_t lineno = 0, index = 0;
  char buf[1 << 16];
  auto emit = [&]() -> Status {
    ++lineno;
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();
    Status s = Status::Ok();
    if (line.find_first_not_of(" \t") != std::string::npos) s = fn(index++, lineno, line);
    line.clear();
    return s;
  };
  for (;;) {
    f.read(buf, sizeof(buf));
    const std::streamsize n = f.gcount();
    if (n <= 0) break;
    std::string_view chunk(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = chunk.find('\n')) != std::string_view::npos;) {
      if (line.size() + nl > kMaxDatasetRecordBytes)
        return InvalidArgument(TooLong(path, lineno + 1, "the line is"));
      line.append(chunk.substr(0, nl));
      chunk.remove_prefix(nl + 1);
      ST_RETURN_IF_ERROR(emit());
    }
    if (line.size() + chunk.size() > kMaxDatasetRecordBytes)
      return InvalidArgument(TooLong(path, lineno + 1, "the line is"));
    line.append(chunk);
  }
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  if (!line.empty()) ST_RETURN_IF_ERROR(emit());
  return Status::Ok();
}

// Calls fn for every element of a top-level JSON array, found by a small scanner that tracks
// strings and nesting, so the file is never held whole in memory.
Status ScanJsonArray(const std::string& path, const RawFn& fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::string elem;
  int64_t line = 1, elem_line = 0, index = 0;
  int depth = 0;
  bool in_string = false, escape = false, started = false, done = false;
  char buf[1 << 16];
  char bom[3] = {0, 0, 0};
  if (!(f.read(bom, 3) && std::string_view(bom, 3) == "\xEF\xBB\xBF")) {
    f.clear();
    f.seekg(0);
  }
  while (!done) {
    f.read(buf, sizeof(buf));
    const std::streamsize n = f.gcount();
    if (n <= 0) break;
    for (std::streamsize i = 0; i < n && !done; ++i) {
      const char c = buf[i];
      if (c == '\n') ++line;
      if (!started) {
        if (c == '[') {
          started = true;
          depth = 1;
        } else if (!std::isspace(static_cast<unsigned char>(c))) {
          return InvalidArgument(
              StrCat(path, ": line ", line, ": a .json data set must be an array of records"));
        }
        continue;
      }
      if (in_string) {
        if (elem.size() >= kMaxDatasetRecordBytes)
          return InvalidArgument(TooLong(path, elem_line, "the record starting here is"));
        elem.push_back(c);
        if (escape)
          escape = false;
        else if (c == '\\')
          escape = true;
        else if (c == '"')
          in_string = false;
        continue;
      }
      if (depth == 1 && (c == ',' || c == ']')) {
        if (elem.find_first_not_of(" \t\r\n") != std::string::npos) {
          ST_RETURN_IF_ERROR(fn(index++, elem_line, elem));
        }
        elem.clear();
        if (c == ']') done = true;
        continue;
      }
      if (elem.empty() && std::isspace(static_cast<unsigned char>(c))) continue;
      if (elem.empty()) elem_line = line;
      if (elem.size() >= kMaxDatasetRecordBytes)
        return InvalidArgument(TooLong(path, elem_line, "the record starting here is"));
      elem.push_back(c);
      if (c == '"') in_string = true;
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') --depth;
    }
  }
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  if (!started) return InvalidArgument(StrCat(path, ": empty file (expected a JSON array)"));
  if (!done)
    return InvalidArgument(StrCat(path, ": line ", line, ": the JSON array is not closed"));
  return Status::Ok();
}

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
      s += StrCat(i ? "; " : "", "line ", skipped_lines[i].first, ": ", skipped_lines[i].second);
    if (skipped > static_cast<int64_t>(skipped_lines.size())) s += "; ...";
    s += ")";
  }
  return s;
}

namespace {

// Whether s is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// Reads one field: absent -> nullopt with no error; a string -> value; else error text.
bool GetString(const json& rec, const std::string& field, std::string* out, std::string* why) {
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
  *out = it->get<std::string>();
  return true;
}

}  // namespace

StatusOr<InstructionDataset> InstructionDataset::Open(const DatasetOptions& options) {
  InstructionDataset ds;
  ST_ASSIGN_OR_RETURN(ds.split_, ParseSplit(options.split));
  std::error_code ec;
  if (fs::is_directory(options.path, ec)) {
    for (const char* ext : {".jsonl", ".json"}) {
      fs::path p = fs::path(options.path) / (ds.split_.name + ext);
      if (fs::exists(p, ec)) {
        ds.file_ = p.string();
        break;
      }
    }
    if (ds.file_.empty())
      return NotFound(StrCat(options.path, ": no ", ds.split_.name, ".jsonl or ", ds.split_.name,
                             ".json for split '", ds.split_.name, "'"));
  } else if (fs::exists(options.path, ec)) {
    if (ds.split_.name != "train")
      return InvalidArgument(
          StrCat(options.path, ": a single data file has only the 'train' split (got '",
                 ds.split_.name, "'); pass a directory with ", ds.split_.name, ".jsonl instead"));
    ds.file_ = options.path;
  } else {
    return NotFound(StrCat(options.path, ": no such data set file or directory"));
  }
  // JSON array or JSONL: by extension, else by the first non-blank character.
  const std::string ext = fs::path(ds.file_).extension().string();
  if (ext == ".json") {
    ds.json_array_ = true;
  } else if (ext != ".jsonl") {
    std::ifstream f(ds.file_);
    char c = 0;
    while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
    }
    ds.json_array_ = c == '[';
  }
  const bool custom = !options.instruction_field.empty() || !options.context_field.empty() ||
                      !options.response_field.empty();
  if (custom) {
    ds.layout_ = DatasetLayout::kCustom;
    ds.f_instruction_ =
        options.instruction_field.empty() ? "instruction" : options.instruction_field;
    ds.f_context_ = options.context_field.empty() ? "context" : options.context_field;
    ds.f_response_ = options.response_field.empty() ? "response" : options.response_field;
  }
  // Count records when the split needs it, and detect the layout from the first usable record.
  const bool need_count = ds.split_.needs_count();
  int64_t count = 0;
  auto scan = ds.json_array_ ? ScanJsonArray : ScanJsonl;
  std::string first_bad;  // why the first unusable record is unusable, for the error below
  Status s = scan(ds.file_, [&](int64_t, int64_t line, std::string_view text) -> Status {
    ++count;
    if (ds.layout_ == DatasetLayout::kDetect) {
      json rec = json::parse(text, nullptr, false);
      if (first_bad.empty() && (rec.is_discarded() || !rec.is_object()))
        first_bad = StrCat("; line ", line, " is ",
                           rec.is_discarded() ? "not valid JSON" : "not a JSON object",
                           ValidUtf8(text) ? "" : " (invalid UTF-8)");
      if (!rec.is_discarded() && rec.is_object()) {
        if (rec.contains("instruction") && rec.contains("response"))
          ds.layout_ = DatasetLayout::kDolly;
        else if (rec.contains("instruction") && rec.contains("output"))
          ds.layout_ = DatasetLayout::kAlpaca;
      }
    }
    if (!need_count && ds.layout_ != DatasetLayout::kDetect) return Stop();
    return Status::Ok();
  });
  if (!s.ok() && !IsStop(s)) return s;
  if (ds.layout_ == DatasetLayout::kDetect)
    return InvalidArgument(
        StrCat(ds.file_,
               ": no record has Dolly's fields (instruction, response) or Alpaca's "
               "(instruction, output); name the fields with --instruction-field, "
               "--context-field, --response-field",
               first_bad));
  if (ds.layout_ == DatasetLayout::kDolly) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "context", ds.f_response_ = "response";
  } else if (ds.layout_ == DatasetLayout::kAlpaca) {
    ds.f_instruction_ = "instruction", ds.f_context_ = "input", ds.f_response_ = "output";
  }
  if (need_count) {
    std::tie(ds.begin_, ds.end_) = ds.split_.Resolve(count);
  } else {
    ds.begin_ = ds.split_.begin.set ? ds.split_.begin.value : 0;
    ds.end_ = ds.split_.end.set ? ds.split_.end.value : INT64_MAX;
    ds.end_ = std::max(ds.begin_, ds.end_);
  }
  return ds;
}

Status InstructionDataset::ForEach(const std::function<Status(const InstructionRecord&)>& fn,
                                   DatasetReport* report) const {
  DatasetReport rep;
  rep.file = file_;
  rep.layout = layout_;
  rep.begin = begin_;
  int64_t last = begin_;
  InstructionRecord r;
  auto skip = [&](int64_t line, std::string why) {
    ++rep.skipped;
    if (rep.skipped_lines.size() < DatasetReport::kMaxListed)
      rep.skipped_lines.emplace_back(line, std::move(why));
  };
  auto scan = json_array_ ? ScanJsonArray : ScanJsonl;
  Status s = scan(file_, [&](int64_t index, int64_t line, std::string_view text) -> Status {
    if (index < begin_) return Status::Ok();
    if (index >= end_) return Stop();
    last = index + 1;
    json rec = json::parse(text, nullptr, false);
    if (rec.is_discarded()) {
      skip(line, "not valid JSON");
      return Status::Ok();
    }
    if (!rec.is_object()) {
      skip(line, "not a JSON object");
      return Status::Ok();
    }
    std::string why;
    r.line = line;
    if (!GetString(rec, f_instruction_, &r.instruction, &why) ||
        !GetString(rec, f_response_, &r.response, &why)) {
      skip(line, why);
      return Status::Ok();
    }
    r.context.clear();
    if (rec.contains(f_context_) && !GetString(rec, f_context_, &r.context, &why)) {
      skip(line, why);
      return Status::Ok();
    }
    ++rep.used;
    return fn(r);
  });
  rep.end = std::min(end_, last);
  if (report) *report = rep;
  if (!s.ok() && !IsStop(s)) return s;
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

std::string PromptTemplate::Format(const InstructionRecord& r) const {
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
        else if (name == "response")
          out += r.response;
        i = close;
        continue;
      }
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace st
