#include "comm/placement.h"

#include <algorithm>
#include <cstring>

namespace st::comm {

std::string PlacementName(const Placement& p) {
  switch (p.kind) {
    case Placement::Kind::kShard:
      return StrCat("Shard(", p.dim, ")");
    case Placement::Kind::kReplicate:
      return "Replicate()";
    case Placement::Kind::kPartial:
      return "Partial(sum)";
  }
  return "?";
}

Range ShardRange(int64_t n, int P, int r) {
  const int64_t chunk = (n + P - 1) / P;
  const int64_t begin = std::min(n, chunk * r);
  return {begin, std::min(n, begin + chunk) - begin};
}

namespace {

int NormDim(int dim, size_t rank) {
  return dim < 0 ? dim + static_cast<int>(rank) : dim;
}

// The tensor seen as [outer, n, inner] around dim d.
struct Split3 {
  int64_t outer = 1, n = 1, inner = 1;
};
Split3 Around(const Shape& s, int d) {
  Split3 v;
  for (int i = 0; i < d; ++i) v.outer *= s[i];
  v.n = s[d];
  for (size_t i = d + 1; i < s.size(); ++i) v.inner *= s[i];
  return v;
}

// Copies rows [r.begin, r.begin + r.length) of dim d of `full` (shape s) into dst (contiguous).
void SliceDim(const float* full, const Shape& s, int d, Range r, float* dst) {
  const Split3 v = Around(s, d);
  if (r.length * v.inner == 0) return;  // an empty piece (its buffer may be null: memcpy's UB)
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + o * r.length * v.inner, full + (o * v.n + r.begin) * v.inner,
                sizeof(float) * r.length * v.inner);
}

// The inverse: writes a piece back into its place in `full`.
void PlaceDim(const float* piece, const Shape& s, int d, Range r, float* full) {
  const Split3 v = Around(s, d);
  if (r.length * v.inner == 0) return;
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(full + (o * v.n + r.begin) * v.inner, piece + o * r.length * v.inner,
                sizeof(float) * r.length * v.inner);
}

Shape LocalShape(const Shape& global, Placement p, int rank, int size) {
  Shape s = global;
  if (p.kind == Placement::Kind::kShard) {
    const int d = NormDim(p.dim, global.size());
    s[d] = ShardRange(global[d], size, rank).length;
  }
  return s;
}

}  // namespace

DTensor DistributeTensor(const float* full, const Shape& shape, Placement placement, int rank,
                         int size) {
  DTensor t;
  t.global_shape = shape;
  t.placement = placement;
  if (placement.kind == Placement::Kind::kShard)
    t.placement.dim = NormDim(placement.dim, shape.size());
  t.local_shape = LocalShape(shape, t.placement, rank, size);
  t.local.assign(static_cast<size_t>(Numel(t.local_shape)), 0.f);
  const int64_t n = Numel(shape);
  if (placement.kind == Placement::Kind::kShard) {
    const int d = t.placement.dim;
    SliceDim(full, shape, d, ShardRange(shape[d], size, rank), t.local.data());
  } else if (placement.kind == Placement::Kind::kReplicate || rank == 0) {
    std::copy(full, full + n, t.local.begin());
  }
  return t;
}

StatusOr<DTensor> Redistribute(const DTensor& t, Placement to, ProcessGroup& pg,
                               const CollectiveOptions& opts) {
  const int P = pg.size(), r = pg.rank();
  const Shape& g = t.global_shape;
  if (to.kind == Placement::Kind::kShard) {
    to.dim = NormDim(to.dim, g.size());
    if (to.dim < 0 || to.dim >= static_cast<int>(g.size()))
      return InvalidArgument(StrCat("cannot shard a ", g.size(), "-d tensor on dim ", to.dim));
  }
  if (t.placement == to) return t;
  using K = Placement::Kind;
  const K from = t.placement.kind;
  if (from == K::kShard) {
    // All-gather the shards into a full tensor (padded blocks, since the pieces may differ).
    const int d = t.placement.dim;
    const Split3 v = Around(g, d);
    const int64_t block = v.outer * ShardRange(v.n, P, 0).length * v.inner;  // the largest piece
    std::vector<float> mine(block, 0.f), all(block * P);
    std::copy(t.local.begin(), t.local.end(), mine.begin());
    ST_RETURN_IF_ERROR(pg.AllGather(mine.data(), all.data(), block, DType::kF32, opts));
    std::vector<float> full(static_cast<size_t>(Numel(g)));
    for (int q = 0; q < P; ++q)
      PlaceDim(all.data() + q * block, g, d, ShardRange(v.n, P, q), full.data());
    DTensor rep = DistributeTensor(full.data(), g, Placement::Replicate(), r, P);
    return to.kind == K::kReplicate ? rep : Redistribute(rep, to, pg, opts);
  }
  if (from == K::kReplicate) {
    if (to.kind == K::kShard) return DistributeTensor(t.local.data(), g, to, r, P);
    // Replicate -> Partial: rank 0 keeps the values.
    return DistributeTensor(t.local.data(), g, to, r, P);
  }
  // from Partial.
  if (to.kind == K::kReplicate) {
    DTensor out = t;
    out.placement = to;
    ST_RETURN_IF_ERROR(pg.AllReduce(out.local.data(), Numel(g), DType::kF32, ReduceOp::kSum, opts));
    return out;
  }
  // Partial -> Shard(d): pack the P pieces as equal padded blocks, reduce-scatter, unpack.
  const int d = to.dim;
  const Split3 v = Around(g, d);
  const int64_t block = v.outer * ShardRange(v.n, P, 0).length * v.inner;
  std::vector<float> packed(block * P, 0.f), mine(block);
  for (int q = 0; q < P; ++q)
    SliceDim(t.local.data(), g, d, ShardRange(v.n, P, q), packed.data() + q * block);
  ST_RETURN_IF_ERROR(
      pg.ReduceScatter(packed.data(), mine.data(), block, DType::kF32, ReduceOp::kSum, opts));
  DTensor out;
  out.global_shape = g;
  out.placement = to;
  out.local_shape = LocalShape(g, to, r, P);
  out.local.assign(mine.begin(), mine.begin() + Numel(out.local_shape));
  return out;
}

}  // namespace st::comm
