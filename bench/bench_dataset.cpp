// Reading an instruction data set the way finetune does (InstructionDataset::Open, then ForEach
// over every record of the split; Parquet decodes only the columns the records need), touching
// each record's text. Prints one line, the format bench/dataset_read.sh reads beside the pyarrow
// and `datasets` peers (bench/peers/dataset_peer.py):
//   slicetrain rows N seconds S rows_per_s R mb_per_s M peak_rss_mib P
// MB/s is the file's size on disk (1e6 bytes) per second; peak RSS is this process's (getrusage).
//   bench_dataset FILE [--split train] [--repeat 1]
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "data/dataset.h"

int main(int argc, char** argv) {
  CLI::App app{"Read an instruction data set file as finetune does; print rows/s and MB/s"};
  std::string file, split = "train";
  int repeat = 1;
  app.add_option("file", file, "Data file (.jsonl, .json, .csv, .tsv, .parquet)")->required();
  app.add_option("--split", split, "Split expression")->capture_default_str();
  app.add_option("--repeat", repeat, "Reads; the fastest is printed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  st::DatasetOptions o;
  o.path = file;
  o.split = split;
  double best = 1e30;
  int64_t rows = 0;
  size_t bytes = 0;
  for (int i = 0; i < std::max(1, repeat); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    st::StatusOr<st::InstructionDataset> ds = st::InstructionDataset::Open(o);
    if (!ds.ok()) {
      std::fprintf(stderr, "bench_dataset: %s\n", ds.status().message().c_str());
      return 1;
    }
    rows = 0;
    bytes = 0;
    st::DatasetReport report;
    st::Status s = ds->ForEach(
        [&](const st::InstructionRecord& r) {
          ++rows;
          bytes += r.instruction.size() + r.context.size() + r.response.size();
          return st::Status::Ok();
        },
        &report);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_dataset: %s\n", s.message().c_str());
      return 1;
    }
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double mb = static_cast<double>(std::filesystem::file_size(file)) / 1e6;
  std::printf("slicetrain rows %lld seconds %.4f rows_per_s %.0f mb_per_s %.1f peak_rss_mib %.0f\n",
              static_cast<long long>(rows), best, static_cast<double>(rows) / best, mb / best,
              static_cast<double>(ru.ru_maxrss) / 1024.0);
  std::fprintf(stderr, "bench_dataset: %zu bytes of text in %lld records\n", bytes,
               static_cast<long long>(rows));
  return 0;
}
