// What the host gives a job, through the binary: the bundled data from any working directory,
// compute threads that follow the affinity mask and the overrides, memory that a job cannot fit
// refused up front, a failed allocation as one error line, and worker memory that stays flat
// across epochs. (Install layouts: tests/install/check_install.sh.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "e2b_width.h"
#include "io/hf_model.h"
#include "model/params.h"
#include "model/weights.h"
#include "test_util.h"
#include "train/memory_estimate.h"
#include "train/trainable.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using test::Ran;
using test::RunCommand;

const std::string kBin = ST_BINARY;

// The lines of `out` that hold "error:".
std::vector<std::string> ErrorLines(const std::string& out) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    if (line.find("error:") != std::string::npos) lines.push_back(line);
    pos = end + 1;
  }
  return lines;
}

TEST(BundledData, FoundFromAnyWorkingDirectory) {
  const Ran r = RunCommand("cd / && " + kBin + " tokenize --text 'hello world'");
  EXPECT_EQ(r.code, 0) << r.out;
  // A wrong --dataset is reported as such from anywhere, not hidden behind a missing tokenizer.
  const Ran bad = RunCommand("cd / && timeout 120 " + kBin +
                             " finetune --no-dashboard --dataset /nonexistent/dolly.jsonl");
  EXPECT_EQ(bad.code, 1) << bad.out;  // kNotFound (docs/errors.md)
  ASSERT_EQ(ErrorLines(bad.out).size(), 1u) << bad.out;
  EXPECT_NE(bad.out.find("/nonexistent/dolly.jsonl"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("tokenizer"), std::string::npos) << bad.out;
}

TEST(BundledData, AnExplicitPlaceMustHoldIt) {
  for (const std::string& how :
       {std::string("SLICETRAIN_DATA_DIR=/nonexistent ") + kBin + " tokenize --text hi",
        kBin + " tokenize --data-dir /tmp --text hi"}) {
    const Ran r = RunCommand("cd / && " + how);
    EXPECT_EQ(r.code, 1) << how << "\n" << r.out;
    ASSERT_EQ(ErrorLines(r.out).size(), 1u) << r.out;
    EXPECT_NE(r.out.find("holds no bundled data"), std::string::npos) << r.out;
  }
  // Pointing at the real data works from anywhere.
  const Ran ok = RunCommand(std::string("cd / && SLICETRAIN_DATA_DIR=") + ST_SOURCE_DIR + "/data " +
                            kBin + " tokenize --text hi");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// The per-rank thread counts a short finetune recorded in cluster.json.
std::vector<int> WorkerThreads(const std::string& prefix, const std::string& flags) {
  const std::string storage = test::TempDir("host_threads");
  const Ran r = RunCommand("cd / && " + prefix + " timeout 300 " + kBin +
                           " finetune --no-dashboard --num-epochs 1 --dataset-split 'train[:16]' "
                           "--progress off --storage-path " +
                           storage + " --run-name t " + flags);
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<int> threads;
  const auto cluster = nlohmann::json::parse(
      test::ReadFile(fs::path(storage) / "t" / "cluster.json"), nullptr, false);
  if (cluster.is_object())
    for (const auto& w : cluster["workers"]) threads.push_back(w.value("threads", -1));
  fs::remove_all(storage);
  return threads;
}

TEST(Threads, FollowTheAffinityMaskAndTheOverrides) {
  if (RunCommand("taskset -c 0 true").code != 0) GTEST_SKIP() << "taskset is not available";
  // One CPU for two workers: one compute thread each (not hardware_concurrency() / 2).
  EXPECT_EQ(WorkerThreads("taskset -c 0", ""), (std::vector<int>{1, 1}));
  // One worker alone gets every CPU it may use.
  const int cpus = std::stoi(RunCommand("nproc").out);
  EXPECT_EQ(WorkerThreads("", "--topology 1"), (std::vector<int>{cpus}));
  // Asked for: as asked, by flag or by OMP_NUM_THREADS, whatever the mask.
  EXPECT_EQ(WorkerThreads("taskset -c 0", "--threads 3"), (std::vector<int>{3, 3}));
  EXPECT_EQ(WorkerThreads("OMP_NUM_THREADS=2", ""), (std::vector<int>{2, 2}));
  const Ran step = RunCommand("taskset -c 0 " + kBin + " step --steps 1 --seq-len 16");
  EXPECT_NE(step.out.find("threads=1 "), std::string::npos) << step.out;
  const Ran bad = RunCommand(kBin + " finetune --threads -1");
  EXPECT_EQ(bad.code, 2) << bad.out;
}

// A CPU quota of one CPU on a cgroup of our own (v1 cpu controller or v2 cpu.max), made and
// removed by the test; "" where this machine does not let us.
class QuotaCgroup {
 public:
  QuotaCgroup() {
    const std::string name = "/st_test_quota_" + std::to_string(getpid());
    if (fs::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) {  // v1 (or hybrid)
      dir_ = "/sys/fs/cgroup/cpu" + name;
      if (!Make() || !Write("cpu.cfs_period_us", "100000") || !Write("cpu.cfs_quota_us", "100000"))
        dir_.clear();
    } else if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {  // v2
      dir_ = "/sys/fs/cgroup" + name;
      if (!Make() || !Write("cpu.max", "100000 100000")) dir_.clear();
    }
  }
  ~QuotaCgroup() {
    if (!enter_.empty()) fs::remove(enter_);
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  // A command prefix (a script) that moves the command into the cgroup, then runs it.
  std::string Enter() {
    if (enter_.empty()) {
      enter_ = dir_ + "_enter.sh";
      enter_ = "/tmp" + enter_.substr(enter_.rfind('/'));
      std::ofstream(enter_) << "#!/bin/sh\necho $$ > " << dir_ << "/cgroup.procs && exec \"$@\"\n";
      fs::permissions(enter_, fs::perms::owner_all);
    }
    return enter_;
  }
  bool ok() const { return !dir_.empty(); }

 private:
  bool Make() {
    std::error_code ec;
    return fs::create_directory(dir_, ec) && !ec;
  }
  bool Write(const std::string& file, const std::string& value) {
    std::ofstream out(dir_ + "/" + file);
    out << value << "\n";
    out.close();
    return static_cast<bool>(out);
  }
  std::string dir_, enter_;
};

TEST(Threads, FollowTheCgroupCpuQuota) {
  QuotaCgroup cg;
  if (!cg.ok()) GTEST_SKIP() << "cannot make a cgroup with a CPU quota here (needs root)";
  // One worker alone, limited to one CPU's worth of time: one thread, however many CPUs are
  // online (a pod's CPU limit on a big node).
  const Ran r = RunCommand(cg.Enter() + " " + kBin + " step --steps 1 --seq-len 16");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("threads=1 "), std::string::npos) << r.out;
  EXPECT_EQ(WorkerThreads(cg.Enter(), "--topology 1"), (std::vector<int>{1}));
  const Ran dry =
      RunCommand(cg.Enter() + " " + kBin + " launch --dry-run --nproc-per-node 1 -- finetune");
  EXPECT_NE(dry.out.find("cgroup quota 1.00 CPUs"), std::string::npos) << dry.out;
}

TEST(Memory, AJobThatCannotFitIsRefusedBeforeAnyWorkerStarts) {
  // gemma4-e2b with its 2.3 B trainable parameters: the root unit alone (the tied embeddings and
  // every layer's attention) is gathered on each worker for the whole step; 64 of them on one host
  // fit nowhere, and the line says which part is the largest and to freeze more.
  const Ran r = RunCommand("timeout 60 " + kBin +
                           " finetune --no-dashboard --model-id gemma4-e2b --topology 64");
  EXPECT_EQ(r.code, 1) << r.out;
  ASSERT_EQ(ErrorLines(r.out).size(), 1u) << r.out;
  for (const char* part :
       {"does not fit", "64 local worker(s)", "GiB available", "gathered FSDP units", "--freeze"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  EXPECT_EQ(r.out.find("Starting slicetrain"), std::string::npos) << "no worker may start";
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
}

// `finetune --dry-run`: the plan per worker and per host, nothing started; auto checkpointing
// keeps everything when that fits and recomputes when it does not; a job that fits with none of
// them is refused with one line that names the largest term and the flag that shrinks it.
TEST(Memory, DryRunPrintsThePlanAndRefusesAnImpossibleJob) {
  const std::string small = kBin + " finetune --dry-run --model-id gemma4-small ";
  const Ran fits = RunCommand(small + "--topology 2 --batch-size-per-device 4 --max-seq-len 512");
  EXPECT_EQ(fits.code, 0) << fits.out;
  for (const char* part :
       {"memory plan per worker of 2", "parameters (fp32 shard)", "gradients (fp32 shard)",
        "optimizer state (2 moments)", "gathered units", "activations", "workspace", "total",
        "per host: 2 worker(s)", "frozen maps", "fits", "--activation-checkpointing none"})
    EXPECT_NE(fits.out.find(part), std::string::npos) << part << "\n" << fits.out;
  EXPECT_EQ(fits.out.find("Starting slicetrain"), std::string::npos) << fits.out;

  // 64k tokens: keeping every activation needs more than this machine has; auto recomputes.
  const Ran long_seq =
      RunCommand(small + "--topology 1 --batch-size-per-device 1 --max-seq-len 65536");
  EXPECT_EQ(long_seq.code, 0) << long_seq.out;
  EXPECT_EQ(long_seq.out.find("--activation-checkpointing none"), std::string::npos)
      << long_seq.out;
  const Ran forced = RunCommand(small +
                                "--topology 1 --batch-size-per-device 1 --max-seq-len 65536 "
                                "--activation-checkpointing none");
  EXPECT_NE(forced.code, 0) << forced.out;
  ASSERT_EQ(ErrorLines(forced.out).size(), 1u) << forced.out;
  EXPECT_NE(forced.out.find("--activation-checkpointing layer"), std::string::npos) << forced.out;
  // Even recomputing every layer, 4 x 128k tokens do not fit: the sequence or batch must shrink.
  const Ran impossible = RunCommand(small +
                                    "--topology 1 --batch-size-per-device 4 --max-seq-len 131072 "
                                    "--activation-checkpointing layer");
  EXPECT_NE(impossible.code, 0) << impossible.out;
  ASSERT_EQ(ErrorLines(impossible.out).size(), 1u) << impossible.out;
  for (const char* part : {"activations", "--max-seq-len"})
    EXPECT_NE(impossible.out.find(part), std::string::npos) << part << "\n" << impossible.out;
  const Ran bad = RunCommand(small + "--activation-checkpointing everything");
  EXPECT_NE(bad.code, 0) << bad.out;
  EXPECT_NE(bad.out.find("none, mlp or layer"), std::string::npos) << bad.out;
}

// The peak RSS of the finetune's end-of-run memory line, in MiB (-1 if absent).
double MemoryLineRss(const std::string& out) {
  const size_t at = out.find("peak RSS ");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + 9));
}

// The per-worker total of --dry-run's plan, in MiB (-1 if absent).
double PlanTotalMiB(const std::string& out) {
  const size_t at = out.find("  total ");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + 8));
}

