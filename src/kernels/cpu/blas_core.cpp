// OpenBLAS's kernel choice against what the CPU can run (cpu_features.h, BlasCoreOverride).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "kernels/cpu/cpu_features.h"

namespace st::cpu {
namespace {

// The vector level of an OpenBLAS core's kernels: 4 AVX-512, 3 AVX2, 2 below.
int CoreLevel(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (core == "skylakex" || core == "cooperlake" || core == "sapphirerapids") return 4;
  if (core == "haswell" || core == "zen" || core == "excavator") return 3;
  return 2;
}

bool IsIntel(const CpuFeatures& f) {
  return f.model.find("Intel") != std::string::npos;
}

}  // namespace

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string BlasCoreOverride() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const CpuFeatures& f = DetectCpu();
  const int chosen = CoreLevel(BlasCoreName());
  const bool v4 = f.avx512f && f.avx512bw && f.avx512vl && f.fma;
  const bool v3 = f.avx2 && f.fma;
  if (v4 && (chosen < 3 || (chosen == 3 && IsIntel(f))))
    return f.avx512_bf16 ? "COOPERLAKE" : "SKYLAKEX";
  if (v3 && chosen < 3) return "HASWELL";
  return "";
}

void ReexecWithBlasCore(char** argv) {
  const std::string core = BlasCoreOverride();
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Still here: run with the library's kernels (the variable stays set for child processes).
}

}  // namespace st::cpu
