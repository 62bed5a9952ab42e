// One row interface over every data file format (DESIGN.md section 8): a file is a sequence of
// rows, each a JSON object (column -> value; nested lists and structs as arrays and objects) or a
// malformed record with the reason. The format comes from the file's extension, as the `datasets`
// library chooses its loader: .jsonl / .json (JSON Lines, a JSON array, or the array under
// --dataset-field of a top-level object), .csv / .tsv, .parquet.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/formats/json.h"

namespace st {

enum class DataFormat { kJsonLines, kJsonArray, kJsonField, kCsv, kTsv, kParquet };
const char* FormatName(DataFormat f);

// The format of a file from its extension (and, for .json, its first character); InvalidArgument
// for an extension no loader reads.
StatusOr<DataFormat> DetectFormat(const std::string& path, const std::string& json_field = "");
// Whether the extension is one of a data file (.jsonl, .json, .csv, .tsv, .parquet).
bool IsDataFileName(std::string_view name);

// One row as a reader hands it over. `value` is null for a record that could not be parsed, and
// `error` says why. `position` is the 1-based line (text formats) or row (Parquet) for messages.
// The value is the reader's scratch: a callback may move out of it.
struct Row {
  int64_t index = 0;  // 0-based within the file
  int64_t position = 0;
  nlohmann::json* value = nullptr;
  std::string_view error;
};
using RowFn = std::function<Status(const Row&)>;

class RowFile {
 public:
  static StatusOr<RowFile> Open(const std::string& path, const std::string& json_field = "");
  RowFile(RowFile&&) noexcept;
  RowFile& operator=(RowFile&&) noexcept;
  ~RowFile();

  const std::string& path() const { return path_; }
  DataFormat format() const { return format_; }
  const char* position_unit() const { return format_ == DataFormat::kParquet ? "row" : "line"; }
  // Columns known before reading rows (Parquet's schema, a CSV header); empty for JSON.
  const std::vector<std::string>& columns() const { return columns_; }
  // The number of rows: Parquet's footer, otherwise one pass over the file.
  StatusOr<int64_t> CountRows() const;
  // Rows [begin, end) in file order. `columns` restricts a Parquet read to the columns named
  // (empty: all). Returning an error from fn stops the scan with it.
  Status ForEach(int64_t begin, int64_t end, const std::vector<std::string>& columns,
                 const RowFn& fn) const;

 private:
  RowFile() = default;
  // The JSON formats' raw records (array, records under a field, or lines).
  Status ScanJson(const RawRecordFn& fn) const;
  struct Parquet;
  std::string path_, json_field_;
  DataFormat format_ = DataFormat::kJsonLines;
  std::vector<std::string> columns_;
  std::unique_ptr<Parquet> parquet_;
};

// The status a RowFn returns to end a scan early without an error; ForEach turns it into Ok.
Status StopScan();
bool IsStopScan(const Status& s);

}  // namespace st
