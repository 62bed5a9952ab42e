// JSON data files: line and array scanners that never hold more than one record, and a SAX reader
// for the array under a field of a top-level object.
#include "data/formats/json.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace st {
namespace {

std::string TooLong(const std::string& path, int64_t line, const char* what) {
  return StrCat(path, ": line ", line, ": ", what, " longer than ", kMaxRecordBytes >> 20,
                " MiB; is this a JSONL/JSON data set?");
}

}  // namespace

// Calls fn for every non-blank line. Stops early when fn returns an error. Reads in blocks so that
// a line longer than kMaxRecordBytes is refused before it is held whole.
Status ScanJsonLines(const std::string& path, const RawRecordFn& fn) {
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
      if (line.size() + nl > kMaxRecordBytes)
        return InvalidArgument(TooLong(path, lineno + 1, "the line is"));
      line.append(chunk.substr(0, nl));
      chunk.remove_prefix(nl + 1);
      ST_RETURN_IF_ERROR(emit());
    }
    if (line.size() + chunk.size() > kMaxRecordBytes)
      return InvalidArgument(TooLong(path, lineno + 1, "the line is"));
    line.append(chunk);
  }
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  if (!line.empty()) ST_RETURN_IF_ERROR(emit());
  return Status::Ok();
}

// Calls fn for every element of a top-level JSON array, found by a small scanner that tracks
// strings and nesting, so the file is never held whole in memory.
Status ScanJsonArray(const std::string& path, const RawRecordFn& fn) {
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
        if (elem.size() >= kMaxRecordBytes)
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
      if (elem.size() >= kMaxRecordBytes)
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

namespace {

// Builds the elements of the array at key `field` of the top-level object, one at a time.
class FieldArraySax {
 public:
  using json = nlohmann::json;
  FieldArraySax(std::string field, const RawRecordFn& fn) : field_(std::move(field)), fn_(fn) {}

  bool null() { return Value(nullptr); }
  bool boolean(bool v) { return Value(v); }
  bool number_integer(json::number_integer_t v) { return Value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Value(v); }
  bool number_float(json::number_float_t v, const std::string&) { return Value(v); }
  bool string(std::string& v) { return Value(std::move(v)); }
  bool binary(json::binary_t&) { return Value(nullptr); }
  bool start_object(std::size_t) { return Open(json::object()); }
  bool start_array(std::size_t) {
    if (depth_ == 1 && key_ == field_ && !found_) {  // the records' array
      found_ = in_array_ = true;
      ++depth_;
      return true;
    }
    return Open(json::array());
  }
  bool end_object() { return Close(); }
  bool end_array() {
    if (in_array_ && depth_ == 2 && stack_.empty()) {
      in_array_ = false;
      --depth_;
      return true;
    }
    return Close();
  }
  bool key(std::string& k) {
    if (depth_ == 1) key_ = k;
    if (!stack_.empty()) pending_key_ = k;
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) {
    status_ = InvalidArgument(StrCat("byte ", pos, ": ", e.what()));
    return false;
  }

  const Status& status() const { return status_; }
  bool found() const { return found_; }
  bool top_is_object() const { return top_object_; }

 private:
  bool Collecting() const { return in_array_ && depth_ >= 2; }
  bool Value(json v) {
    if (!Collecting()) return true;
    if (stack_.empty()) return Emit(std::move(v));
    Add(std::move(v));
    return true;
  }
  void Add(json v) {
    json& top = *stack_.back();
    if (top.is_array())
      top.push_back(std::move(v));
    else
      top[pending_key_] = std::move(v);
  }
  bool Open(json v) {
    if (depth_ == 0) top_object_ = v.is_object();
    ++depth_;
    if (!Collecting() || (depth_ == 2 && !in_array_)) return true;
    if (stack_.empty()) {
      element_ = std::move(v);
      stack_.push_back(&element_);
    } else {
      json& top = *stack_.back();
      json* slot;
      if (top.is_array()) {
        top.push_back(std::move(v));
        slot = &top.back();
      } else {
        slot = &(top[pending_key_] = std::move(v));
      }
      stack_.push_back(slot);
    }
    return true;
  }
  bool Close() {
    --depth_;
    if (stack_.empty()) return true;
    stack_.pop_back();
    if (stack_.empty()) return Emit(std::move(element_));
    return true;
  }
  bool Emit(json v) {
    const std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (text.size() > kMaxRecordBytes) {
      status_ = InvalidArgument(
          StrCat("record ", index_, " is longer than ", kMaxRecordBytes >> 20, " MiB"));
      return false;
    }
    status_ = fn_(index_, index_ + 1, text);
    ++index_;
    return status_.ok();
  }

  std::string field_, key_, pending_key_;
  const RawRecordFn& fn_;
  int depth_ = 0;
  bool found_ = false, in_array_ = false, top_object_ = false;
  json element_;
  std::vector<json*> stack_;
  int64_t index_ = 0;
  Status status_ = Status::Ok();
};

}  // namespace

Status ScanJsonField(const std::string& path, const std::string& field, const RawRecordFn& fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  FieldArraySax sax(field, fn);
  const bool ok = nlohmann::json::sax_parse(f, &sax, nlohmann::json::input_format_t::json, false);
  if (!ok || !sax.status().ok()) {
    if (sax.status().ok()) return InvalidArgument(StrCat(path, ": not valid JSON"));
    if (sax.status().code() == StatusCode::kInvalidArgument) return sax.status().WithContext(path);
    return sax.status();
  }
  if (!sax.top_is_object())
    return InvalidArgument(StrCat(path, ": --dataset-field ", field,
                                  " needs a top-level JSON object, the file holds something else"));
  if (!sax.found())
    return InvalidArgument(
        StrCat(path, ": the top-level object has no array under the key '", field, "'"));
  return Status::Ok();
}

char FirstJsonChar(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  int i = 0;
  while (f.get(c)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (i++ < 3 && (u == 0xEF || u == 0xBB || u == 0xBF)) continue;  // byte order mark
    if (!std::isspace(u)) return c;
  }
  return 0;
}

}  // namespace st
