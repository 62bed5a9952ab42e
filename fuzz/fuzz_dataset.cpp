// Fuzzes the instruction data set reader: the input (after one control byte) becomes a .jsonl,
// .json (plain, or with --dataset-field data), .csv or .tsv file, read through
// InstructionDataset::Open and ForEach with one of a few splits, and every record is formatted
// with the default prompt template. Also fuzzes ParseSplit on the same bytes. (Parquet files:
// fuzz_parquet.)
#include <cstdint>
#include <string>
#include <string_view>

#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string jsonl = st::fuzz::ScratchPath(".jsonl");
  static const std::string json = st::fuzz::ScratchPath(".json");
  static const std::string csv = st::fuzz::ScratchPath(".csv");
  static const std::string tsv = st::fuzz::ScratchPath(".tsv");
  const uint8_t control = data[0];
  ++data;
  --size;
  (void)st::ParseSplit(std::string_view(reinterpret_cast<const char*>(data), size));

  static const char* const kSplits[] = {"train",           "train[:3]",      "train[1:]",
                                        "train[-2:]",      "train[10%:90%]", "train[:50%]",
                                        "train[-100%:-1]", "train[5:2]"};
  st::DatasetOptions o;
  const int kind = ((control & 1) | ((control >> 4) & 6));  // 0..7
  o.path = kind == 0 || kind == 2 ? jsonl : kind == 1 || kind == 3 ? json : kind < 6 ? csv : tsv;
  if (kind == 3) o.json_field = "data";
  o.split = kSplits[(control >> 1) & 7];
  if (kind == 4) o.response_field = "output";  // a custom layout
  if (kind == 2) o.messages_field = "messages";
  st::fuzz::WriteScratch(o.path, data, size);
  st::StatusOr<st::InstructionDataset> ds = st::InstructionDataset::Open(o);
  if (!ds.ok()) return 0;
  st::PromptTemplate tmpl;
  st::DatasetReport report;
  size_t total = 0;
  (void)ds->ForEach(
      [&](const st::InstructionRecord& r) {
        total += tmpl.Format(r).size();
        return st::Status::Ok();
      },
      &report);
  (void)report.Summary();
  return 0;
}
