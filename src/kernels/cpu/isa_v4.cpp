// The CPU kernels compiled for x86-64-v4: x86-64-v3 plus AVX-512 F, BW, VL, DQ, CD (and the
// hand-written AVX-512 paths). Picked at run time by ops_cpu.cpp; see isa_kernels.h.
#include "kernels/cpu/isa_kernels.h"

#pragma GCC push_options
#pragma GCC target( \
    "popcnt,sse4.2,avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,avx512f,avx512bw,avx512vl,avx512dq,avx512cd")
#define ST_ISA_AVX512 1
// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves
// (_mm512_undefined_*, inside _mm512_reduce_add_ps) as maybe-uninitialized: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The bodies first, then the table of their addresses (which names them as ST_ISA_NS::Op, so
// that a body missing here is a compile error, never a table pointing back at the dispatcher).
#define ST_ISA_NS v4
namespace st::cpu::v4 {
// clang-format off
#include "kernels/cpu/ops_isa.inc"
#include "kernels/cpu/attention_isa.inc"
#include "kernels/cpu/isa_table.inc"
// clang-format on
}  // namespace st::cpu::v4

#pragma GCC diagnostic pop
#pragma GCC pop_options
