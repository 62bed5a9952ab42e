// Observability (src/observe, src/train/step_metrics): the step metrics and their gather, the
// recorder's JSONL / run.json, the Prometheus text, the SVG plot, `runs`, the dashboard's
// endpoints and event stream, and end to end: a live `slicetrain finetune` watched over HTTP and
// in headless Chromium (a screenshot is saved when the page check fails).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "comm/group.h"
#include "comm/store/store.h"
#include "observe/dashboard.h"
#include "observe/plot.h"
#include "observe/recorder.h"
#include "observe/runs.h"
#include "observe/tensorboard.h"
#include "test_util.h"
#include "train/step_metrics.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using test::ReadFile;
using Clock = std::chrono::steady_clock;

// The Prometheus text format (0.0.4), strictly enough to catch what a scraper rejects: every
// sample belongs to a metric with a TYPE line before it, names and labels are well formed, values
// parse, and each (name, labels) pair appears once. Returns "" or the first problem.
std::string CheckPrometheus(const std::string& text, std::map<std::string, double>* samples) {
  const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  const std::regex type(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|histogram|summary|untyped))");
  const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")*)?\})? ([^ ]+))");
  std::map<std::string, std::string> types;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (line.empty()) continue;
    if (line.rfind("# HELP", 0) == 0) {
      if (!std::regex_match(line, m, help)) return "bad HELP line " + std::to_string(n);
      continue;
    }
    if (line.rfind("# TYPE", 0) == 0) {
      if (!std::regex_match(line, m, type)) return "bad TYPE line " + std::to_string(n);
      if (types.count(m[1])) return "second TYPE for " + m[1].str();
      types[m[1]] = m[2];
      continue;
    }
    if (line[0] == '#') continue;
    if (!std::regex_match(line, m, sample))
      return "bad sample line " + std::to_string(n) + ": " + line;
    const std::string name = m[1], value = m[7];
    if (!types.count(name)) return "sample before its TYPE: " + name;
    if (types[name] == "counter" && name.size() < 6) return "counter without _total: " + name;
    if (types[name] == "counter" && name.substr(name.size() - 6) != "_total")
      return "counter without _total: " + name;
    const std::string key = name + m[2].str();
    if (!seen.insert(key).second) return "duplicate sample " + key;
    double v = 0;
    if (value == "NaN")
      v = std::nan("");
    else if (value == "+Inf" || value == "-Inf")
      v = value[0] == '+' ? INFINITY : -INFINITY;
    else {
      size_t used = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        return "bad value on line " + std::to_string(n);
      }
      if (used != value.size()) return "bad value on line " + std::to_string(n);
    }
    if (samples) (*samples)[key] = v;
  }
  return "";
}

// XML well-formedness for the documents we write: balanced tags, one root, quoted attributes and
// no bare '&' or '<' in text. Returns "" or the first problem.
std::string CheckXml(const std::string& doc, const std::string& root) {
  std::vector<std::string> stack;
  int roots = 0;
  size_t i = 0;
  const std::regex attrs(
      R"((\s+[a-zA-Z_:][-a-zA-Z0-9_:.]*="[^"<&]*(&(amp|lt|gt|quot|apos);[^"<&]*)*")*\s*)");
  while (i < doc.size()) {
    if (doc[i] == '&') {
      const size_t semi = doc.find(';', i);
      const std::string ent = doc.substr(i, semi == std::string::npos ? 1 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return "bad entity at " + std::to_string(i);
      i += ent.size();
      continue;
    }
    if (doc[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = doc.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = doc.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.rfind("?xml", 0) == 0 || tag.rfind("!--", 0) == 0) continue;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag.substr(1);
      stack.pop_back();
      continue;
    }
    const bool self = tag.back() == '/';
    if (self) tag.pop_back();
    const size_t sp = tag.find_first_of(" \t\n");
    const std::string name = tag.substr(0, sp);
    if (sp != std::string::npos && !std::regex_match(tag.substr(sp), attrs))
      return "bad attributes in <" + name + ">";
    if (stack.empty()) {
      ++roots;
      if (name != root) return "root is <" + name + ">";
    }
    if (!self) stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return roots == 1 ? "" : "not one root element";
}

// ---------------------------------------------------------------------------------------------
// Step metrics

TEST(StepMetrics, SampleRoundTripsThroughFloats) {
  WorkerSample s;
  s.step_s = 1.5f, s.data_s = 0.25f, s.comm_wait_s = 0.125f, s.compute_s = 1.125f;
  s.real_tokens = 77, s.grad_sq = 9, s.rss_mib = 100, s.peak_rss_mib = 120, s.comm_mib = 3,
  s.comm_s = 0.5f;
  const auto packed = s.Pack();
  const WorkerSample t = WorkerSample::Unpack(packed.data());
  EXPECT_EQ(t.Pack(), packed);
}

TEST(StepMetrics, SummaryAddsRanksUp) {
  WorkerSample a, b;
  a.step_s = 2, a.compute_s = 1.5f, a.comm_wait_s = 0.5f, a.data_s = 0, a.grad_sq = 9,
  a.real_tokens = 10, a.comm_mib = 1, a.comm_s = 0.25f;
  b.step_s = 4, b.compute_s = 2.5f, b.comm_wait_s = 1.5f, b.data_s = 0, b.grad_sq = 16,
  b.real_tokens = 30, b.comm_mib = 1, b.comm_s = 0.25f;
  const StepMetrics s = SummariseStep({a, b}, 2.5, 1e-3, -1, 400, 1000);
  EXPECT_DOUBLE_EQ(s.step_s, 4);  // the slowest rank
  EXPECT_DOUBLE_EQ(s.compute_s, 2);
  EXPECT_DOUBLE_EQ(s.comm_wait_s, 1);
  EXPECT_DOUBLE_EQ(s.grad_norm, 5);  // sqrt(9 + 16): the shards partition the gradient
  EXPECT_EQ(s.real_tokens, 40);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 100);
  EXPECT_DOUBLE_EQ(s.real_tokens_per_s, 10);
  EXPECT_DOUBLE_EQ(s.model_flops_per_s, 6.0 * 1000 * 100);
  EXPECT_DOUBLE_EQ(s.comm_mib, 2);
  EXPECT_EQ(s.workers.size(), 2u);
  // With clipping on, the trainer passes the norm ClipGradNorm computed.
  EXPECT_DOUBLE_EQ(SummariseStep({a, b}, 2.5, 1e-3, 7.0, 400, 1000).grad_norm, 7.0);
}

