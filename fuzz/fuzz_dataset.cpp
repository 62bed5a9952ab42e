// Fuzzes the instruction data set reader: the input (after one control byte) becomes a .jsonl or
// .json file, read through InstructionDataset::Open and ForEach with one of a few splits, and every
// record is formatted with the default prompt template. Also fuzzes ParseSplit on the same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string jsonl = st::fuzz::ScratchPath(".jsonl");
  static const std::string json = st::fuzz::ScratchPath(".json");
  const uint8_t control = data[0];
  ++data;
  --size;
  (void)st::ParseSplit(std::string_view(reinterpret_cast<const char*>(data), size));

  static const char* const kSplits[] = {"train",           "train[:3]",      "train[1:]",
                                        "train[-2:]",      "train[10%:90%]", "train[:50%]",
                                        "train[-100%:-1]", "train[5:2]"};
  st::DatasetOptions o;
  o.path = (control & 1) ? json : jsonl;
  o.split = kSplits[(control >> 1) & 7];
  if (control & 16) o.response_field = "output";  // a custom layout
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