// Accumulating keeps every unit's unsharded fp32 gradient (FSDP2's no-sync): the plan shows it, and
// where it is what does not fit, the refusal names --sync-each-batch, which drops exactly that row.
// gemma4-e2b with its embeddings frozen, 8 workers on one host: needs far more than a CI machine.
TEST(Memory, AccumulationBuffersAndSyncEachBatch) {
  const std::string job = kBin +
                          " finetune --dry-run --model-id gemma4-e2b --topology 8 "
                          "--batch-size-per-device 1 --max-seq-len 512 --freeze '^embed_tokens' "
                          "--gradient-accumulation-steps 4";
  const Ran keep = RunCommand(job);
  EXPECT_NE(keep.code, 0) << keep.out;
  ASSERT_EQ(ErrorLines(keep.out).size(), 1u) << keep.out;
  for (const char* part : {"the largest part is gradient accumulation", "--sync-each-batch"})
    EXPECT_NE(ErrorLines(keep.out)[0].find(part), std::string::npos) << part << "\n" << keep.out;
  const size_t row = keep.out.find("  gradient accumulation (unsharded) ");
  ASSERT_NE(row, std::string::npos) << keep.out;
  const double buffers = std::stod(keep.out.substr(keep.out.find_first_of("0123456789", row)));
  EXPECT_GT(buffers, 1024) << keep.out;  // E2B's trainable layers: GiBs of fp32

  const Ran sync = RunCommand(job + " --sync-each-batch");
  EXPECT_EQ(sync.out.find("gradient accumulation (unsharded)"), std::string::npos) << sync.out;
  EXPECT_NEAR(PlanTotalMiB(keep.out) - PlanTotalMiB(sync.out), buffers, 0.2)
      << keep.out << sync.out;
}

