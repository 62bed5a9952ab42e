// Fast CPU kernels: GEMMs through OpenBLAS, elementwise and attention loops threaded with OpenMP
// (one thread team shared with OpenBLAS's OpenMP build, so the two never oversubscribe).
#pragma once

#include <cstdint>

#include "kernels/attn_mask.h"

namespace st::cpu {
#include "kernels/ops_decl.inc"

// Threads used by OpenMP regions and OpenBLAS for this process.
void SetNumThreads(int n);
int NumThreads();
}  // namespace st::cpu
