// A focused Apache Parquet reader: the subset that data set files on the Hugging Face hub use.
// Footer and page headers are Thrift compact protocol (libthrift); pages may be Snappy, Gzip or
// Zstd compressed, data pages v1 or v2, values PLAIN or dictionary encoded (PLAIN_DICTIONARY /
// RLE_DICTIONARY, with the fallback to plain pages partway through a chunk), levels RLE/bit-packed
// hybrid, booleans PLAIN or RLE. Nested columns (structs, LIST and MAP groups in the standard
// three-level and the legacy two-level layouts, lists of lists) are assembled into JSON values
// as pyarrow's to_pylist() shows them: a struct is an object, a list an array, a null a null.
//
// Reading is row group by row group and only the requested top-level columns are touched: one
// row group's column chunks (compressed) plus its decoded values are the most held in memory.
// Every length, offset and count read from the file is checked against the file and the chunk:
// a corrupt or truncated file is a DataLoss naming the file, row group and column, never a crash.
// Not supported (refused with the name of the feature): DELTA_* and BYTE_STREAM_SPLIT encodings,
// LZO/Brotli/LZ4 codecs, encrypted files, column chunks in other files.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace st {

struct ParquetSchemaNode;

class ParquetFile {
 public:
  // Reads and checks the footer.
  static StatusOr<ParquetFile> Open(const std::string& path);
  ParquetFile(ParquetFile&&) noexcept;
  ParquetFile& operator=(ParquetFile&&) noexcept;
  ~ParquetFile();

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  int num_row_groups() const { return static_cast<int>(row_group_rows_.size()); }
  int64_t row_group_rows(int rg) const { return row_group_rows_[rg]; }
  // Top-level column names in schema order.
  const std::vector<std::string>& columns() const { return columns_; }

  // Decodes row group rg into rows (JSON objects with the requested top-level columns; empty =
  // all). Unknown column names are an InvalidArgument. Not thread-safe (the page buffers are
  // kept from one call to the next).
  Status ReadRowGroup(int rg, const std::vector<std::string>& columns,
                      std::vector<nlohmann::json>* rows) const;

 private:
  ParquetFile() = default;
  struct Meta;
  std::string path_;
  int fd_ = -1;
  int64_t file_size_ = 0;
  int64_t num_rows_ = 0;
  std::vector<int64_t> row_group_rows_;
  std::vector<std::string> columns_;
  std::unique_ptr<Meta> meta_;
  mutable std::vector<uint8_t> chunk_, page_;  // scratch, reused across row groups
};

// Decompresses a Parquet page (codec numbers as in the format: 0 none, 1 Snappy, 2 Gzip,
// 6 Zstd) into exactly `size` bytes. Exposed for tests.
Status ParquetDecompress(int codec, const uint8_t* src, size_t n, size_t size,
                         std::vector<uint8_t>* out);

}  // namespace st
