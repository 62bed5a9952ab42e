// The CPU kernels compiled for x86-64-v2 (SSE4.2): the baseline the whole binary is built for, so
// no pragma. Picked at run time by ops_cpu.cpp; see isa_kernels.h.
#include "kernels/cpu/isa_kernels.h"

#define ST_ISA_AVX512 0
// gcc 12 reports the AVX-512 intrinsics' deliberately undefined upper halves
// (_mm512_undefined_*, inside _mm512_reduce_add_ps) as maybe-uninitialized: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The bodies first, then the table of their addresses (which names them as ST_ISA_NS::Op, so
// that a body missing here is a compile error, never a table pointing back at the dispatcher).
#define ST_ISA_NS v2
namespace st::cpu::v2 {
// clang-format off
#include "kernels/cpu/ops_isa.inc"
#include "kernels/cpu/attention_isa.inc"
#include "kernels/cpu/isa_table.inc"
// clang-format on
}  // namespace st::cpu::v2

#pragma GCC diagnostic pop