// The plan predicts what a worker really holds: a one-step finetune's peak RSS (max over ranks)
// is within 10 % of the dry run's per-worker total, at 1, 2 and 4 workers, 512 and 4096 tokens,
// with and without checkpointing. Rows padded to --max-seq-len: the plan is for the longest batch
// a run may meet (dynamic padding and packing meet it only with examples that long).
TEST(Memory, ThePlanPredictsWorkerPeakRss) {
#ifdef ST_SANITIZED
  GTEST_SKIP() << "ASan's shadow memory and quarantine make RSS meaningless here";
#endif
  const std::string tmp = test::TempDir("plan_rss");
  struct Case {
    int workers;
    int64_t batch, seq;
    const char* checkpointing;
  };
  for (const Case& c : {Case{1, 2, 512, "none"}, Case{2, 2, 512, "none"}, Case{4, 1, 512, "none"},
                        Case{1, 1, 4096, "none"}, Case{2, 1, 4096, "layer"}}) {
    const std::string flags =
        StrCat(" --model-id gemma4-small --topology ", c.workers, " --batch-size-per-device ",
               c.batch, " --max-seq-len ", c.seq,
               " --packing off --padding max_length --activation-checkpointing ", c.checkpointing);
    const std::string what =
        StrCat(c.workers, " worker(s), ", c.batch, " x ", c.seq, " ", c.checkpointing);
    const Ran plan = RunCommand(kBin + " finetune --dry-run" + flags);
    ASSERT_EQ(plan.code, 0) << plan.out;
    const Ran run = RunCommand(
        "timeout 600 " + kBin + " finetune --no-dashboard --progress off --num-epochs 1" + flags +
        StrCat(" --dataset-split 'train[:", c.workers * c.batch, "]' --storage-path ", tmp,
               " --run-name r", c.workers, "_", c.seq, "_", c.checkpointing));
    ASSERT_EQ(run.code, 0) << run.out;
    const double predicted = PlanTotalMiB(plan.out), measured = MemoryLineRss(run.out);
    EXPECT_GT(measured, 0.9 * predicted) << what << "\n" << plan.out << run.out;
    EXPECT_LT(measured, 1.1 * predicted) << what << "\n" << plan.out << run.out;
    std::printf("%s: plan %.0f MiB per worker, peak RSS %.0f MiB (%+.1f %%)\n", what.c_str(),
                predicted, measured, 100.0 * (measured / predicted - 1));
  }
  fs::remove_all(tmp);
}

