// bf16 training through the binary: what `finetune --precision` picks and prints, bf16 against fp32
// over 200 steps (llm.c's check), N workers against one in bf16, and a CPU without bf16 dot
// products (forced by capping the ISA oneDNN may use). Exact resume and --max-failures recovery in
// bf16 are the trainer's and the fault tests' (test_trainer.cpp, test_faults.cpp), which run in the
// default precision: bf16 on a CPU that has it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "test_util.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using test::Ran;
using test::ReadFile;
using test::RunCommand;

const std::string kFinetune = std::string(ST_BINARY) +
                              " finetune --data-dir " ST_SOURCE_DIR
                              "/data --no-dashboard --progress off --save-steps 0";

std::vector<double> StepLosses(const std::string& run) {
  std::vector<double> v;
  std::ifstream metrics(run + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "step") v.push_back(j["loss"].get<double>());
  }
  return v;
}

TEST(Bf16Finetune, AutoPicksBf16WhereTheCpuHasItAndSaysSo) {
  const std::string dir = test::TempDir("bf16_auto");
  ASSERT_FALSE(dir.empty());
  const Ran r = RunCommand(kFinetune +
                           " --dataset-split 'train[:16]' --max-seq-len 32 --num-epochs 1 "
                           "--storage-path " +
                           dir + " --run-name auto");
  ASSERT_EQ(r.code, 0) << r.out;
  const bool bf16 = cpu::AutoPicksBf16();
  EXPECT_NE(
      r.out.find(bf16 ? "Compute: precision=bf16 (bf16 matmuls on " : "Compute: precision=fp32"),
      std::string::npos)
      << r.out;
  if (!bf16) {
    EXPECT_NE(r.out.find(cpu::HasNativeBf16Gemm() ? "Precision: fp32 (auto: AVX512-BF16 without AMX"
                                                  : "Precision: fp32 (auto: no bf16 dot products"),
              std::string::npos)
        << r.out;
  }
  const auto run = nlohmann::json::parse(ReadFile(dir + "/auto/run.json"), nullptr, false);
  ASSERT_TRUE(run.is_object());
  EXPECT_EQ(run["flags"]["precision"], bf16 ? "bf16" : "fp32") << run.dump();
  fs::remove_all(dir);
}

// 200 steps of gemma4-small (2 workers, 2 rows of 64 packed tokens each, lr 1e-4, the same data
// order) in bf16 and in fp32, then both final models evaluated on the same 256 held-out examples
// (in fp32): llm.c's check that bf16 trains as well as fp32, and that both learn.
//
// The bound is 5 %, not the 2 % of the issue: at this size one run against one run is dominated
// by how training amplifies rounding. Held-out losses measured on the Zen 4 VM, the same
// commands, two builds that differ only in the last bits of some sums (-march=native against the
// portable build, which dispatches the same AVX-512 kernels but has no FMA outside them):
//
//   lr 3e-4: fp32 3.0738 / 3.0562, bf16 3.0240 / 2.9474 (bf16 -1.6 % / -3.6 %)
//   lr 1e-4: fp32 3.5574 / 3.6105, bf16 3.5551 / 3.5445 (bf16 -0.07 % / -1.8 %)
//
// so the same precision moves 0.3-2.5 % between builds, about as much as fp32 against bf16 (at
// lr 1e-3, as the presets default, runs are further apart still: 8 % between two fp32 seeds). A
// broken bf16 path (a wrong gradient, lost updates) shows far beyond 5 % or fails to learn; the
// exact checks of the bf16 recipe are test_bf16.cpp's goldens against torch.
TEST(Bf16Finetune, TwoHundredStepsEndWithinFivePercentOfFp32) {
  if (!cpu::HasNativeBf16Gemm()) GTEST_SKIP() << "no bf16 dot products on this CPU";
#ifdef ST_SANITIZED
  GTEST_SKIP() << "a convergence check: minutes at -O3, far longer under the sanitizers";
#endif
  const std::string dir = test::TempDir("bf16_200");
  ASSERT_FALSE(dir.empty());
  std::vector<double> eval, first;
  for (const char* p : {"fp32", "bf16"}) {
    const Ran r = RunCommand(kFinetune +
                             " --model-id gemma4-small --topology 2 --max-seq-len 64 "
                             "--batch-size-per-device 2 --max-steps 200 --lr 1e-4 "
                             "--dataset-split 'train[:1024]' --num-to-keep 1 "
                             "--precision " +
                             std::string(p) + " --storage-path " + dir + " --run-name " + p);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::vector<double> steps = StepLosses(dir + "/" + p);
    ASSERT_EQ(steps.size(), 200u);
    first.push_back(steps[0]);
    const std::string ckpt = test::NewestCheckpoint(dir + "/" + p);
    ASSERT_FALSE(ckpt.empty());
    const Ran e =
        RunCommand(std::string(ST_BINARY) + " evaluate --json --precision fp32 --data-dir " +
                   ST_SOURCE_DIR
                   "/data --max-seq-len 64 --dataset-split "
                   "'train[1024:1280]' --model-id " +
                   ckpt);
    ASSERT_EQ(e.code, 0) << e.out;
    const auto j = nlohmann::json::parse(e.out.substr(e.out.find('{')), nullptr, false);
    ASSERT_TRUE(j.is_object()) << e.out;
    eval.push_back(j["loss"].get<double>());
  }
  EXPECT_LT(eval[0], 0.6 * first[0]) << "fp32 did not learn";
  EXPECT_LT(eval[1], 0.6 * first[1]) << "bf16 did not learn";
  EXPECT_NEAR(eval[1], eval[0], 0.05 * eval[0]) << "bf16 " << eval[1] << " vs fp32 " << eval[0];
  std::printf("200 steps, held-out loss: fp32 %.4f, bf16 %.4f (%+.2f %%)\n", eval[0], eval[1],
              100.0 * (eval[1] - eval[0]) / eval[0]);
  fs::remove_all(dir);
}

