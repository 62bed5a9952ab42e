// A streaming CSV reader with pandas' default dialect.
#include "data/formats/csv.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "data/formats/json.h"

namespace st {

bool IsPandasNa(const std::string& s) {
  static const char* const kNa[] = {"",         "#N/A", "#N/A N/A", "#NA",    "-1.#IND",
                                    "-1.#QNAN", "-NaN", "-nan",     "1.#IND", "1.#QNAN",
                                    "<NA>",     "N/A",  "NA",       "NULL",   "NaN",
                                    "None",     "n/a",  "nan",      "null"};
  if (s.size() > 8) return false;
  for (const char* na : kNa)
    if (s == na) return true;
  return false;
}

Status ScanCsv(const std::string& path, char delim,
               const std::function<Status(const std::vector<std::string>&)>& header,
               const CsvRecordFn& fn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::vector<std::string> fields;
  std::string field;
  bool in_quotes = false, quote_pending = false, field_started = false;
  int64_t line = 1, record_line = 1, index = -1;  // -1: the header
  size_t record_bytes = 0;
  size_t ncols = 0;
  bool first_byte = true;
  auto end_field = [&]() {
    fields.push_back(std::move(field));
    field.clear();
    field_started = false;
  };
  auto end_record = [&]() -> Status {
    const bool blank = fields.empty() && field.empty() && !field_started;
    if (!blank) end_field();
    Status s = Status::Ok();
    if (!blank) {
      if (index < 0) {
        ncols = fields.size();
        s = header(fields);
      } else {
        if (fields.size() > ncols)
          return InvalidArgument(StrCat(path, ": line ", record_line, ": ", fields.size(),
                                        " fields, the header has ", ncols));
        std::vector<CsvField> out(ncols);
        for (size_t i = 0; i < fields.size(); ++i)
          if (!IsPandasNa(fields[i])) out[i] = std::move(fields[i]);
        s = fn(index, record_line, out);
      }
      ++index;
    }
    fields.clear();
    record_bytes = 0;
    record_line = line + 1;
    return s;
  };
  char buf[1 << 16];
  for (;;) {
    f.read(buf, sizeof(buf));
    const std::streamsize n = f.gcount();
    if (n <= 0) break;
    std::streamsize i = 0;
    if (first_byte && n >= 3 && std::memcmp(buf, "\xEF\xBB\xBF", 3) == 0) i = 3;
    first_byte = false;
    for (; i < n; ++i) {
      const char c = buf[i];
      if (++record_bytes > kMaxRecordBytes)
        return InvalidArgument(StrCat(path, ": line ", record_line, ": a record longer than ",
                                      kMaxRecordBytes >> 20, " MiB (unbalanced quotes?)"));
      if (in_quotes) {
        if (quote_pending) {
          quote_pending = false;
          if (c == '"') {  // "" inside quotes
            field.push_back('"');
            continue;
          }
          in_quotes = false;  // the closing quote; c is handled below
        } else {
          if (c == '"') {
            quote_pending = true;
          } else {
            if (c == '\n') ++line;
            field.push_back(c);
          }
          continue;
        }
      }
      if (c == '"' && !field_started) {
        in_quotes = field_started = true;
      } else if (c == delim) {
        end_field();
      } else if (c == '\n') {
        if (!field.empty() && field.back() == '\r') {
          field.pop_back();
          if (field.empty() && fields.empty()) field_started = false;  // a blank \r\n line
        }
        ST_RETURN_IF_ERROR(end_record());
        ++line;
      } else {
        field.push_back(c);
        field_started = true;
      }
    }
  }
  if (f.bad()) return IoError(StrCat(path, ": read failed"));
  if (in_quotes && !quote_pending)
    return InvalidArgument(StrCat(path, ": line ", record_line, ": unclosed quote"));
  if (!field.empty() && field.back() == '\r') field.pop_back();
  ST_RETURN_IF_ERROR(end_record());
  if (index < 0) return InvalidArgument(StrCat(path, ": empty CSV file (no header)"));
  return Status::Ok();
}

}  // namespace st
