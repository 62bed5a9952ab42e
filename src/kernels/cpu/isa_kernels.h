// Runtime ISA dispatch of our hand-written CPU kernels (internal to kernels/cpu/).
//
// ops_isa.inc and attention_isa.inc are compiled three times, by isa_v2.cpp, isa_v3.cpp and
// isa_v4.cpp, each inside its own namespace (st::cpu::v2, v3, v4) and under a
// `#pragma GCC target` for its x86-64 level; ops_cpu.cpp forwards every op of ops_cpu.h to the
// table of the level ActiveKernelIsa() names. The rest of the binary is built for the baseline
// (x86-64-v2), so one build runs everywhere and still uses AVX-512 where the CPU has it.
//
// Why a pragma and not per-file -march flags: code the bodies use from headers (std::vector's
// members, FastExp, AttnMask) is emitted as weak symbols; the linker keeps one copy per symbol,
// and a copy compiled with -mavx512f could then be the one the v2 kernels call on a CPU without
// AVX-512. Functions defined before the pragma keep the baseline target (their out-of-line
// copies stay safe everywhere); GCC still inlines them into the variant's code and vectorises
// them there. The pragma names ISA extensions only, never arch=, because GCC refuses to inline a
// function whose arch differs from its caller's.
#pragma once

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attn_mask.h"
#include "kernels/cpu/fastmath.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/gelu.h"

namespace st::cpu {

// One level's kernels; the members are the ops of ops_cpu.h compiled for that level.
struct KernelTable {
  decltype(&EmbeddingForward) embedding_forward;
  decltype(&EmbeddingBackward) embedding_backward;
  decltype(&RmsNormForward) rms_norm_forward;
  decltype(&RmsNormBackward) rms_norm_backward;
  decltype(&Rope) rope;
  decltype(&AttentionForward) attention_forward;
  decltype(&AttentionBackward) attention_backward;
  decltype(&GeluMulForward) gelu_mul_forward;
  decltype(&GeluMulBackward) gelu_mul_backward;
  decltype(&SoftcapForward) softcap_forward;
  decltype(&CrossEntropyForward) cross_entropy_forward;
  decltype(&CrossEntropySoftcapBackward) cross_entropy_softcap_backward;
  decltype(&Add) add;
  decltype(&Scale) scale;
  decltype(&ReserveAttentionScratch) reserve_attention_scratch;
  decltype(&AttentionWorkspaceBytes) attention_workspace_bytes;
  decltype(&LinearForwardBf16) linear_forward_bf16;
  decltype(&DecodeAttention) decode_attention;
  void (*linear_forward_few_f32)(const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*linear_forward_few_bf16)(const float*, const uint16_t*, float*, int64_t, int64_t, int64_t);
};

namespace v2 {
const KernelTable& Table();
}
namespace v3 {
const KernelTable& Table();
}
namespace v4 {
const KernelTable& Table();
}

}  // namespace st::cpu
