// Naive fp32 reference kernels: obviously correct loops, double accumulation where cheap.
// The oracle for the fast kernels and the finite-difference tests; never used in training.
#pragma once

#include <cstdint>

#include "kernels/attn_mask.h"

namespace st::ref {
#include "kernels/ops_decl.inc"
}  // namespace st::ref