TEST(StepMetrics, GatheredFromEveryRankWithThreadsAsRanks) {
  for (int world : {1, 3}) {
    auto store = std::make_shared<comm::MemoryStore>();
    std::vector<std::vector<WorkerSample>> got(world);
    std::vector<std::vector<WorkerInfo>> info(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        auto pg = comm::CreateProcessGroup(store, r, world, comm::GroupOptions{});
        if (!pg.ok()) return void(errors[r] = pg.status().ToString());
        auto i = GatherWorkerInfo(**pg, {});
        WorkerSample mine;
        mine.step_s = static_cast<float>(r + 1);
        mine.real_tokens = static_cast<float>(10 * r);
        auto s = GatherSamples(**pg, mine, {});
        if (!i.ok() || !s.ok()) return void(errors[r] = "gather failed");
        info[r] = *i;
        got[r] = *s;
        // The per-step totals count the gathers: bytes of the outputs.
        if ((*pg)->totals().ops != 2) errors[r] = "totals.ops != 2";
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(errors[r], "") << r;
      ASSERT_EQ(got[r].size(), static_cast<size_t>(world));
      for (int k = 0; k < world; ++k) {
        EXPECT_EQ(got[r][k].step_s, static_cast<float>(k + 1));
        EXPECT_EQ(got[r][k].real_tokens, static_cast<float>(10 * k));
        EXPECT_EQ(info[r][k].rank, k);
        EXPECT_EQ(info[r][k].pid, static_cast<int64_t>(::getpid()));
        EXPECT_FALSE(info[r][k].hostname.empty());
      }
    }
  }
}

TEST(StepMetrics, ProcessMemoryIsPlausible) {
  const ProcessMemory m = ReadProcessMemory();
  EXPECT_GT(m.rss_mib, 1.0);
  EXPECT_GE(m.peak_mib, m.rss_mib * 0.99);
}

// ---------------------------------------------------------------------------------------------
// Recorder, Prometheus, plot, runs

RunInfo TestRun(const std::string& storage, const std::string& name, int64_t first_epoch = 0) {
  RunInfo r;
  r.run_name = name;
  r.storage_path = storage;
  r.run_dir = (fs::path(storage) / name).string();
  fs::create_directories(r.run_dir);
  r.flags = {{"num_epochs", 2}, {"topology", "2"}, {"accelerator_type", "CPU"}};
  r.world_size = 2;
  r.num_epochs = 2;
  r.first_epoch = first_epoch;
  r.steps_per_epoch = 3;
  r.resumed_step = first_epoch * r.steps_per_epoch;  // resumed at an epoch end
  r.tokens_per_step = 512;
  r.trainable_parameters = 1000;
  r.workers = {{0, "hostA", "127.0.0.1", ::getpid()}, {1, "hostA", "127.0.0.1", ::getpid()}};
  return r;
}

StepMetrics TestStep(int64_t step, double loss) {
  WorkerSample w;
  w.step_s = 0.5f, w.compute_s = 0.4f, w.comm_wait_s = 0.1f, w.rss_mib = 100, w.peak_rss_mib = 110;
  w.real_tokens = 100, w.grad_sq = 1;
  StepMetrics s = SummariseStep({w, w}, loss, 1e-3, -1, 512, 1000);
  s.step = step;
  s.epoch = (step - 1) / 3 + 1;
  s.step_in_epoch = (step - 1) % 3 + 1;
  s.steps_in_epoch = 3;
  return s;
}

