#include "parallel/tensor_parallel.h"

#include <algorithm>

#include "kernels/cpu/ops_cpu.h"

namespace st::parallel {

ColwiseLinear::ColwiseLinear(const float* w, int64_t out, int64_t in,
                             const comm::ProcessGroup& axis)
    : in_(in), rows_(comm::ShardRange(out, axis.size(), axis.rank())) {
  w_.assign(w + rows_.begin * in, w + (rows_.begin + rows_.length) * in);
}

Status ColwiseLinear::Forward(const float* x, int64_t N, float* y) const {
  if (rows_.length > 0) cpu::LinearForward(x, w_.data(), y, N, in_, rows_.length, 1.0f, false);
  return Status::Ok();
}

RowwiseLinear::RowwiseLinear(const float* w, int64_t out, int64_t in,
                             const comm::ProcessGroup& axis)
    : out_(out), cols_(comm::ShardRange(in, axis.size(), axis.rank())) {
  w_.resize(static_cast<size_t>(out * cols_.length));
  for (int64_t o = 0; o < out; ++o)
    std::copy(w + o * in + cols_.begin, w + o * in + cols_.begin + cols_.length,
              w_.begin() + o * cols_.length);
}

Status RowwiseLinear::Forward(const float* x, int64_t N, float* y, comm::ProcessGroup& axis,
                              const comm::CollectiveOptions& opts) const {
  // Partial(sum) output on every rank, then Partial -> Replicate.
  if (cols_.length > 0)
    cpu::LinearForward(x, w_.data(), y, N, cols_.length, out_, 1.0f, false);
  else
    std::fill(y, y + N * out_, 0.f);
  return axis.AllReduce(y, N * out_, DType::kF32, comm::ReduceOp::kSum, opts);
}

}  // namespace st::parallel