// The same global batches on 1, 2 and 4 workers in bf16. Different micro-batch shapes sum the
// products in different orders; in bf16 a difference in the last fp32 bit can move an operand to
// the neighbouring bf16 value (2^-8 relative), and AdamW's first steps, about lr x sign(g), turn a
// flipped near-zero gradient into a full-size update. At the preset's lr (1e-3) these runs are
// chaotic even in fp32: its epoch losses are up to 0.3 % apart between worker counts, bf16's up to
// 0.7 % (measured on a Zen 4), so the bar is 1.5 % of the loss. It still catches a rank whose
// gradient is missing or counted twice.
TEST(Bf16Finetune, WorkersAgreeWithOneWorker) {
  if (!cpu::HasNativeBf16Gemm()) GTEST_SKIP() << "no bf16 dot products on this CPU";
  const std::string dir = test::TempDir("bf16_workers");
  ASSERT_FALSE(dir.empty());
  const std::regex epoch_re(R"(Epoch (\d)/\d \| loss=(\d+\.\d{4}))");
  std::vector<std::vector<double>> by_world;
  for (const auto& [world, batch] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {4, 1}}) {
    const Ran r =
        RunCommand(kFinetune +
                   " --dataset-split 'train[:32]' --max-seq-len 32 "
                   "--num-epochs 2 --precision bf16 --topology " +
                   std::to_string(world) + " --batch-size-per-device " + std::to_string(batch) +
                   " --storage-path " + dir + " --run-name w" + std::to_string(world));
    ASSERT_EQ(r.code, 0) << r.out;
    std::vector<double> v;
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), epoch_re);
         it != std::sregex_iterator(); ++it)
      v.push_back(std::stod((*it)[2]));
    ASSERT_EQ(v.size(), 2u) << r.out;
    by_world.push_back(v);
  }
  EXPECT_LT(by_world[0][1], by_world[0][0] - 0.5) << "it learns";
  for (size_t w = 1; w < by_world.size(); ++w)
    for (size_t e = 0; e < 2; ++e)
      EXPECT_NEAR(by_world[w][e], by_world[0][e], 0.015 * by_world[0][e])
          << "world index " << w << " epoch " << e;
  fs::remove_all(dir);
}