TEST(Recorder, WritesOneJsonRecordPerStepAndTheRunState) {
  const std::string storage = test::TempDir("observe_rec");
  observe::RunRecorder rec;
  EXPECT_EQ(rec.status(), "starting");
  rec.OnStart(TestRun(storage, "r"));
  for (int64_t s = 1; s <= 3; ++s) rec.OnStep(TestStep(s, 4.0 - s));
  rec.OnEpoch({1, 3, 2.0, 1.5, 1000, 200, 0});
  EXPECT_EQ(rec.Since(1, 0)["steps"].size(), 2u);
  EXPECT_EQ(rec.Since(3, 0)["epochs"].size(), 1u);
  EXPECT_EQ(rec.Since(3, 1)["epochs"].size(), 0u);
  rec.Finish(Status::Ok());

  std::ifstream in(fs::path(storage) / "r" / "metrics.jsonl");
  std::string line;
  int steps = 0, epochs = 0;
  for (int n = 0; std::getline(in, line); ++n) {
    const auto j = nlohmann::json::parse(line);  // throws on a malformed line
    if (j["type"] == "step") {
      ++steps;
      for (const char* k : {"step", "epoch", "loss", "lr", "grad_norm", "step_s", "compute_s",
                            "comm_wait_s", "data_s", "tokens_per_s", "real_tokens_per_s",
                            "model_flops_per_s", "comm_mib", "comm_s", "workers"})
        EXPECT_TRUE(j.contains(k)) << k;
      EXPECT_EQ(j["step"], steps);
      EXPECT_EQ(j["workers"].size(), 2u);
      EXPECT_TRUE(j["workers"][1].contains("peak_rss_mib"));
    } else {
      EXPECT_EQ(j["type"], "epoch");
      ++epochs;
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(epochs, 1);
  const auto run = nlohmann::json::parse(ReadFile(fs::path(storage) / "r" / "run.json"));
  EXPECT_EQ(run["status"], "finished");
  EXPECT_EQ(run["flags"]["num_epochs"], 2);
  const auto cluster = nlohmann::json::parse(ReadFile(fs::path(storage) / "r" / "cluster.json"));
  EXPECT_EQ(cluster["workers"].size(), 2u);
  EXPECT_EQ(rec.ClusterJson()["workers"][0]["alive"], false);  // the run is over
  fs::remove_all(storage);
}

// Our event records are byte for byte those tensorboard's own RecordWriter and protocol buffers
// make for the same events (tools/make_tensorboard_fixtures.py): framing, masked CRC-32C, field
// encoding, step 0 omitted, a 2^40 step, an empty summary, a non-ASCII tag, a SessionLog START.
TEST(TensorBoard, EventBytesEqualTensorBoardsWriter) {
  EXPECT_EQ(observe::Crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  const std::string dir = ST_SOURCE_DIR "/tests/fixtures/tensorboard";
  const auto golden = nlohmann::json::parse(ReadFile(dir + "/events.json"));
  std::string mine =
      observe::FrameRecord(observe::FileVersionEvent(golden["version_wall_time"].get<double>()));
  for (const auto& e : golden["events"]) {
    if (e.contains("session_log")) {
      ASSERT_EQ(e["session_log"], "START");
      mine += observe::FrameRecord(
          observe::SessionStartEvent(e["wall_time"].get<double>(), e["step"].get<int64_t>()));
      continue;
    }
    std::vector<observe::Scalar> scalars;
    for (const auto& sv : e["scalars"])
      scalars.push_back({sv[0].get<std::string>(), sv[1].get<float>()});
    mine += observe::FrameRecord(
        observe::ScalarsEvent(e["wall_time"].get<double>(), e["step"].get<int64_t>(), scalars));
  }
  const std::string theirs = ReadFile(dir + "/events.bin");
  ASSERT_EQ(mine.size(), theirs.size());
  EXPECT_TRUE(mine == theirs) << "the event records differ from tensorboard's";
}

// The records of one event file: every length and payload CRC checked; the payloads.
std::vector<std::string> ReadRecords(const std::string& path) {
  const std::string f = ReadFile(path);
  std::vector<std::string> out;
  size_t at = 0;
  auto u32 = [&](size_t p) {
    uint32_t v = 0;
    std::memcpy(&v, f.data() + p, 4);
    return v;
  };
  while (at + 12 <= f.size()) {
    uint64_t n = 0;
    std::memcpy(&n, f.data() + at, 8);
    EXPECT_EQ(u32(at + 8), observe::MaskedCrc32c(std::string_view(f.data() + at, 8)));
    EXPECT_LE(at + 12 + n + 4, f.size());
    const std::string data = f.substr(at + 12, n);
    EXPECT_EQ(u32(at + 12 + n), observe::MaskedCrc32c(data));
    out.push_back(data);
    at += 12 + n + 4;
  }
  EXPECT_EQ(at, f.size());
  return out;
}

// With TensorBoard on, the recorder writes a version record, one event per step and one per
// epoch into <run dir>/tensorboard, with transformers' tag names.
TEST(Recorder, WritesTensorBoardEvents) {
  const std::string storage = test::TempDir("observe_tb");
  observe::RunRecorder rec;
  rec.EnableTensorBoard(true);
  rec.OnStart(TestRun(storage, "r"));
  for (int64_t s = 1; s <= 3; ++s) rec.OnStep(TestStep(s, 4.0 - s));
  rec.OnEpoch({1, 3, 2.0, 1.5, 1000, 200, 0});
  rec.Finish(Status::Ok());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(storage) / "r" / "tensorboard"))
    files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::vector<std::string> records = ReadRecords(files[0].string());
  ASSERT_EQ(records.size(), 5u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  for (const char* tag : {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch"})
    EXPECT_NE(records[2].find(tag), std::string::npos) << tag;
  EXPECT_NE(records[4].find("epoch/loss"), std::string::npos);
  fs::remove_all(storage);
}

// Every evaluation (--eval-steps inside an epoch, and the epoch end's) is in the dashboard's views:
// /api/metrics' evals and the event stream's increments after a given step; a resume keeps those
// up to its checkpoint.
TEST(Recorder, EveryEvaluationReachesTheDashboardViews) {
  const std::string storage = test::TempDir("observe_evals");
  {
    observe::RunRecorder rec;
    rec.OnStart(TestRun(storage, "r"));
    for (int64_t s = 1; s <= 6; ++s) {
      rec.OnStep(TestStep(s, 4.0 - 0.5 * static_cast<double>(s)));
      if (s % 2 == 0) {
        EvalMetrics ev;
        ev.step = s;
        ev.epoch = (s - 1) / 3 + 1;
        ev.eval_loss = 3.0 - 0.25 * static_cast<double>(s);
        rec.OnEval(ev);
      }
    }
    EXPECT_EQ(rec.Since(6, 2, 0)["evals"].size(), 3u);
    EXPECT_EQ(rec.Since(6, 2, 2)["evals"].size(), 2u);
    EXPECT_EQ(rec.Since(6, 2, 2)["evals"][0]["eval_loss"], 2.0);
    EXPECT_EQ(rec.Since(6, 2, 6)["evals"].size(), 0u);
    EXPECT_EQ(rec.MetricsJson(0)["evals"].size(), 3u);
    EXPECT_EQ(rec.MetricsJson(4)["evals"].size(), 1u);
    rec.Finish(Status::Ok());
  }
  observe::RunRecorder resumed;
  resumed.OnStart(TestRun(storage, "r", /*first_epoch=*/1));  // from the step-3 checkpoint
  const auto evals = resumed.MetricsJson(0)["evals"];
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0]["step"], 2);
  resumed.Finish(Status::Ok());
  fs::remove_all(storage);
}

// A resumed run writes a new event file whose second record is a SessionLog START at the step after
// the checkpoint (the bytes SessionStartEvent makes, checked against tensorboard's own above), so
// that TensorBoard drops what the interrupted run wrote after it; a fresh run writes none.
TEST(Recorder, AResumedRunPurgesTheStepsAfterItsCheckpoint) {
  const std::string storage = test::TempDir("observe_tb_resume");
  auto files = [&] {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(fs::path(storage) / "r" / "tensorboard"))
      out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  };
  {
    observe::RunRecorder rec;
    rec.EnableTensorBoard(true);
    rec.OnStart(TestRun(storage, "r"));
    for (int64_t s = 1; s <= 5; ++s) rec.OnStep(TestStep(s, 4.0 - s));
    rec.Finish(Status::Ok());
  }
  const std::vector<fs::path> first = files();
  ASSERT_EQ(first.size(), 1u);
  const std::string start_log("\x3a\x02\x08\x01", 4);  // session_log (7) { status: START }
  ASSERT_NE(observe::SessionStartEvent(0, 4).find(start_log), std::string::npos);
  for (const std::string& r : ReadRecords(first[0].string()))
    EXPECT_EQ(r.find(start_log), std::string::npos) << "a fresh run purges nothing";
  // Next second: a new file name (the unix time is in it), as a real restart gets.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  {
    observe::RunRecorder rec;
    rec.EnableTensorBoard(true);
    rec.OnStart(TestRun(storage, "r", /*first_epoch=*/1));  // resumed at step 3
    rec.OnStep(TestStep(4, 0.5));
    rec.Finish(Status::Ok());
  }
  const std::vector<fs::path> both = files();
  ASSERT_EQ(both.size(), 2u);
  const std::vector<std::string> records = ReadRecords(both[1].string());
  ASSERT_GE(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // The START event at step 4, with the file's wall time (the version record's first 9 bytes).
  EXPECT_EQ(records[1], observe::SessionStartEvent(0, 4).replace(0, 9, records[0].substr(0, 9)));
  fs::remove_all(storage);
}

// --report-to jsonl:PATH: the sink gets every record metrics.jsonl gets, as it happens; a path
// that cannot be opened is an error up front.
TEST(Recorder, JsonlSinkGetsEveryRecord) {
  const std::string storage = test::TempDir("observe_sink");
  observe::RunRecorder rec;
  ASSERT_TRUE(rec.AddJsonlSink(storage + "/stream.jsonl").ok());
  rec.OnStart(TestRun(storage, "r"));
  rec.OnStep(TestStep(1, 2.5));
  EvalMetrics ev;
  ev.step = 1;
  ev.eval_loss = 2;
  rec.OnEval(ev);
  SampleMetrics s;
  s.step = 1;
  s.answers.push_back({"Hi", "Hello!", "end_of_turn", 3});
  rec.OnSamples(s);
  rec.OnEpoch({1, 1, 2.5, 1.5, 1000, 200, 0});
  const std::string sink = test::ReadFile(storage + "/stream.jsonl");
  rec.Finish(Status::Ok());
  EXPECT_EQ(sink, test::ReadFile(storage + "/r/metrics.jsonl"));
  EXPECT_EQ(std::count(sink.begin(), sink.end(), '\n'), 4) << sink;
  EXPECT_NE(sink.find("\"completion\":\"Hello!\""), std::string::npos) << sink;
  observe::RunRecorder bad;
  const Status st = bad.AddJsonlSink(storage + "/no/such/dir/x.jsonl");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x.jsonl"), std::string::npos) << st.message();
  fs::remove_all(storage);
}

TEST(Recorder, ResumeKeepsTheHistoryUpToTheCheckpointOnce) {
  const std::string storage = test::TempDir("observe_resume");
  {
    observe::RunRecorder first;
    first.OnStart(TestRun(storage, "r"));
    for (int64_t s = 1; s <= 5; ++s) {
      first.OnStep(TestStep(s, 1));  // died in epoch 2
      EvalMetrics ev;
      ev.step = s;
      ev.eval_loss = 2;
      first.OnEval(ev);
      SampleMetrics sm;
      sm.step = s;
      first.OnSamples(sm);
    }
    first.OnEpoch({1, 3, 1, 1, 1, 1, 0});
    first.Finish(InvalidArgument("killed"));
  }
  observe::RunRecorder second;
  second.OnStart(TestRun(storage, "r", /*first_epoch=*/1));
  second.OnStep(TestStep(4, 1));
  const auto log = observe::ReadMetricsLog((fs::path(storage) / "r").string());
  ASSERT_EQ(log.steps.size(), 4u);
  for (size_t i = 0; i < log.steps.size(); ++i) EXPECT_EQ(log.steps[i]["step"], i + 1);
  EXPECT_EQ(log.epochs.size(), 1u);
  ASSERT_EQ(log.evals.size(), 3u);  // up to the checkpoint's step 3, once
  EXPECT_EQ(log.evals.back()["step"], 3);
  ASSERT_EQ(log.samples.size(), 3u);
  EXPECT_EQ(log.samples.back()["step"], 3);
  fs::remove_all(storage);
}

TEST(Recorder, PrometheusTextParses) {
  const std::string storage = test::TempDir("observe_prom");
  observe::RunRecorder rec;
  RunInfo run = TestRun(storage, "odd \"name\"\\ x");
  rec.OnStart(run);
  std::map<std::string, double> samples;
  EXPECT_EQ(CheckPrometheus(rec.Prometheus(), &samples), "");
  rec.OnStep(TestStep(1, 3.25));
  rec.OnStep(TestStep(2, std::nan("")));  // a diverged loss is still valid text
  const std::string text = rec.Prometheus();
  ASSERT_EQ(CheckPrometheus(text, &samples), "") << text;
  const std::string run_label = R"(run="odd \"name\"\\ x")";
  EXPECT_EQ(samples.at("slicetrain_step{" + run_label + "}"), 2);
  EXPECT_TRUE(std::isnan(samples.at("slicetrain_loss{" + run_label + "}")));
  EXPECT_EQ(samples.at("slicetrain_tokens_total{" + run_label + ",kind=\"padded\"}"), 1024);
  EXPECT_EQ(samples.count("slicetrain_worker_peak_rss_bytes{" + run_label + ",rank=\"1\"}"), 1u);
  fs::remove_all(storage);
}

