#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

namespace st::cpu {

namespace {

CpuFeatures Read() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  bool os_avx = false, os_avx512 = false;
  if (max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) {
    f.fma = (c >> 12) & 1;
    const bool osxsave = (c >> 27) & 1;
    if (osxsave) {
      // XCR0: the OS saves YMM (bits 1-2) and ZMM/opmask state (bits 5-7) on context switches.
      unsigned lo = 0, hi = 0;
      __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      os_avx = (lo & 0x6) == 0x6;
      os_avx512 = os_avx && (lo & 0xe0) == 0xe0;
    }
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = os_avx && ((b >> 5) & 1);
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    f.avx512bw = f.avx512f && ((b >> 30) & 1);
    f.avx512vl = f.avx512f && ((b >> 31) & 1);
    f.avx512_vnni = f.avx512vl && ((c >> 11) & 1);
    f.amx_bf16 = (d >> 22) & 1;  // the OS grants the tile state per process (oneDNN asks for it)
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  }
  unsigned ext = __get_cpuid_max(0x80000000u, nullptr);
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002u + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf + 0, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
    f.model = brand;
    // Brand strings are padded with spaces at either end.
    f.model.erase(0, f.model.find_first_not_of(' '));
    f.model.erase(f.model.find_last_not_of(' ') + 1);
  }
  return f;
}

}  // namespace

const CpuFeatures& DetectCpu() {
  static const CpuFeatures features = Read();
  return features;
}

const char* IsaName(const CpuFeatures& f) {
  if (f.amx_bf16) return "AMX-BF16";
  if (f.avx512_bf16) return "AVX512-BF16";
  if (f.avx512f) return "AVX-512";
  if (f.avx2) return "AVX2";
  return "SSE";
}

const char* Bf16GemmIsa() {
  // The effective ISA is the CPU's, capped by ONEDNN_MAX_CPU_ISA / dnnl::set_max_cpu_isa.
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  const CpuFeatures& f = DetectCpu();
  if (isa == dnnl::cpu_isa::avx512_core_amx && f.amx_bf16) return "AMX";
  if ((isa == dnnl::cpu_isa::avx512_core_amx || isa == dnnl::cpu_isa::avx512_core_bf16) &&
      f.avx512_bf16)
    return "AVX512-BF16";
  // Sapphire Rapids has avx512_bf16 too, so AMX capped at avx512_core_bf16 lands above.
  return "none";
}

bool HasNativeBf16Gemm() {
  return std::strcmp(Bf16GemmIsa(), "none") != 0;
}

bool AutoPicksBf16() {
  if (!HasNativeBf16Gemm()) return false;
  if (std::string(Bf16GemmIsa()) == "AMX") return true;
  return DetectCpu().model.find("Intel") == std::string::npos;
}

StatusOr<Precision> ResolvePrecision(const std::string& name, std::string* why) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
  };
  if (name == "fp32") {
    say("fp32: asked for");
    return Precision::kFp32;
  }
  if (name == "bf16") {
    if (!HasNativeBf16Gemm())
      return InvalidArgument(
          std::string("--precision bf16: this CPU (") + IsaName(DetectCpu()) + ", " +
          (DetectCpu().model.empty() ? "unknown model" : DetectCpu().model) +
          ") has no bf16 dot-product instructions (AVX512_BF16 or AMX-BF16) that "
          "oneDNN may use, so bf16 would run emulated and slower than fp32; use "
          "--precision fp32 (or auto)");
    say(std::string("bf16: asked for, ") + Bf16GemmIsa());
    return Precision::kBf16;
  }
  if (name == "auto") {
    if (AutoPicksBf16()) {
      say(std::string("auto: ") + Bf16GemmIsa() + " bf16 dot products");
      return Precision::kBf16;
    }
    if (HasNativeBf16Gemm()) {
      say("auto: AVX512-BF16 without AMX on an Intel CPU multiplies bf16 at about half fp32's "
          "speed; --precision bf16 forces it");
      return Precision::kFp32;
    }
    say(std::string("auto: no bf16 dot products on this CPU (") + IsaName(DetectCpu()) + ")");
    return Precision::kFp32;
  }
  return InvalidArgument("--precision '" + name + "' is not one of auto, bf16, fp32");
}

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kX86_64_v4:
      return "AVX-512 (x86-64-v4)";
    case KernelIsa::kX86_64_v3:
      return "AVX2 (x86-64-v3)";
    case KernelIsa::kX86_64_v2:
      break;
  }
  return "SSE4.2 (x86-64-v2)";
}

