// Fuzzes the Parquet reader: the input becomes a .parquet file, opened (footer, schema tree) and
// every row group decoded with all columns, then with the first column only. Errors are expected;
// crashes, hangs, sanitizer findings and unbounded allocations are not.
#include <cstdint>
#include <string>
#include <vector>

#include "data/formats/parquet.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = st::fuzz::ScratchPath(".parquet");
  st::fuzz::WriteScratch(path, data, size);
  st::StatusOr<st::ParquetFile> f = st::ParquetFile::Open(path);
  if (!f.ok()) return 0;
  std::vector<nlohmann::json> rows;
  for (int g = 0; g < f->num_row_groups(); ++g) {
    if (!f->ReadRowGroup(g, {}, &rows).ok()) break;
    if (!f->columns().empty()) (void)f->ReadRowGroup(g, {f->columns()[0]}, &rows);
  }
  return 0;
}
