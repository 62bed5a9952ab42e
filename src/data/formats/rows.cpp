// Format detection and the row interface over the JSON, CSV and Parquet readers.
#include "data/formats/rows.h"

#include <filesystem>
#include <fstream>

#include "data/formats/csv.h"
#include "data/formats/json.h"
#include "data/formats/parquet.h"
#include "data/utf8.h"

namespace st {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct RowFile::Parquet {
  ParquetFile file;
};

RowFile::RowFile(RowFile&&) noexcept = default;
RowFile& RowFile::operator=(RowFile&&) noexcept = default;
RowFile::~RowFile() = default;

Status StopScan() {
  return Internal("(scan stopped)");
}
bool IsStopScan(const Status& s) {
  return s.code() == StatusCode::kInternal && s.message() == "(scan stopped)";
}

const char* FormatName(DataFormat f) {
  switch (f) {
    case DataFormat::kJsonLines:
      return "JSON Lines";
    case DataFormat::kJsonArray:
      return "JSON array";
    case DataFormat::kJsonField:
      return "JSON object field";
    case DataFormat::kCsv:
      return "CSV";
    case DataFormat::kTsv:
      return "TSV";
    case DataFormat::kParquet:
      return "Parquet";
  }
  return "?";
}

namespace {
std::string LowerExt(std::string_view name) {
  const size_t slash = name.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? name : name.substr(slash + 1);
  const size_t dot = base.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return "";
  std::string e(base.substr(dot));
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e;
}
}  // namespace

bool IsDataFileName(std::string_view name) {
  const std::string e = LowerExt(name);
  return e == ".jsonl" || e == ".json" || e == ".csv" || e == ".tsv" || e == ".parquet";
}

StatusOr<DataFormat> DetectFormat(const std::string& path, const std::string& json_field) {
  const std::string e = LowerExt(path);
  if (e == ".parquet") return DataFormat::kParquet;
  if (e == ".csv") return DataFormat::kCsv;
  if (e == ".tsv") return DataFormat::kTsv;
  if (e == ".jsonl" || e == ".json" || e.empty()) {
    if (!json_field.empty()) return DataFormat::kJsonField;
    // .json may hold either (the `datasets` loader reads both); decided by the first character.
    if (e == ".jsonl") return DataFormat::kJsonLines;
    const char c = FirstJsonChar(path);
    if (c == '[') return DataFormat::kJsonArray;
    if (e == ".json" && c == '{') {
      // Objects one per line are JSON Lines (as the datasets json loader reads them); one object
      // spread over lines holds the records under a key.
      std::ifstream f(path, std::ios::binary);
      std::string first;
      std::getline(f, first);
      if (first.size() < kMaxRecordBytes && !json::accept(first))
        return InvalidArgument(
            StrCat(path,
                   ": one JSON object over several lines; if the records are a list under a "
                   "key, pass --dataset-field KEY (datasets' field=); otherwise write one "
                   "record per line (JSON Lines) or an array of records"));
    }
    return DataFormat::kJsonLines;
  }
  return InvalidArgument(StrCat(path, ": unknown data file type '", e,
                                "' (readable: .jsonl, .json, .csv, .tsv, .parquet)"));
}

StatusOr<RowFile> RowFile::Open(const std::string& path, const std::string& json_field) {
  RowFile f;
  f.path_ = path;
  f.json_field_ = json_field;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFound(StrCat(path, ": no such data file"));
  ST_ASSIGN_OR_RETURN(f.format_, DetectFormat(path, json_field));
  if (f.format_ == DataFormat::kParquet) {
    ST_ASSIGN_OR_RETURN(ParquetFile pf, ParquetFile::Open(path));
    f.columns_ = pf.columns();
    f.parquet_ = std::make_unique<Parquet>(Parquet{std::move(pf)});
  } else if (f.format_ == DataFormat::kCsv || f.format_ == DataFormat::kTsv) {
    Status s = ScanCsv(
        path, f.format_ == DataFormat::kCsv ? ',' : '\t',
        [&](const std::vector<std::string>& names) {
          f.columns_ = names;
          return StopScan();
        },
        [](int64_t, int64_t, const std::vector<CsvField>&) { return Status::Ok(); });
    if (!s.ok() && !IsStopScan(s)) return s;
  }
  return f;
}

Status RowFile::ScanJson(const RawRecordFn& fn) const {
  if (format_ == DataFormat::kJsonArray) return ScanJsonArray(path_, fn);
  if (format_ == DataFormat::kJsonField) return ScanJsonField(path_, json_field_, fn);
  return ScanJsonLines(path_, fn);
}

StatusOr<int64_t> RowFile::CountRows() const {
  if (parquet_) return parquet_->file.num_rows();
  // The scanners' record boundaries only: no record is parsed into JSON or a row built.
  int64_t n = 0;
  Status s = Status::Ok();
  if (format_ == DataFormat::kCsv || format_ == DataFormat::kTsv) {
    s = ScanCsv(
        path_, format_ == DataFormat::kCsv ? ',' : '\t',
        [](const std::vector<std::string>&) { return Status::Ok(); },
        [&](int64_t, int64_t, const std::vector<CsvField>&) {
          ++n;
          return Status::Ok();
        });
  } else {
    auto count = [&](int64_t, int64_t, std::string_view) {
      ++n;
      return Status::Ok();
    };
    s = ScanJson(count);
  }
  if (!s.ok()) return s;
  return n;
}

Status RowFile::ForEach(int64_t begin, int64_t end, const std::vector<std::string>& columns,
                        const RowFn& fn) const {
  if (begin >= end) return Status::Ok();
  Status s = Status::Ok();
  if (parquet_) {
    const ParquetFile& pf = parquet_->file;
    std::vector<json> rows;
    int64_t first = 0;
    for (int g = 0; g < pf.num_row_groups() && first < end && s.ok(); ++g) {
      const int64_t n = pf.row_group_rows(g);
      if (first + n > begin) {  // row groups before the slice are never decoded
        s = pf.ReadRowGroup(g, columns, &rows);
        for (int64_t i = std::max<int64_t>(0, begin - first); s.ok() && i < n && first + i < end;
             ++i) {
          Row r;
          r.index = first + i;
          r.position = first + i + 1;
          r.value = &rows[static_cast<size_t>(i)];
          s = fn(r);
        }
      }
      first += n;
    }
  } else if (format_ == DataFormat::kCsv || format_ == DataFormat::kTsv) {
    std::vector<std::string> names;
    json row;
    s = ScanCsv(
        path_, format_ == DataFormat::kCsv ? ',' : '\t',
        [&](const std::vector<std::string>& h) {
          names = h;
          return Status::Ok();
        },
        [&](int64_t index, int64_t line, const std::vector<CsvField>& fields) -> Status {
          if (index < begin) return Status::Ok();
          if (index >= end) return StopScan();
          row = json::object();
          for (size_t i = 0; i < names.size(); ++i)
            row[names[i]] = fields[i] ? json(*fields[i]) : json();
          Row r;
          r.index = index;
          r.position = line;
          r.value = &row;
          return fn(r);
        });
  } else {
    json rec;
    auto each = [&](int64_t index, int64_t line, std::string_view text) -> Status {
      if (index < begin) return Status::Ok();
      if (index >= end) return StopScan();
      Row r;
      r.index = index;
      r.position = line;
      rec = json::parse(text, nullptr, false);
      if (rec.is_discarded())
        r.error = IsValidUtf8(text) ? "not valid JSON" : "not valid JSON (invalid UTF-8)";
      else if (!rec.is_object())
        r.error = "not a JSON object";
      else
        r.value = &rec;
      return fn(r);
    };
    s = ScanJson(each);
  }
  if (!s.ok() && !IsStopScan(s)) return s;
  return Status::Ok();
}

}  // namespace st
