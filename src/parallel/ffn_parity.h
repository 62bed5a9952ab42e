// The `collectives` job's tensor-parallel check (the seed's FeedForward): out = x + w2(silu(w1 x)),
// w1 [4d, d] ColwiseParallel, w2 [d, 4d] RowwiseParallel, no bias, same seed on every rank,
// compared with a single-device reference computed on every rank.
#pragma once

#include <cstdint>

#include "comm/process_group.h"

namespace st::parallel {

struct FfnParityOptions {
  int64_t batch = 64;    // B
  int64_t hidden = 128;  // d; the MLP width is F = 4d
  uint64_t seed = 42;
  comm::CollectiveOptions collective;
};

// Returns max |tp - reference| over [B, d]; every rank of `tp_axis` calls it.
StatusOr<double> FeedForwardTpParity(comm::ProcessGroup& tp_axis, const FfnParityOptions& opts);

}  // namespace st::parallel