TEST(Plot, SvgIsWellFormedAndEscapesText) {
  observe::Series s{"a <b> & c", "#123456", {{1, 2}, {2, 3}, {3, NAN}}};
  observe::Series one{"single", "#654321", {{1, 5}}};
  const std::string svg =
      observe::PlotSvg("t & <t>", "step", {{"p1", "y", {s, one}}, {"p2", "y", {}}});
  EXPECT_EQ(CheckXml(svg, "svg"), "") << svg;
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("<circle"), std::string::npos);
}

TEST(Plot, TrainingCurvesFromTheRunDirectory) {
  const std::string storage = test::TempDir("observe_plot");
  observe::RunRecorder rec;
  rec.OnStart(TestRun(storage, "r"));
  for (int64_t s = 1; s <= 4; ++s) rec.OnStep(TestStep(s, 5.0 / s));
  EvalMetrics ev;
  ev.step = 4;
  ev.eval_loss = 1.5;
  rec.OnEval(ev);
  rec.Finish(Status::Ok());
  auto paths = observe::WriteTrainingCurves((fs::path(storage) / "r").string(), "r");
  ASSERT_TRUE(paths.ok()) << paths.status().ToString();
  ASSERT_GE(paths->size(), 1u);
  EXPECT_EQ(CheckXml(ReadFile(paths->front()), "svg"), "");
  EXPECT_NE(ReadFile(paths->front()).find("eval loss (held-out)"), std::string::npos);
  if (!observe::FindOnPath("rsvg-convert").empty()) {
    ASSERT_EQ(paths->size(), 2u);
    const std::string png = ReadFile(paths->at(1));
    EXPECT_EQ(png.substr(1, 3), "PNG");
  }
  fs::remove_all(storage);
}

// A storage path as runs written before run.json existed (checkpoints only) and a finished run
// with everything.
std::string StorageFixture() {
  const std::string storage = test::TempDir("observe_runs");
  const fs::path old = fs::path(storage) / "old_run" / "checkpoint_2026-01-01_00-00-00.000001";
  fs::create_directories(old);
  std::ofstream(old / "trainer_state.json") << R"({"epoch": 1, "global_step": 8, "loss": 3.5})";
  std::ofstream(old / "metrics.json") << R"({"epoch": 1, "loss": 3.5, "tokens_per_s": 10})";
  fs::create_directories(fs::path(storage) / "not_a_run");
  observe::RunRecorder rec;
  rec.OnStart(TestRun(storage, "new_run"));
  // Evaluations every 2 steps (--eval-steps 2) and at the epoch ends: steps 2, 3, 4 and 6.
  auto eval = [&](int64_t step) {
    EvalMetrics ev;
    ev.step = step;
    ev.epoch = (step - 1) / 3 + 1;
    ev.eval_loss = 3.1 - 0.1 * static_cast<double>(step);
    rec.OnEval(ev);
  };
  for (int64_t s = 1; s <= 6; ++s) {
    rec.OnStep(TestStep(s, 3.0 - 0.1 * s));
    if (s % 2 == 0 || s % 3 == 0) eval(s);
    if (s % 3 == 0) rec.OnEpoch({s / 3, s, s == 3 ? 2.8 : 2.5, 1, 1, 1, 0});
  }
  const fs::path ck = fs::path(storage) / "new_run" / "checkpoint_2026-01-02_00-00-00.000001";
  fs::create_directories(ck);
  std::ofstream(ck / "trainer_state.json") << R"({"epoch": 2, "global_step": 6, "loss": 2.5})";
  std::ofstream(ck / "metrics.json") << R"({"epoch": 2, "loss": 2.5})";
  rec.Finish(Status::Ok());
  return storage;
}