KernelIsa CpuKernelIsa() {
  // libgcc's cpu model checks the OS's XCR0 for the AVX and AVX-512 state, as Read() does.
  static const KernelIsa best = __builtin_cpu_supports("x86-64-v4")   ? KernelIsa::kX86_64_v4
                                : __builtin_cpu_supports("x86-64-v3") ? KernelIsa::kX86_64_v3
                                                                      : KernelIsa::kX86_64_v2;
  return best;
}

StatusOr<KernelIsa> ParseKernelIsa(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "x86-64-v4" || n == "avx512" || n == "avx-512") return KernelIsa::kX86_64_v4;
  if (n == "x86-64-v3" || n == "avx2") return KernelIsa::kX86_64_v3;
  if (n == "x86-64-v2" || n == "sse4.2" || n == "sse42") return KernelIsa::kX86_64_v2;
  return InvalidArgument("SLICETRAIN_MAX_CPU_ISA='" + name +
                         "' is not one of x86-64-v4 (avx512), x86-64-v3 (avx2), "
                         "x86-64-v2 (sse4.2); unset it to use the best this CPU has");
}

namespace {

// The cap from the environment, read once; an unparsable value is reported by CheckKernelIsa
// and otherwise ignored here.
KernelIsa EnvironmentCap() {
  static const KernelIsa cap = [] {
    const char* v = std::getenv("SLICETRAIN_MAX_CPU_ISA");
    if (!v || !*v) return KernelIsa::kX86_64_v4;
    StatusOr<KernelIsa> isa = ParseKernelIsa(v);
    return isa.ok() ? *isa : KernelIsa::kX86_64_v4;
  }();
  return cap;
}

std::atomic<int> g_limit{static_cast<int>(KernelIsa::kX86_64_v4)};

// The level this translation unit was compiled for (-march), which the whole binary needs.
constexpr int BuildLevel() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
  return 4;
#elif defined(__AVX2__) && defined(__FMA__)
  return 3;
#elif defined(__SSE4_2__) && defined(__POPCNT__)
  return 2;
#else
  return 1;
#endif
}

}  // namespace

KernelIsa ActiveKernelIsa() {
  const int level = std::min({static_cast<int>(CpuKernelIsa()), static_cast<int>(EnvironmentCap()),
                              g_limit.load(std::memory_order_relaxed)});
  return static_cast<KernelIsa>(level);
}

void LimitKernelIsa(std::optional<KernelIsa> max) {
  g_limit.store(static_cast<int>(max.value_or(KernelIsa::kX86_64_v4)), std::memory_order_relaxed);
}

Status CheckKernelIsa() {
  const int need = BuildLevel();
  if (need >= 2 && !__builtin_cpu_supports(need == 4   ? "x86-64-v4"
                                           : need == 3 ? "x86-64-v3"
                                                       : "x86-64-v2"))
    return Unavailable(
        "this slicetrain binary was built for x86-64-v" + std::to_string(need) +
        " (or -march=native on another machine) and this CPU (" +
        (DetectCpu().model.empty() ? std::string("unknown model") : DetectCpu().model) +
        ") lacks it; rebuild with the default -DSLICETRAIN_NATIVE=OFF");
  if (const char* v = std::getenv("SLICETRAIN_MAX_CPU_ISA"); v && *v) {
    StatusOr<KernelIsa> isa = ParseKernelIsa(v);
    if (!isa.ok()) return isa.status();
  }
  return Status::Ok();
}

}  // namespace st::cpu
