// DTensor-style placements on one mesh axis: Shard(dim) (split along a tensor dim in torch.chunk
// sizes: ceil(n / P) per rank, the last ranks possibly smaller or empty), Replicate (every rank has
// all of it) and Partial (every rank holds a summand). Redistribute moves between them with the
// matching collective. f32 only; tensors are contiguous row-major. Not autograd.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace st::comm {

struct Placement {
  enum class Kind { kShard, kReplicate, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // kShard: the tensor dim (negative counts from the end)
  static Placement Shard(int dim) { return {Kind::kShard, dim}; }
  static Placement Replicate() { return {Kind::kReplicate, 0}; }
  static Placement Partial() { return {Kind::kPartial, 0}; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::kShard || dim == o.dim);
  }
};
std::string PlacementName(const Placement& p);  // "Shard(1)", "Replicate()", "Partial(sum)"

// [begin, begin + length) of rank r's piece when n elements split over P ranks (torch.chunk).
struct Range {
  int64_t begin = 0, length = 0;
};
Range ShardRange(int64_t n, int P, int r);

// A rank's view of a logical tensor placed on one mesh axis.
struct DTensor {
  Shape global_shape;  // the logical tensor
  Placement placement;
  Shape local_shape;
  std::vector<float> local;  // [local_shape]
};

// Cuts this rank's piece from a full tensor (no communication). Partial: rank 0 holds the values,
// the others zeros, so that the sum is the tensor.
DTensor DistributeTensor(const float* full, const Shape& shape, Placement placement, int rank,
                         int size);

// Moves `t` to placement `to` over `pg` (the mesh axis's group). Shard->Replicate: all_gather;
// Partial->Replicate: all_reduce(sum); Partial->Shard: reduce_scatter; Replicate->Shard: slice;
// Shard(a)->Shard(b): all_gather then slice.
StatusOr<DTensor> Redistribute(const DTensor& t, Placement to, ProcessGroup& pg,
                               const CollectiveOptions& opts = {});

}  // namespace st::comm
