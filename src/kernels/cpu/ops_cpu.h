// Fast CPU kernels: GEMMs through OpenBLAS, elementwise and attention loops threaded with OpenMP
// (one thread team shared with OpenBLAS's OpenMP build, so the two never oversubscribe).
#pragma once

#include <cstdint>

#include "kernels/attn_mask.h"

namespace st::cpu {
#include "kernels/ops_decl.inc"

// Grows every OpenMP thread's attention-backward scratch ([64, T] floats) now, so that no later
// step allocates whichever thread picks up which task. The engine calls it at construction.
void ReserveAttentionScratch(int64_t T);

// Threads used by OpenMP regions and OpenBLAS for this process.
void SetNumThreads(int n);
int NumThreads();
}  // namespace st::cpu
