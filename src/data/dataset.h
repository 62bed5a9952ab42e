// Instruction data sets from local files: JSONL (one record per line) or a JSON array, in Dolly's
// layout (instruction, context, response) or Alpaca's (instruction, input, output), detected from
// the fields of the first usable record or named explicitly. Hugging Face split syntax selects the
// records (`train`, `train[:1024]`, `train[100:200]`, `train[:10%]`, `train[-10%:]`). Files are
// read streaming (one record in memory at a time). Malformed records are skipped, counted and
// reported by line number; a split with no usable record is an error. Not a hub client (see
// io/hub.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace st {

// `name[begin:end]` with absolute or percent bounds, negative counting from the end (Python
// slices).
// The longest record (a JSONL line, or an element of a JSON array) a reader accepts; a longer
// one is an error rather than an unbounded allocation (a file with no newlines, say).
constexpr size_t kMaxDatasetRecordBytes = size_t{16} << 20;

struct SplitSpec {
  struct Bound {
    bool set = false;
    int64_t value = 0;  // records, or percent when `percent`
    bool percent = false;
  };
  std::string name = "train";
  Bound begin, end;

  bool needs_count() const;  // true when resolving needs the number of records
  // [begin, end) over n records; percents are rounded to the closest record (halves to even), as
  // the `datasets` library does.
  std::pair<int64_t, int64_t> Resolve(int64_t n) const;
  std::string ToString() const;
};

StatusOr<SplitSpec> ParseSplit(std::string_view text);

// One instruction record. `line` is the 1-based line of the file where it starts.
struct InstructionRecord {
  int64_t line = 0;
  std::string instruction, context, response;
};

enum class DatasetLayout { kDetect, kDolly, kAlpaca, kCustom };

struct DatasetOptions {
  std::string path;  // a .jsonl / .json file, or a directory with <split>.jsonl or <split>.json
  std::string split = "train";
  // Field names. Empty = from the layout: Dolly (instruction, context, response) or Alpaca
  // (instruction, input, output), detected from the first usable record. Setting any field name
  // makes the layout custom (the others default to Dolly's names).
  std::string instruction_field, context_field, response_field;
};

// What reading a split found. Skipped records are listed (up to kMaxListed) with their reasons.
struct DatasetReport {
  static constexpr int kMaxListed = 20;
  std::string file;
  DatasetLayout layout = DatasetLayout::kDetect;
  int64_t begin = 0, end = 0;  // the resolved slice over record positions
  int64_t used = 0, skipped = 0;
  std::vector<std::pair<int64_t, std::string>> skipped_lines;  // (line, reason)
  // "dataset data/x.jsonl split train[:10]: 10 records used, 1 skipped (line 7: no field
  // 'response')"
  std::string Summary() const;
};

const char* LayoutName(DatasetLayout layout);

class InstructionDataset {
 public:
  // Resolves the file and the split, detects the layout; reads the file only as far as needed
  // (counting records only when a bound is negative or a percentage).
  static StatusOr<InstructionDataset> Open(const DatasetOptions& options);

  // Streams the records of the split, in file order, to fn (which may stop the scan by returning
  // an error). Fills report. Fails when the split holds no usable record.
  Status ForEach(const std::function<Status(const InstructionRecord&)>& fn,
                 DatasetReport* report) const;

  const std::string& file() const { return file_; }
  DatasetLayout layout() const { return layout_; }
  std::pair<int64_t, int64_t> range() const { return {begin_, end_}; }

 private:
  std::string file_;
  bool json_array_ = false;
  SplitSpec split_;
  DatasetLayout layout_ = DatasetLayout::kDetect;
  std::string f_instruction_, f_context_, f_response_;
  int64_t begin_ = 0, end_ = INT64_MAX;
};

// The prompt a record becomes: `{instruction}`, `{context}` and `{response}` are replaced, `{{` and
// `}}` are literal braces. The context template is used for records with a non-empty context.
struct PromptTemplate {
  static constexpr const char* kDefault = "Instruction: {instruction}\nResponse: {response}";
  static constexpr const char* kDefaultWithContext =
      "Instruction: {instruction}\nContext: {context}\nResponse: {response}";
  std::string plain = kDefault;
  std::string with_context = kDefaultWithContext;

  Status Validate() const;  // unknown placeholders or unbalanced braces
  std::string Format(const InstructionRecord& r) const;
};

}  // namespace st