// `step` trains the whole model in one process: gemma4-e2b (37 GB of fp32 weights and gradients)
// is refused before anything is allocated, pointing at finetune.
TEST(Memory, StepRefusesAModelThatCannotFitInOneProcess) {
  const Ran r = RunCommand("timeout 60 " + kBin + " step --model-id gemma4-e2b --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  ASSERT_EQ(ErrorLines(r.out).size(), 1u) << r.out;
  for (const char* part : {"in one process", "GiB of fp32 weights", "available", "--freeze"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

TEST(Memory, AFailedAllocationNamesTheBufferInOneLine) {
  try {
    AlignedBuffer huge(int64_t{1} << 60, "a test buffer");
    FAIL() << "an exabyte was allocated";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("cannot allocate a test buffer"), std::string::npos);
    EXPECT_EQ(e.bytes(), size_t{1} << 62);
  }
  // Through the CLI: `step` sizes its activation arena from the flags and checks nothing first.
  const Ran r = RunCommand(kBin + " step --batch-size 100000 --seq-len 100000 --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  ASSERT_EQ(ErrorLines(r.out).size(), 1u) << r.out;
  EXPECT_NE(r.out.find("cannot allocate the activation arena"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
}

// Per worker RSS after the last step of `epoch` (metrics.jsonl).
std::vector<double> RssAtEndOfEpoch(const std::string& run_dir, int64_t epoch) {
  std::vector<double> rss;
  std::istringstream in(test::ReadFile(fs::path(run_dir) / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("type", "") != "step" || j.value("epoch", 0) != epoch) continue;
    if (j.value("step_in_epoch", 0) != j.value("steps_in_epoch", -1)) continue;
    for (const auto& w : j["workers"]) rss.push_back(w.value("rss_mib", 0.0));
  }
  return rss;
}

// The first checkpoints grow the heap (glibc keeps what the writer freed), and rank 0's window of
// recent steps (256) fills during the second epoch here (137 packed steps of 2 x 1 rows an epoch);
// after that every worker's RSS stays where it is, epoch after epoch: compared between the ends
// of epochs 3 and 5. Before the window, rank 0 grew by about 4 KB a step without bound (1.1 MiB
// over two epochs). What is left is noise: on a Zen 3 rank 0 stayed within 0.03 MiB over epochs
// 3-6; on a 5th-gen Xeon it moved by -0.27 to +0.25 MiB from one epoch to the next (fp32 with
// OpenBLAS's Cooperlake kernels), without a trend over 8 epochs.
TEST(Memory, WorkerMemoryIsFlatAcrossEpochs) {
#ifdef ST_SANITIZED
  GTEST_SKIP() << "ASan's quarantine keeps freed memory: RSS is measured in the normal build";
#endif
  const std::string storage = test::TempDir("host_flat");
  const int64_t epochs = 5;
  const Ran r =
      RunCommand("timeout 600 " + kBin +
                 " finetune --no-dashboard --progress off --batch-size-per-device 1 "
                 "--dataset-split 'train[:512]' --num-epochs " +
                 std::to_string(epochs) + " --storage-path " + storage + " --run-name flat");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string run = storage + "/flat";
  const std::vector<double> before = RssAtEndOfEpoch(run, epochs - 2),
                            last = RssAtEndOfEpoch(run, epochs);
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(last.size(), 2u);
  // Growth is the leak this looks for; RSS may fall when the kernel reclaims mapped file pages.
  for (size_t w = 0; w < 2; ++w)
    EXPECT_LT(last[w] - before[w], 0.5)
        << "rank " << w << ": " << before[w] << " MiB after epoch " << epochs - 2 << ", " << last[w]
        << " MiB after epoch " << epochs << " (two epochs later)";
  fs::remove_all(storage);
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// The sharded load at real widths: `evaluate` holds two layers and one vocabulary block in fp32,
// not the model (3.2 GB in fp32); two finetune workers that train the last layer each hold their
// half of its state, the frozen rest served from the shared mapped file; the checkpoint they
// write (split at --max-shard-size) loads again.
TEST(Load, E2bWidthCheckpointEvaluatesAndFinetunesInAFractionOfItsFp32Size) {
#ifdef ST_SANITIZED
  GTEST_SKIP() << "ASan's shadow memory and quarantine make RSS meaningless here";
#endif
  const std::string tmp = test::TempDir("e2b_width");
  const std::string model = tmp + "/model";
  Gemma4Config cfg;
  ASSERT_EQ(test::WriteE2bWidthCheckpoint(model, &cfg), "");
  const ParamRegistry reg = BuildParamRegistry(cfg);
  const double fp32_mib = reg.layout.total() * 4.0 / 1048576.0;

  const std::string tokenizer = " --tokenizer " ST_SOURCE_DIR "/data/tokenizer";
  const Ran eval =
      RunCommand("timeout 600 " + kBin + " evaluate --json --model-id " + model + tokenizer +
                 " --dataset-split 'train[:8]' --batch-size 2 --max-seq-len 32");
  ASSERT_EQ(eval.code, 0) << eval.out;
  const auto j = nlohmann::json::parse(eval.out.substr(eval.out.find('{')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << eval.out;
  const double eval_rss = j.value("peak_rss_mib", 0.0);
  WorkerShape eval_shape;
  eval_shape.batch = 2;
  eval_shape.seq = 32;
  const auto all_frozen = EstimateWorkerMemory(
      cfg, reg, std::vector<bool>(static_cast<size_t>(reg.layout.size()), false), eval_shape);
  EXPECT_LT(eval_rss, all_frozen.total() / 1048576.0 + 400) << eval.out;
  EXPECT_LT(eval_rss, 0.3 * fp32_mib) << eval.out;

  const std::string freeze = "^(embed_tokens|per_layer|layers\\.[0-2]\\.)";
  const Ran ft = RunCommand(
      "timeout 900 " + kBin + " finetune --no-dashboard --progress off --model-id " + model +
      tokenizer + " --freeze '" + freeze +
      "' --dataset-split 'train[:4]' --batch-size-per-device 1 --max-seq-len 32 --num-epochs 1 "
      "--max-shard-size 500MB --storage-path " +
      tmp + " --run-name e2b");
  ASSERT_EQ(ft.code, 0) << ft.out;
  auto trainable = TrainableTensors(reg, freeze);
  ASSERT_TRUE(trainable.ok());
  WorkerShape shape;
  shape.world = 2;
  shape.seq = 32;
  const auto estimate = EstimateWorkerMemory(cfg, reg, trainable->mask, shape);
  const double rss = MemoryLineRss(ft.out);
  EXPECT_GT(rss, 0) << ft.out;
  // The memory plan predicts it (what `finetune --dry-run` prints for this job).
  EXPECT_GT(rss, 0.9 * estimate.total() / 1048576.0) << ft.out;
  EXPECT_LT(rss, 1.1 * estimate.total() / 1048576.0) << ft.out;
  // Two prefetch slots of the trained layer's MLP (gathered weights, gradients, bf16 copy) are
  // most of it; the old load held the model twice in fp32 (2 x fp32_mib) on every rank.
  EXPECT_LT(rss, 0.6 * fp32_mib) << ft.out;
  std::printf(
      "E2B widths, 4 layers (%.0f MiB in fp32): evaluate peak RSS %.0f MiB, finetune (2 "
      "workers, last layer trained) peak RSS %.0f MiB per worker, planned %.0f MiB\n",
      fp32_mib, eval_rss, rss, estimate.total() / 1048576.0);

  const std::string ckpt = test::NewestCheckpoint(tmp + "/e2b");
  ASSERT_FALSE(ckpt.empty()) << ft.out;
  EXPECT_TRUE(fs::exists(ckpt + "/model.safetensors.index.json"));
  const Ran again = RunCommand("timeout 600 " + kBin + " evaluate --model-id " + ckpt +
                               " --dataset-split 'train[:2]' --max-seq-len 32");
  EXPECT_EQ(again.code, 0) << again.out;
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace st