TEST(Runs, ListsRunsWithCheckpointsAndBestScores) {
  const std::string storage = StorageFixture();
  const auto runs = observe::ScanRuns(storage);
  ASSERT_EQ(runs.size(), 2u);
  std::map<std::string, observe::RunSummary> by;
  for (const auto& r : runs) by[r.name] = r;
  EXPECT_EQ(by["new_run"].status, "finished");
  EXPECT_EQ(by["new_run"].epochs_done, 2);
  EXPECT_EQ(by["new_run"].steps, 6);
  EXPECT_DOUBLE_EQ(by["new_run"].best_score, 2.5);
  EXPECT_EQ(by["old_run"].checkpoints.size(), 1u);
  EXPECT_DOUBLE_EQ(by["old_run"].best_score, 3.5);
  const std::string table = observe::RunsTable(runs);
  EXPECT_NE(table.find("NAME"), std::string::npos);
  EXPECT_NE(table.find("loss=2.5000 (min)"), std::string::npos);
  EXPECT_NE(table.find("old_run"), std::string::npos);
  EXPECT_TRUE(observe::ScanRuns(storage + "/missing").empty());
  fs::remove_all(storage);
}

// A run directory whose run.json says "running" with the given process and heartbeat fields.
std::string RunningRunJson(const std::string& storage, const std::string& name,
                           const nlohmann::json& fields) {
  const fs::path dir = fs::path(storage) / name;
  fs::create_directories(dir);
  nlohmann::json run = {{"name", name}, {"status", "running"}, {"start_time", 1.0}};
  run.update(fields);
  std::ofstream(dir / "run.json") << run.dump();
  return dir.string();
}

std::string ThisHost() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

