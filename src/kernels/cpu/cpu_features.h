// What this CPU can do, read once at run time with cpuid (and what oneDNN will use of it), so that
// one portable binary picks its kernels per machine. Not for deciding anything about the model:
// the engine asks for a Precision, and the kernels map it onto what is here.
#pragma once

#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace st::cpu {

struct CpuFeatures {
  std::string model;  // the processor's brand string, e.g. "AMD EPYC 9B14"
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 =
      false;              // VDPBF16PS: bf16 dot products in AVX-512 registers (Cooper Lake, Zen 4)
  bool amx_bf16 = false;  // AMX tiles with bf16 (Sapphire Rapids and later)
  bool avx512_vnni = false;  // VPDPBUSD: int8 dot products (Cascade Lake, Ice Lake, Zen 4)
};

// cpuid, once per process (the first call; later calls return the same object).
const CpuFeatures& DetectCpu();

// The best instruction set of the list this machine has, as the setup line prints it:
// "AMX-BF16", "AVX512-BF16", "AVX-512", "AVX2" or "SSE".
const char* IsaName(const CpuFeatures& f);

// The instruction set oneDNN dispatches its bf16 matrix products to here, after ONEDNN_MAX_CPU_ISA
// (or a test's limit) is applied: "AMX", "AVX512-BF16", or "none" when it has no bf16 dot
// products to use (it would then emulate bf16 at fp32's speed or worse).
const char* Bf16GemmIsa();
bool HasNativeBf16Gemm();
// Whether --precision auto computes in bf16 here: where the bf16 GEMM is faster than fp32's.
// AMX-BF16, and AVX512-BF16 on AMD (Zen 4: 2.1x fp32's GEMM peak, measured); not AVX512-BF16 on
// an Intel CPU without AMX (a 5th-gen Xeon with AMX not exposed: oneDNN's bf16 GEMM ran at 0.54x
// OpenBLAS's fp32, VDPBF16PS issuing at half the FMA rate there).
bool AutoPicksBf16();

// The precision --precision NAME asks for: "fp32" and "bf16" as they are; "auto" = bf16 where
// it is the faster (AutoPicksBf16), fp32 otherwise. "bf16" on a CPU without them
// is an error naming the fix (emulated bf16 is slower than fp32: nobody wants it by accident).
// *why receives a short reason for the choice ("auto: AVX512-BF16"), for the setup line.
StatusOr<Precision> ResolvePrecision(const std::string& name, std::string* why = nullptr);

// Our own hand-written kernels (kernels/cpu/isa_*.cpp: elementwise ops, norms, RoPE, attention,
// the decoder's matrix-vector and few-row products) are compiled once per x86-64 level and picked
// per machine at run time, so the default build is portable (baseline x86-64-v2) and still runs
// AVX-512 where the CPU has it. The libraries (OpenBLAS, oneDNN) dispatch on their own.
enum class KernelIsa : int {
  kX86_64_v2 = 2,  // SSE4.2 (the baseline every x86-64 server since 2009 has)
  kX86_64_v3 = 3,  // AVX2 + FMA (Haswell, Zen 1 and later)
  kX86_64_v4 = 4,  // AVX-512 F/BW/VL/DQ/CD (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4)
};
// "AVX-512 (x86-64-v4)", "AVX2 (x86-64-v3)", "SSE4.2 (x86-64-v2)".
const char* KernelIsaName(KernelIsa isa);
// The best level this CPU (and its OS: the AVX register state) supports.
KernelIsa CpuKernelIsa();
// Accepts the level names (x86-64-v4|v3|v2) and their ISA nicknames (avx512|avx2|sse4.2).
StatusOr<KernelIsa> ParseKernelIsa(const std::string& name);
// The level the kernels run at: the CPU's, capped by SLICETRAIN_MAX_CPU_ISA (as oneDNN's
// ONEDNN_MAX_CPU_ISA caps its own) and by LimitKernelIsa. Read on every dispatch (cheap).
KernelIsa ActiveKernelIsa();
// Caps the level for this process from now on (tests run every compiled variant this way);
// nullopt lifts the cap set here (the environment's stays).
void LimitKernelIsa(std::optional<KernelIsa> max);
// One line for a bad SLICETRAIN_MAX_CPU_ISA, or for a CPU below the level this binary was built
// for; main() checks it before any command runs.
Status CheckKernelIsa();

// OpenBLAS's kernels (the fp32 products). Debian 12's OpenBLAS 0.3.21 (DYNAMIC_ARCH) picks them by
// CPU model, and a model it does not know falls back to "Prescott" (SSE3): a 5th-generation Xeon
// (family 6, model 207) ran fp32 GEMMs at 33 GFLOP/s a core instead of the 155 its AVX-512 kernels
// reach. The name OpenBLAS chose, e.g. "Prescott", "Haswell", "Cooperlake", "Zen".
std::string BlasCoreName();
// The OPENBLAS_CORETYPE this process should run with, or "" when OpenBLAS's choice stands (the
// variable is set already, or the chosen kernels use the CPU's vector width). A fallback below
// AVX2 on a CPU with AVX2 gets Haswell's kernels, or with AVX-512 SkylakeX's (Cooperlake's with
// AVX512-BF16); so does an Intel CPU with AVX-512 given AVX2 kernels. An AMD CPU given "Zen"
// kernels keeps them (0.3.21 already gives Zen 4 Cooperlake's).
std::string BlasCoreOverride();
// For main(): OpenBLAS reads OPENBLAS_CORETYPE when it is loaded, before main, so the process
// re-executes itself once with BlasCoreOverride() set. Returns when there is nothing to do or the
// exec failed (the process then runs with the library's choice).
void ReexecWithBlasCore(char** argv);

}  // namespace st::cpu
