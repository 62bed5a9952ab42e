// Tensor parallelism for linear layers (PyTorch's ColwiseParallel / RowwiseParallel with their
// default layouts) over one mesh axis. Linear weights are in PyTorch layout W [out, in], y = x W^T.
//   ColwiseParallel: W sharded on out (Shard(0)); input Replicate [N, in]; output Shard(-1),
//                    returned as the local tensor [N, out_local] (use_local_output=True).
//   RowwiseParallel: W sharded on in (Shard(1)); input Shard(-1) [N, in_local]; output Replicate
//                    [N, out]: the partial products are summed with one all_reduce.
// Forward only (the `collectives` job's parity check); backward comes with training.
#pragma once

#include <vector>

#include "comm/placement.h"
#include "comm/process_group.h"

namespace st::parallel {

class ColwiseLinear {
 public:
  // Keeps this rank's rows of the full weight w [out, in].
  ColwiseLinear(const float* w, int64_t out, int64_t in, const comm::ProcessGroup& axis);
  int64_t out_local() const { return rows_.length; }
  int64_t out_begin() const { return rows_.begin; }
  // x [N, in] replicated -> y [N, out_local] (this rank's columns of the output).
  Status Forward(const float* x, int64_t N, float* y) const;
  const std::vector<float>& weight() const { return w_; }  // [out_local, in]

 private:
  int64_t in_ = 0;
  comm::Range rows_;
  std::vector<float> w_;
};

class RowwiseLinear {
 public:
  // Keeps this rank's columns of the full weight w [out, in].
  RowwiseLinear(const float* w, int64_t out, int64_t in, const comm::ProcessGroup& axis);
  int64_t in_local() const { return cols_.length; }
  // x [N, in_local] sharded on the last dim -> y [N, out] replicated (one all_reduce over `axis`).
  Status Forward(const float* x, int64_t N, float* y, comm::ProcessGroup& axis,
                 const comm::CollectiveOptions& opts = {}) const;

 private:
  int64_t out_ = 0;
  comm::Range cols_;
  std::vector<float> w_;  // [out, in_local]
};

}  // namespace st::parallel