TEST(Runs, RunningNeedsTheSameLiveProcessOrAFreshHeartbeat) {
  const std::string storage = test::TempDir("observe_alive");
  const int64_t me = getpid(), ticks = observe::ProcessStartTicks(me);
  ASSERT_GT(ticks, 0);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A zombie: a child that exited and is not reaped yet still answers kill(pid, 0).
  const pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  ASSERT_GT(zombie, 0);
  for (int i = 0; i < 200 && observe::ProcessStartTicks(zombie) != -1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(observe::ProcessStartTicks(zombie), -1);

  struct Case {
    const char* name;
    nlohmann::json fields;
    const char* status;
  } cases[] = {
      {"alive", {{"hostname", ThisHost()}, {"pid", me}, {"pid_start", ticks}}, "running"},
      {"pid_reused",
       {{"hostname", ThisHost()}, {"pid", me}, {"pid_start", ticks + 1}},
       "interrupted"},
      {"zombie", {{"hostname", ThisHost()}, {"pid", zombie}}, "interrupted"},
      {"gone", {{"hostname", ThisHost()}, {"pid", 4194304 + 7}}, "interrupted"},
      {"remote_fresh",
       {{"hostname", "elsewhere-host"}, {"pid", 1}, {"heartbeat_time", now - 5}},
       "running"},
      {"remote_stale",
       {{"hostname", "elsewhere-host"},
        {"pid", 1},
        {"heartbeat_time", now - observe::kHeartbeatStaleSeconds - 30}},
       "interrupted"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(observe::ReadRun(RunningRunJson(storage, c.name, c.fields)).status, c.status)
        << c.name;
  waitpid(zombie, nullptr, 0);
  fs::remove_all(storage);
}

TEST(Recorder, HeartbeatAndProcessIdentityInRunJson) {
  const std::string storage = test::TempDir("observe_beat");
  observe::RunRecorder rec;
  rec.OnStart(TestRun(storage, "r"));
  const auto run = nlohmann::json::parse(ReadFile(fs::path(storage) / "r" / "run.json"));
  EXPECT_EQ(run["pid"], getpid());
  EXPECT_EQ(run["pid_start"], observe::ProcessStartTicks(getpid()));
  EXPECT_GT(run["heartbeat_time"].get<double>(), 0);
  EXPECT_EQ(observe::ReadRun((fs::path(storage) / "r").string()).status, "running");
  rec.Finish(Status::Ok());  // stops the heartbeat thread at once
  EXPECT_EQ(observe::ReadRun((fs::path(storage) / "r").string()).status, "finished");
  fs::remove_all(storage);
}

// Rank 0 keeps only the newest steps in memory (flat memory however long the run); older ones
// are served from metrics.jsonl, so the dashboard still gets every step.
TEST(Recorder, OldStepsComeFromTheFileNotFromMemory) {
  const std::string storage = test::TempDir("observe_ring");
  observe::RunRecorder rec;
  rec.OnStart(TestRun(storage, "r"));
  const int64_t n = 1000;
  for (int64_t s = 1; s <= n; ++s) rec.OnStep(TestStep(s, 1.0));
  for (int64_t since : {int64_t{0}, int64_t{10}, n - 300, n - 5, n}) {
    const auto all = rec.MetricsJson(since)["steps"];
    ASSERT_EQ(static_cast<int64_t>(all.size()), n - since) << since;
    for (size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(all[i]["step"], since + 1 + static_cast<int64_t>(i)) << since;
    EXPECT_EQ(static_cast<int64_t>(rec.Since(since, 0)["steps"].size()), n - since) << since;
  }
  rec.Finish(Status::Ok());
  fs::remove_all(storage);
}

// ---------------------------------------------------------------------------------------------
// Dashboard

// The local addresses of the TCP sockets listening on `port`, or (port 0) of those among
// `inodes`.
std::vector<std::string> ListeningAddresses(int port, const std::set<std::string>& inodes = {}) {
  std::vector<std::string> out;
  for (const test::ListeningSocket& s : test::ListeningSockets())
    if (port > 0 ? s.port == port : inodes.count(s.inode) > 0) out.push_back(s.address);
  return out;
}

bool IsLoopbackHex(const std::string& a) {
  if (a.size() == 8) return a.substr(6, 2) == "7F";  // 127.x.x.x, little-endian
  // ::1, or ::ffff:127.x.x.x
  return a == "00000000000000000000000001000000" ||
         (a.substr(0, 24) == "0000000000000000FFFF0000" && a.substr(30, 2) == "7F");
}

TEST(Dashboard, ServesStoredRunsOnLoopback) {
  const std::string storage = StorageFixture();
  auto d = observe::Dashboard::Start({"127.0.0.1", 0, storage, ""}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const int port = (*d)->port();
  ASSERT_GT(port, 0);
  for (const std::string& a : ListeningAddresses(port)) EXPECT_TRUE(IsLoopbackHex(a)) << a;
  httplib::Client c("127.0.0.1", port);
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  for (const char* tab : {">Jobs<", ">Cluster<", ">Metrics<", "EventSource"})
    EXPECT_NE(page->body.find(tab), std::string::npos) << tab;
  EXPECT_EQ(page->body.find("http://"), std::string::npos) << "no external resources";
  EXPECT_EQ(page->body.find("https://"), std::string::npos) << "no external resources";

  auto jobs = c.Get("/api/jobs");
  ASSERT_TRUE(jobs);
  const auto j = nlohmann::json::parse(jobs->body);
  EXPECT_TRUE(j["live"].is_null());
  EXPECT_EQ(j["runs"].size(), 2u);
  auto metrics = c.Get("/api/metrics?run=new_run&since=2");
  ASSERT_TRUE(metrics);
  const auto m = nlohmann::json::parse(metrics->body);
  EXPECT_EQ(m["steps"].size(), 4u);
  EXPECT_EQ(m["steps"][0]["step"], 3);
  auto cluster = c.Get("/api/cluster?run=new_run");
  ASSERT_TRUE(cluster);
  const auto cl = nlohmann::json::parse(cluster->body);
  EXPECT_EQ(cl["workers"].size(), 2u);
  EXPECT_EQ(cl["workers"][0]["alive"], false);
  for (const char* bad :
       {"/api/metrics?run=..", "/api/metrics?run=a/b", "/api/cluster?run=none", "/events"}) {
    auto r = c.Get(bad);
    ASSERT_TRUE(r) << bad;
    EXPECT_EQ(r->status, 404) << bad;
  }
  auto prom = c.Get("/metrics");
  ASSERT_TRUE(prom);
  EXPECT_EQ(CheckPrometheus(prom->body, nullptr), "") << prom->body;
  EXPECT_NE(prom->body.find("slicetrain_stored_run_best_score{run=\"new_run\""), std::string::npos);
  d->reset();
  fs::remove_all(storage);
}

TEST(Dashboard, BeyondLoopbackEveryRequestNeedsTheToken) {
  EXPECT_TRUE(observe::IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(observe::IsLoopbackHost("localhost"));
  EXPECT_TRUE(observe::IsLoopbackHost("::1"));
  EXPECT_FALSE(observe::IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(observe::IsLoopbackHost("10.1.2.3"));
  EXPECT_EQ(observe::DashboardToken("127.0.0.1", ""), "");
  EXPECT_EQ(observe::DashboardToken("127.0.0.1", "mine"), "mine");  // asked for: kept
  const std::string generated = observe::DashboardToken("0.0.0.0", "");
  EXPECT_EQ(generated.size(), 48u);
  EXPECT_NE(generated, observe::DashboardToken("0.0.0.0", ""));

  const std::string storage = StorageFixture();
  auto refused = observe::Dashboard::Start({"0.0.0.0", 0, storage, ""}, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("SLICETRAIN_DASHBOARD_TOKEN"), std::string::npos);

  const std::string token = "s3cret-token";
  auto d = observe::Dashboard::Start({"0.0.0.0", 0, storage, token}, nullptr);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const int port = (*d)->port();
  EXPECT_EQ((*d)->url().find(token), std::string::npos) << "url() is what run.json records";
  EXPECT_NE((*d)->login_url().find("?token=" + token), std::string::npos);
  httplib::Client c("127.0.0.1", port);
  for (const char* path : {"/", "/api/jobs", "/api/cluster", "/api/metrics", "/events", "/metrics",
                           "/?token=wrong", "/api/jobs?token=s3cret-toke"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 403) << path;
    EXPECT_EQ(r->body.find("new_run"), std::string::npos) << path;
  }
  auto login = c.Get("/?token=" + token);
  ASSERT_TRUE(login);
  EXPECT_EQ(login->status, 200);
  const std::string cookie = login->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos) << cookie;
  // The page's own requests carry the cookie; scrapers and scripts send the header.
  auto with_cookie = c.Get("/api/jobs", {{"Cookie", cookie.substr(0, cookie.find(';'))}});
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  EXPECT_NE(with_cookie->body.find("new_run"), std::string::npos);
  auto bearer = c.Get("/metrics", {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200);
  auto wrong_cookie =
      c.Get("/api/jobs", {{"Cookie", "slicetrain_token_" + std::to_string(port) + "=nope"}});
  ASSERT_TRUE(wrong_cookie);
  EXPECT_EQ(wrong_cookie->status, 403);
  d->reset();

  // On loopback nothing is asked.
  auto open = observe::Dashboard::Start({"127.0.0.1", 0, storage, ""}, nullptr);
  ASSERT_TRUE(open.ok());
  httplib::Client o("127.0.0.1", (*open)->port());
  auto jobs = o.Get("/api/jobs");
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200);
  open->reset();
  fs::remove_all(storage);
}

TEST(Dashboard, BusyPortIsAnErrorNotACrash) {
  auto first = observe::Dashboard::Start({"127.0.0.1", 0, "/nonexistent", ""}, nullptr);
  ASSERT_TRUE(first.ok());
  auto second =
      observe::Dashboard::Start({"127.0.0.1", (*first)->port(), "/nonexistent", ""}, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--dashboard-port"), std::string::npos);
}

TEST(Dashboard, EventStreamDeliversStepsLiveAndEndsWithTheRun) {
  const std::string storage = test::TempDir("observe_sse");
  observe::RunRecorder rec;
  rec.OnStart(TestRun(storage, "live"));
  rec.OnStep(TestStep(1, 3));
  auto d = observe::Dashboard::Start({"127.0.0.1", 0, storage, ""}, &rec);
  ASSERT_TRUE(d.ok());
  std::mutex mu;
  std::string received;
  std::thread reader([&] {
    httplib::Client c("127.0.0.1", (*d)->port());
    c.set_read_timeout(std::chrono::seconds(60));
    c.Get("/events?since=0", [&](const char* data, size_t n) {
      std::lock_guard<std::mutex> lock(mu);
      received.append(data, n);
      return true;
    });
  });
  auto wait_for = [&](const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (received.find(what) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  EXPECT_TRUE(wait_for("\"step\":1,"));
  rec.OnStep(TestStep(2, 2));  // pushed while the client listens
  EXPECT_TRUE(wait_for("\"step\":2,"));
  EvalMetrics ev;
  ev.step = 2;
  ev.eval_loss = 1.75;
  rec.OnEval(ev);
  EXPECT_TRUE(wait_for("event: eval\ndata: {"));
  rec.OnEpoch({1, 3, 2.5, 1, 1, 1, 0});
  EXPECT_TRUE(wait_for("event: epoch"));
  rec.Finish(Status::Ok());
  EXPECT_TRUE(wait_for("\"status\":\"finished\""));
  reader.join();  // the server ends the stream when the run is over
  std::lock_guard<std::mutex> lock(mu);
  // Each event is "event: <type>\ndata: <one JSON line>\n\n".
  std::istringstream in(received);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("data: ", 0) == 0) {
      EXPECT_FALSE(nlohmann::json::parse(line.substr(6), nullptr, false).is_discarded()) << line;
    }
  d->reset();
  fs::remove_all(storage);
}

// ---------------------------------------------------------------------------------------------
// End to end through the binary

// A child process with its stdout+stderr collected line by line on a thread.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        out_.append(buf, static_cast<size_t>(n));
      }
      ::close(fd);
    });
  }
  ~Child() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }
  // The first match of `re`'s group 1 in the output, waiting for it up to `seconds`.
  std::string WaitFor(const std::string& re, int seconds) {
    const std::regex r(re);
    const auto deadline = Clock::now() + std::chrono::seconds(seconds);
    while (Clock::now() < deadline) {
      std::smatch m;
      const std::string out = output();
      if (std::regex_search(out, m, r)) return m.size() > 1 ? m[1].str() : m[0].str();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "";
  }
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    waited_ = true;
    if (reader_.joinable()) reader_.join();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  bool waited_ = false;
  std::mutex mu_;
  std::string out_;
  std::thread reader_;
};

std::string Chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (std::string p = observe::FindOnPath(name); !p.empty()) return p;
  return "";
}

// Runs headless Chromium on `url` and returns the DOM after the page's scripts ran.
std::string DumpDom(const std::string& url, const std::string& dir) {
  const std::string cmd = "timeout 180 " + Chromium() +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage"
                          " --user-data-dir=" +
                          dir +
                          "/chrome --window-size=1400,1100"
                          " --virtual-time-budget=8000 --dump-dom '" +
                          url + "' 2>/dev/null";
  std::string dom;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof(buf), p)) > 0) dom.append(buf, n);
  if (p) pclose(p);
  return dom;
}

