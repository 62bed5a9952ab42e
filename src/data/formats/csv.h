// CSV and TSV data files as the `datasets` csv loader reads them (pandas.read_csv defaults): the
// first record names the columns; fields may be quoted ("a, ""b""" with embedded newlines);
// blank lines are skipped; a field that is empty or one of pandas' default NA strings ("NA",
// "null", "NaN", "None", "N/A", ...) is null. Values stay text: numbers are not converted.
// Read streaming, one record in memory at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace st {

using CsvField = std::optional<std::string>;  // nullopt: null (NA)
// index: 0-based data record; line: 1-based line the record starts on.
using CsvRecordFn =
    std::function<Status(int64_t index, int64_t line, const std::vector<CsvField>& fields)>;

// Calls header(names) once, then fn for every data record. A record with more fields than the
// header is an error naming its line (pandas refuses it too); fewer fields are filled with nulls.
Status ScanCsv(const std::string& path, char delimiter,
               const std::function<Status(const std::vector<std::string>&)>& header,
               const CsvRecordFn& fn);

// Whether pandas reads the text as NA by default.
bool IsPandasNa(const std::string& s);

}  // namespace st
