// JSON data files, read streaming (one record in memory at a time): JSON Lines (one record per
// line), a JSON array of records, or the array under one key of a top-level object (the
// `datasets` json loader's `field=`, e.g. {"version": 2, "data": [...]}).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace st {

// The longest record (a JSONL line, or an element of a JSON array) a reader accepts; a longer
// one is an error rather than an unbounded allocation (a file with no newlines, say).
constexpr size_t kMaxRecordBytes = size_t{16} << 20;

// One raw record of a file: its 0-based index, the 1-based line it starts on, and its text.
// Returning an error stops the scan with that error.
using RawRecordFn = std::function<Status(int64_t index, int64_t line, std::string_view text)>;

// Every non-blank line of a JSON Lines file (a UTF-8 byte order mark and \r\n are accepted).
Status ScanJsonLines(const std::string& path, const RawRecordFn& fn);
// Every element of a top-level JSON array.
Status ScanJsonArray(const std::string& path, const RawRecordFn& fn);
// Every element of the array at key `field` of a top-level JSON object (elements are handed over
// re-serialised; the line is that of the element's start).
Status ScanJsonField(const std::string& path, const std::string& field, const RawRecordFn& fn);

// The first non-blank character of the file ('[' for an array, '{' for an object or JSON Lines),
// or 0 for an empty file.
char FirstJsonChar(const std::string& path);

}  // namespace st