void Screenshot(const std::string& url, const std::string& path, const std::string& dir) {
  const std::string cmd = "timeout 180 " + Chromium() +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage"
                          " --user-data-dir=" +
                          dir +
                          "/chrome2 --window-size=1400,1100"
                          " --virtual-time-budget=8000 --hide-scrollbars --screenshot=" +
                          path + " '" + url + "' >/dev/null 2>&1";
  (void)std::system(cmd.c_str());
}

nlohmann::json GetJson(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path.c_str());
  if (!r || r->status != 200) return nlohmann::json();
  return nlohmann::json::parse(r->body, nullptr, false);
}

TEST(ObserveE2E, LiveFinetuneDashboardEndpointsAndBrowser) {
  const std::string dir = test::TempDir("observe_e2e");
  Child run({ST_BINARY,
             "finetune",
             "--data-dir",
             ST_SOURCE_DIR "/data",
             "--dataset-split",
             "train[:512]",
             "--num-epochs",
             "1",
             "--batch-size-per-device",
             "4",
             "--max-seq-len",
             "32",
             "--topology",
             "2",
             "--storage-path",
             dir,
             "--run-name",
             "live",
             "--progress",
             "off",
             "--dashboard-port",
             "0",
             "--dashboard-linger",
             "15"});
  const std::string url = run.WaitFor(R"(Dashboard: (http://127\.0\.0\.1:[0-9]+/))", 300);
  ASSERT_FALSE(url.empty()) << run.output();
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(30));

  // While the run is in progress: the first steps arrive, well formed.
  nlohmann::json m;
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  while (Clock::now() < deadline) {
    m = GetJson(c, "/api/metrics");
    if (m.is_object() && m.value("steps", nlohmann::json::array()).size() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(m.is_object() && !m["steps"].empty()) << run.output();
  const bool in_progress = m["status"] == "running";
  const auto& step = m["steps"][0];
  for (const char* k : {"loss", "lr", "grad_norm", "step_s", "compute_s", "comm_wait_s", "data_s",
                        "tokens_per_s", "real_tokens_per_s", "model_flops_per_s", "comm_mib"})
    EXPECT_TRUE(step.contains(k) && step[k].is_number()) << k;
  EXPECT_EQ(step["workers"].size(), 2u);
  EXPECT_GT(step["comm_mib"].get<double>(), 0.0);

  const auto jobs = GetJson(c, "/api/jobs");
  ASSERT_TRUE(jobs.is_object());
  EXPECT_EQ(jobs["live"], "live");
  const auto cluster = GetJson(c, "/api/cluster");
  ASSERT_TRUE(cluster.is_object());
  ASSERT_EQ(cluster["workers"].size(), 2u);
  std::vector<pid_t> pids;
  for (const auto& w : cluster["workers"]) {
    EXPECT_GT(w["pid"].get<int64_t>(), 0);
    pids.push_back(static_cast<pid_t>(w["pid"].get<int64_t>()));
    if (cluster["status"] == "running") {
      EXPECT_EQ(w["alive"], true);
    }
  }
  // Nothing the job started listens on a non-loopback address (dashboard, store, Gloo).
  for (pid_t pid : pids) {
    const auto inodes = test::SocketInodes(pid);
    for (const std::string& a : ListeningAddresses(0, inodes))
      EXPECT_TRUE(IsLoopbackHex(a)) << "pid " << pid << " listens on " << a;
  }
  EXPECT_FALSE(ListeningAddresses(port).empty());
  auto prom = c.Get("/metrics");
  ASSERT_TRUE(prom);
  std::map<std::string, double> samples;
  EXPECT_EQ(CheckPrometheus(prom->body, &samples), "") << prom->body;
  EXPECT_GE(samples.at("slicetrain_step{run=\"live\"}"), 1);
  // The event stream sends step records.
  {
    std::string got;
    httplib::Client sse("127.0.0.1", port);
    sse.set_read_timeout(std::chrono::seconds(60));
    sse.Get("/events?since=0", [&](const char* data, size_t n) {
      got.append(data, n);
      return got.find("event: step") == std::string::npos;  // stop after the first
    });
    EXPECT_NE(got.find("event: step\ndata: {"), std::string::npos) << got;
  }

  // The page in a real browser: three tabs and a chart with at least one point.
  if (Chromium().empty()) {
    ADD_FAILURE() << "chromium is not installed (scripts/setup.sh installs it)";
  } else {
    std::atomic<bool> stop{false};
    std::thread keep([&] {  // keeps the lingering dashboard up while Chromium works
      httplib::Client k("127.0.0.1", port);
      while (!stop) {
        (void)k.Get("/api/jobs");
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    });
    const std::string dom = DumpDom(url + "#metrics", dir);
    int tabs = 0;
    for (size_t p = 0; (p = dom.find("class=\"tab", p)) != std::string::npos; ++p) ++tabs;
    std::smatch pts;
    const std::regex loss_points(R"x(<svg id="c-loss"[^>]*data-points="([0-9]+)")x");
    const bool has_points = std::regex_search(dom, pts, loss_points) && std::stoi(pts[1]) >= 1;
    const bool ready = dom.find("data-ready=\"1\"") != std::string::npos;
    if (tabs != 3 || !has_points || !ready) {
      const std::string shot = dir + "/dashboard_failure.png";
      Screenshot(url + "?live=0#metrics", shot, dir);
      ADD_FAILURE() << "the page lacks its tabs (" << tabs
                    << ") or a chart point; screenshot: " << shot << "\nDOM:\n"
                    << dom.substr(0, 4000);
    }
    stop = true;
    keep.join();
  }
  EXPECT_EQ(run.Wait(), 0) << run.output();
  std::printf("run in progress at the first poll: %s\n", in_progress ? "yes" : "no");

  // What the run leaves: one JSON record per step, the plot, the run state.
  const fs::path run_dir = fs::path(dir) / "live";
  const auto log = observe::ReadMetricsLog(run_dir.string());
  EXPECT_EQ(log.steps.size(), 64u);  // 512 examples / (2 workers x 4)
  EXPECT_EQ(log.epochs.size(), 1u);
  EXPECT_EQ(CheckXml(ReadFile(run_dir / "training_curves.svg"), "svg"), "");
  EXPECT_NE(run.output().find("Training curves: " + (run_dir / "training_curves.svg").string()),
            std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(ReadFile(run_dir / "run.json"))["status"], "finished");
  fs::remove_all(dir);
}

TEST(ObserveE2E, BusyDashboardPortOnlyWarns) {
  const std::string dir = test::TempDir("observe_busy");
  auto taken = observe::Dashboard::Start({"127.0.0.1", 0, dir, ""}, nullptr);
  ASSERT_TRUE(taken.ok());
  Child run(
      {ST_BINARY,         "finetune",   "--data-dir",       ST_SOURCE_DIR "/data",
       "--dataset-split", "train[:16]", "--num-epochs",     "1",
       "--max-seq-len",   "16",         "--topology",       "2",
       "--storage-path",  dir,          "--run-name",       "busy",
       "--progress",      "off",        "--dashboard-port", std::to_string((*taken)->port())});
  EXPECT_EQ(run.Wait(), 0) << run.output();
  EXPECT_NE(run.output().find("warning: cannot bind the dashboard"), std::string::npos)
      << run.output();
  EXPECT_TRUE(fs::exists(fs::path(dir) / "busy" / "metrics.jsonl"));
  fs::remove_all(dir);
}

// A run's dashboard beyond loopback: the URL it prints carries a fresh token, which run.json
// and metrics never record; the configured one (SLICETRAIN_DASHBOARD_TOKEN) is used as given.
TEST(ObserveE2E, DashboardBeyondLoopbackPrintsItsTokenOnce) {
  const std::string dir = test::TempDir("observe_token");
  auto run_with = [&](const std::string& name, const std::string& env) {
    const test::Ran r = test::RunCommand(
        env +
        " timeout 300 " ST_BINARY
        " finetune --dataset-split 'train[:16]' --num-epochs 1 "
        "--max-seq-len 16 --progress off --dashboard-host 0.0.0.0 --dashboard-port 0 "
        "--storage-path " +
        dir + " --run-name " + name);
    EXPECT_EQ(r.code, 0) << r.out;
    std::smatch m;
    const std::regex url(R"(Dashboard: http://127\.0\.0\.1:\d+/\?token=([0-9a-zA-Z_-]+)\n)");
    EXPECT_TRUE(std::regex_search(r.out, m, url)) << r.out;
    const std::string token = m.size() > 1 ? m[1].str() : "";
    for (const char* file : {"run.json", "metrics.jsonl", "cluster.json"})
      EXPECT_EQ(ReadFile(fs::path(dir) / name / file).find(token), std::string::npos) << file;
    EXPECT_NE(ReadFile(fs::path(dir) / name / "run.json").find("http://127.0.0.1:"),
              std::string::npos);
    return token;
  };
  const std::string generated = run_with("gen", "");
  EXPECT_EQ(generated.size(), 48u);
  EXPECT_EQ(run_with("mine", "SLICETRAIN_DASHBOARD_TOKEN=my-token-123"), "my-token-123");
  fs::remove_all(dir);
}

TEST(ObserveE2E, RunsCommandAndStoredDashboard) {
  const std::string storage = StorageFixture();
  {
    Child table({ST_BINARY, "runs", "--storage-path", storage});
    EXPECT_EQ(table.Wait(), 0);
    EXPECT_NE(table.output().find("new_run"), std::string::npos) << table.output();
    EXPECT_NE(table.output().find("finished"), std::string::npos) << table.output();
    Child json({ST_BINARY, "runs", "--storage-path", storage, "--json"});
    EXPECT_EQ(json.Wait(), 0);
    const auto j = nlohmann::json::parse(json.output());
    EXPECT_EQ(j["runs"].size(), 2u);
  }
  Child dash({ST_BINARY, "dashboard", "--storage-path", storage, "--port", "0"});
  const std::string url = dash.WaitFor(R"(Dashboard: (http://127\.0\.0\.1:[0-9]+/))", 60);
  ASSERT_FALSE(url.empty()) << dash.output();
  httplib::Client c("127.0.0.1", std::stoi(url.substr(url.rfind(':') + 1)));
  const auto jobs = GetJson(c, "/api/jobs");
  ASSERT_TRUE(jobs.is_object());
  EXPECT_EQ(jobs["runs"].size(), 2u);
  const auto metrics = GetJson(c, "/api/metrics?run=new_run");
  EXPECT_EQ(metrics["steps"].size(), 6u);
  EXPECT_EQ(metrics["evals"].size(), 4u);
  // The page's loss chart: 6 steps, 2 epoch means and every evaluation (4), not only the epoch
  // ends' (2).
  if (Chromium().empty()) {
    ADD_FAILURE() << "chromium is not installed (scripts/setup.sh installs it)";
  } else {
    const std::string dom = DumpDom(url + "?live=0#metrics", storage);
    std::smatch pts;
    const std::regex loss_points(R"x(<svg id="c-loss"[^>]*data-points="([0-9]+)")x");
    ASSERT_TRUE(std::regex_search(dom, pts, loss_points)) << dom.substr(0, 4000);
    EXPECT_EQ(std::stoi(pts[1]), 12) << dom.substr(0, 4000);
    EXPECT_NE(dom.find(">eval loss<"), std::string::npos) << dom.substr(0, 4000);
  }
  ::kill(dash.pid(), SIGTERM);
  EXPECT_EQ(dash.Wait(), 0) << dash.output();
  fs::remove_all(storage);
}

}  // namespace
}  // namespace st
