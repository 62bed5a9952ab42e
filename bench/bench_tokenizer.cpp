// Tokenizer encoding speed (tokens/s, one thread) on the bundled instruction data set, formatted
// with the default prompt template, for the bundled tokenizer and the Gemma-style test tokenizer.
// Peer: bench/peers/tokenizer_peer.py times the `tokenizers` package on the same texts.
//   build-data/bench/bench_tokenizer --benchmark_min_time=1s
//   tools/.venv/bin/python bench/peers/tokenizer_peer.py
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"

namespace st {
namespace {

const std::string kRoot = ST_SOURCE_DIR;

// The 4000 prompts of data/tiny_instruct/train.jsonl.
const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    auto ds = InstructionDataset::Open(
        {kRoot + "/data/tiny_instruct/train.jsonl", "train", "", "", "", "", "", ""});
    ST_CHECK(ds.ok()) << ds.status().message();
    PromptTemplate t;
    DatasetReport rep;
    ST_CHECK(ds->ForEach(
                   [&](const InstructionRecord& r) {
                     out.push_back(t.Format(r));
                     return Status::Ok();
                   },
                   &rep)
                 .ok());
    return out;
  }();
  return texts;
}

const Tokenizer& Tok(int which) {
  static const Tokenizer bundled = Tokenizer::Load(kRoot + "/data/tokenizer").value();
  static const Tokenizer gemma =
      Tokenizer::Load(kRoot + "/tests/fixtures/tokenizer/gemma_style/tokenizer.json").value();
  return which == 0 ? bundled : gemma;
}

// One Encode per record, as the data loader does.
void BM_EncodeRecords(benchmark::State& state) {
  const Tokenizer& tok = Tok(static_cast<int>(state.range(0)));
  const auto& texts = Texts();
  int64_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    for (const std::string& t : texts) {
      std::vector<int32_t> ids = tok.Encode(t, false);
      tokens += static_cast<int64_t>(ids.size());
      bytes += static_cast<int64_t>(t.size());
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  state.counters["MB/s"] = benchmark::Counter(bytes / 1e6, benchmark::Counter::kIsRate);
  state.SetLabel(state.range(0) == 0 ? "bundled" : "gemma_style");
}

// All records joined by newlines as one text: with Gemma's pre-tokenizer this is one long word,
// the worst case for BPE merging.
void BM_EncodeOneLongText(benchmark::State& state) {
  const Tokenizer& tok = Tok(static_cast<int>(state.range(0)));
  std::string all;
  for (const std::string& t : Texts()) all += t + "\n";
  int64_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok.Encode(all, false);
    tokens += static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
  state.counters["MB/s"] = benchmark::Counter(double(all.size()) * state.iterations() / 1e6,
                                              benchmark::Counter::kIsRate);
  state.SetLabel(state.range(0) == 0 ? "bundled" : "gemma_style");
}

BENCHMARK(BM_EncodeRecords)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeOneLongText)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace st

BENCHMARK_MAIN();