// A CPU without bf16 dot products, made by capping the instruction sets oneDNN may use
// (ONEDNN_MAX_CPU_ISA=AVX512_CORE: AVX-512 without its bf16 extension): auto is fp32 with a line
// saying why, and an explicit bf16 is one error line naming the fix.
TEST(Precision, WithoutBf16InstructionsAutoIsFp32AndBf16IsOneError) {
  const std::string step =
      "ONEDNN_MAX_CPU_ISA=AVX512_CORE " + std::string(ST_BINARY) +
      " step --model-id gemma4-tiny --batch-size 1 --seq-len 8 --steps 1 --precision ";
  const Ran autop = RunCommand(step + "auto");
  ASSERT_EQ(autop.code, 0) << autop.out;
  EXPECT_NE(autop.out.find("Compute: precision=fp32"), std::string::npos) << autop.out;
  const Ran bf16 = RunCommand(step + "bf16");
  EXPECT_NE(bf16.code, 0) << bf16.out;
  EXPECT_NE(bf16.out.find("no bf16 dot-product instructions"), std::string::npos) << bf16.out;
  EXPECT_NE(bf16.out.find("use --precision fp32"), std::string::npos) << bf16.out;
  const Ran fine = RunCommand(kFinetune + " --precision bf17 --dataset-split 'train[:8]'");
  EXPECT_NE(fine.code, 0);
  EXPECT_NE(fine.out.find("--precision 'bf17' is not one of auto, bf16, fp32"), std::string::npos)
      << fine.out;
}

// The portable binary picks its kernels' x86-64 level at run time: `step` names the level it runs
// (the CPU's best, or the cap SLICETRAIN_MAX_CPU_ISA sets, as ONEDNN_MAX_CPU_ISA caps oneDNN), the
// capped run computes the same loss, and a bad cap is one error line before anything runs.
TEST(KernelIsa, StepNamesTheLevelItRunsAndTheCapIsHonoured) {
  const std::string step = std::string(ST_BINARY) +
                           " step --model-id gemma4-tiny --batch-size 1 --seq-len 16 --steps 1 "
                           "--precision fp32";
  const Ran best = RunCommand(step);
  ASSERT_EQ(best.code, 0) << best.out;
  EXPECT_NE(best.out.find(std::string("kernels ") + cpu::KernelIsaName(cpu::CpuKernelIsa())),
            std::string::npos)
      << best.out;
  const Ran capped = RunCommand("SLICETRAIN_MAX_CPU_ISA=x86-64-v2 " + step);
  ASSERT_EQ(capped.code, 0) << capped.out;
  EXPECT_NE(capped.out.find("kernels SSE4.2 (x86-64-v2)"), std::string::npos) << capped.out;
  // The same loss at every level (elementwise kernels differ only in summation order).
  const std::regex loss_re("loss[= ]+([0-9.]+)");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(best.out, a, loss_re)) << best.out;
  ASSERT_TRUE(std::regex_search(capped.out, b, loss_re)) << capped.out;
  EXPECT_NEAR(std::stod(a[1]), std::stod(b[1]), 1e-4 * std::stod(a[1]));
  const Ran bad = RunCommand("SLICETRAIN_MAX_CPU_ISA=avx9 " + step);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("error: SLICETRAIN_MAX_CPU_ISA='avx9' is not one of x86-64-v4"),
            std::string::npos)
      << bad.out;
}

// OpenBLAS runs kernels of the CPU's vector width: a fallback Debian's OpenBLAS picks for a CPU
// model it does not know (Prescott's SSE3 kernels on a 5th-gen Xeon) is replaced when the binary
// starts, and an OPENBLAS_CORETYPE the user set is kept.
TEST(KernelIsa, OpenBlasRunsKernelsOfTheCpusVectorWidth) {
  const std::string info = std::string(ST_BINARY) + " info --model-id gemma4-tiny";
  const Ran ran = RunCommand(info);
  ASSERT_EQ(ran.code, 0) << ran.out;
  const std::regex core_re("fp32 matmuls: OpenBLAS ([A-Za-z0-9]+) kernels");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ran.out, m, core_re)) << ran.out;
  const std::string core = m[1];
  const cpu::CpuFeatures& f = cpu::DetectCpu();
  const bool avx512_core = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
  const bool avx2_core = avx512_core || core == "Haswell" || core == "Zen" || core == "Excavator";
  if (f.avx2 && f.fma) {
    EXPECT_TRUE(avx2_core) << core;
  }
  if (f.avx512f && f.avx512bw && f.avx512vl && f.model.find("Intel") != std::string::npos) {
    EXPECT_TRUE(avx512_core) << core;
  }
  const Ran kept = RunCommand("OPENBLAS_CORETYPE=Prescott " + info);
  ASSERT_EQ(kept.code, 0) << kept.out;
  EXPECT_NE(kept.out.find("fp32 matmuls: OpenBLAS Prescott kernels"), std::string::npos)
      << kept.out;
}

}  // namespace
}  // namespace st
