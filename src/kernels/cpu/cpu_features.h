// What this CPU can do, read once at run time with cpuid (and what oneDNN will use of it), so that
// one portable binary picks its kernels per machine. Not for deciding anything about the model:
// the engine asks for a Precision, and the kernels map it onto what is here.
#pragma once

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

// The precision --precision NAME asks for: "fp32" and "bf16" as they are; "auto" = bf16 where
// the CPU has bf16 dot products (HasNativeBf16Gemm), fp32 otherwise. "bf16" on a CPU without them
// is an error naming the fix (emulated bf16 is slower than fp32: nobody wants it by accident).
// *why receives a short reason for the choice ("auto: AVX512-BF16"), for the setup line.
StatusOr<Precision> ResolvePrecision(const std::string& name, std::string* why = nullptr);

}  // namespace st::cpu
