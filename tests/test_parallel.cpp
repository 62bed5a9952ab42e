// DeviceMesh, placements and tensor-parallel linears with threads as ranks.
#include <gtest/gtest.h>

#include <thread>

#include "comm/device_mesh.h"
#include "comm/placement.h"
#include "core/rng.h"
#include "parallel/ffn_parity.h"
#include "parallel/tensor_parallel.h"

namespace st {
namespace {

using comm::DTensor;
using comm::Placement;

template <typename F>
void RunRanks(int world, F fn) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&, r] { fn(store, r); });
  for (auto& t : ts) t.join();
}

std::vector<float> Iota(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST(Placement, ShardRangeIsTorchChunk) {
  // torch.chunk(10, 4) -> 3, 3, 3, 1; torch.chunk(5, 4) -> 2, 2, 1, (empty)
  EXPECT_EQ(comm::ShardRange(10, 4, 3).length, 1);
  EXPECT_EQ(comm::ShardRange(10, 4, 2).begin, 6);
  EXPECT_EQ(comm::ShardRange(5, 4, 3).length, 0);
  EXPECT_EQ(comm::ShardRange(0, 3, 1).length, 0);
}

TEST(Placement, RedistributeRoundTrips) {
  for (int P : {1, 3, 4}) {
    const Shape shape = {5, 7};  // not divisible by 3 or 4
    const std::vector<float> full = Iota(35);
    RunRanks(P, [&](std::shared_ptr<comm::MemoryStore> store, int r) {
      comm::GroupOptions o;
      o.name = "p";
      auto pg = comm::CreateProcessGroup(store, r, P, o);
      ASSERT_TRUE(pg.ok());
      for (int d : {0, 1, -1}) {
        DTensor s = comm::DistributeTensor(full.data(), shape, Placement::Shard(d), r, P);
        auto rep = comm::Redistribute(s, Placement::Replicate(), **pg);
        ASSERT_TRUE(rep.ok()) << rep.status().message();
        EXPECT_EQ(rep->local, full);
        // Partial -> Shard(d) -> Replicate: each rank holds full, so the result is P * full.
        DTensor part = comm::DistributeTensor(full.data(), shape, Placement::Replicate(), r, P);
        part.placement = Placement::Partial();
        auto sh = comm::Redistribute(part, Placement::Shard(d), **pg);
        ASSERT_TRUE(sh.ok()) << sh.status().message();
        DTensor want = comm::DistributeTensor(full.data(), shape, Placement::Shard(d), r, P);
        ASSERT_EQ(sh->local.size(), want.local.size());
        for (size_t i = 0; i < want.local.size(); ++i) EXPECT_EQ(sh->local[i], P * want.local[i]);
        // Shard(0) -> Shard(1).
        auto s1 = comm::Redistribute(
            comm::DistributeTensor(full.data(), shape, Placement::Shard(0), r, P),
            Placement::Shard(1), **pg);
        ASSERT_TRUE(s1.ok());
        EXPECT_EQ(s1->local,
                  comm::DistributeTensor(full.data(), shape, Placement::Shard(1), r, P).local);
      }
      // Replicate -> Partial -> Replicate is the identity.
      DTensor rep = comm::DistributeTensor(full.data(), shape, Placement::Replicate(), r, P);
      auto p = comm::Redistribute(rep, Placement::Partial(), **pg);
      auto back = comm::Redistribute(*p, Placement::Replicate(), **pg);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(back->local, full);
    });
  }
}

TEST(DeviceMesh, TwoDimensionalAxesGroupTheRightRanks) {
  // 2 x 3 mesh ("dp", "tp"): the tp group of rank r is its row, the dp group its column.
  RunRanks(6, [&](std::shared_ptr<comm::MemoryStore> store, int r) {
    auto m = comm::DeviceMesh::Create(store, r, 6, {2, 3}, {"dp", "tp"}, {});
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->axis("tp"), 1);
    EXPECT_EQ(m->coordinate(0), r / 3);
    EXPECT_EQ(m->coordinate(1), r % 3);
    float v = static_cast<float>(r);
    ASSERT_TRUE(m->group(1).AllReduce(&v, 1, DType::kF32, comm::ReduceOp::kSum).ok());
    const int row = r / 3;
    EXPECT_EQ(v, static_cast<float>(9 * row + 3));  // sum of the row's ranks
    float w = static_cast<float>(r);
    ASSERT_TRUE(m->group(0).AllReduce(&w, 1, DType::kF32, comm::ReduceOp::kSum).ok());
    EXPECT_EQ(w, static_cast<float>(2 * (r % 3) + 3));  // column: c + (c + 3)
  });
  EXPECT_FALSE(
      comm::DeviceMesh::Create(std::make_shared<comm::MemoryStore>(), 0, 6, {4}, {"x"}, {}).ok());
}

TEST(TensorParallel, ColwiseThenRowwiseMatchesDense) {
  // Non-divisible widths: F = 10 over P = 4 (3, 3, 3, 1).
  const int64_t N = 3, d = 5, F = 10;
  Rng rng(7);
  std::vector<float> x(N * d), w1(F * d), w2(d * F), ref(N * d, 0.f), h(N * F);
  for (auto* v : {&x, &w1, &w2})
    for (auto& e : *v) e = static_cast<float>(rng.Normal());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) s += x[n * d + k] * w1[f * d + k];
      h[n * F + f] = static_cast<float>(s);
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < d; ++o) {
      double s = 0;
      for (int64_t f = 0; f < F; ++f) s += h[n * F + f] * w2[o * F + f];
      ref[n * d + o] = static_cast<float>(s);
    }
  for (int P : {1, 2, 4, 7}) {
    RunRanks(P, [&](std::shared_ptr<comm::MemoryStore> store, int r) {
      auto pg = comm::CreateProcessGroup(store, r, P, {});
      ASSERT_TRUE(pg.ok());
      parallel::ColwiseLinear l1(w1.data(), F, d, **pg);
      parallel::RowwiseLinear l2(w2.data(), d, F, **pg);
      EXPECT_EQ(l1.out_local(), comm::ShardRange(F, P, r).length);
      std::vector<float> hl(N * l1.out_local()), y(N * d);
      ASSERT_TRUE(l1.Forward(x.data(), N, hl.data()).ok());
      ASSERT_TRUE(l2.Forward(hl.data(), N, y.data(), **pg).ok());
      for (int64_t i = 0; i < N * d; ++i) EXPECT_NEAR(y[i], ref[i], 1e-4) << "P=" << P;
    });
  }
}

TEST(TensorParallel, FeedForwardParityOverWorldSizes) {
  for (int P : {1, 3, 16}) {
    RunRanks(P, [&](std::shared_ptr<comm::MemoryStore> store, int r) {
      auto pg = comm::CreateProcessGroup(store, r, P, {});
      ASSERT_TRUE(pg.ok());
      parallel::FfnParityOptions o;
      o.batch = 8;
      o.hidden = 24;
      auto diff = parallel::FeedForwardTpParity(**pg, o);
      ASSERT_TRUE(diff.ok()) << diff.status().message();
      EXPECT_LT(*diff, 1e-5) << "P=" << P;
    });
  }
}

}  // namespace
}  // namespace st
