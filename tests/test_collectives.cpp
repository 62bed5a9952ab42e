// Gloo process groups with threads as ranks: world sizes 1..16 (odd and prime included), element
// counts 0, 1, non-divisible and large, inputs whose exact result is known (small integers, so
// every summation order gives the same float).
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "core/dtype.h"
#include "dist/gloo_process_group.h"
#include "dist/store.h"

namespace st::dist {
namespace {

using std::chrono::milliseconds;

// Runs fn(pg) on `world` threads, each a rank of one Gloo group on a shared MemoryStore.
void RunRanks(int world, const std::function<void(ProcessGroup&)>& fn,
              const std::string& name = "world") {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      GlooOptions o;
      o.name = name;
      o.connect_timeout = milliseconds(30000);
      auto pg = CreateGlooProcessGroup(store, r, world, o);
      ASSERT_TRUE(pg.ok()) << pg.status().message();
      fn(**pg);
    });
  for (auto& t : ts) t.join();
}

// Rank r's value at index i: a small integer, so sums are exact in f32 and bf16-representable.
float Val(int r, int64_t i) {
  return static_cast<float>((r + 1) * ((i % 7) + 1));
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, AllReduceAllGatherReduceScatterBroadcast) {
  const int P = GetParam();
  const std::vector<int64_t> counts = {0, 1, 13, 1000003 / (P * 4) * 4 + 3};
  RunRanks(P, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    const int64_t tri = static_cast<int64_t>(P) * (P + 1) / 2;  // sum of (r+1)
    for (int64_t n : counts) {
      SCOPED_TRACE(::testing::Message() << "P=" << P << " n=" << n << " rank=" << r);
      // all_reduce, four ops.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> buf(n);
        for (int64_t i = 0; i < n; ++i) buf[i] = Val(r, i);
        ASSERT_TRUE(pg.AllReduce(buf.data(), n, DType::kF32, op).ok());
        for (int64_t i = 0; i < n; ++i) {
          const float k = static_cast<float>((i % 7) + 1);
          const float want = op == ReduceOp::kSum   ? k * tri
                             : op == ReduceOp::kAvg ? k * tri / P
                             : op == ReduceOp::kMax ? k * P
                                                    : k;
          ASSERT_NEAR(buf[i], want, op == ReduceOp::kAvg ? 1e-4 * want : 0) << ReduceOpName(op);
        }
      }
      // all_gather f32.
      std::vector<float> mine(n), all(n * P, -1.f);
      for (int64_t i = 0; i < n; ++i) mine[i] = Val(r, i);
      ASSERT_TRUE(pg.AllGather(mine.data(), all.data(), n, DType::kF32).ok());
      for (int q = 0; q < P; ++q)
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(all[q * n + i], Val(q, i));
      // reduce_scatter f32, sum and avg: block q of rank r holds Val(r, q*n+i).
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        std::vector<float> in(n * P), out(n, -1.f);
        for (int64_t i = 0; i < n * P; ++i) in[i] = Val(r, i);
        ASSERT_TRUE(pg.ReduceScatter(in.data(), out.data(), n, DType::kF32, op).ok());
        for (int64_t i = 0; i < n; ++i) {
          const float k = static_cast<float>(((r * n + i) % 7) + 1);
          const float want = op == ReduceOp::kSum   ? k * tri
                             : op == ReduceOp::kAvg ? k * tri / P
                                                    : k * P;
          ASSERT_NEAR(out[i], want, 1e-4 * want) << ReduceOpName(op);
        }
      }
      // broadcast from the last rank.
      std::vector<float> b(n);
      for (int64_t i = 0; i < n; ++i) b[i] = Val(r, i);
      ASSERT_TRUE(pg.Broadcast(b.data(), n, DType::kF32, P - 1).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], Val(P - 1, i));
    }
    ASSERT_TRUE(pg.Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSize, ::testing::Values(1, 2, 3, 4, 5, 7, 8, 11, 13, 16));

TEST(Collectives, BF16AllGatherAndAllReduce) {
  const int P = 6;
  const int64_t n = 1001;
  RunRanks(P, [&](ProcessGroup& pg) {
    std::vector<uint16_t> mine(n), all(n * P);
    for (int64_t i = 0; i < n; ++i) mine[i] = FloatToBF16(Val(pg.rank(), i));
    ASSERT_TRUE(pg.AllGather(mine.data(), all.data(), n, DType::kBF16).ok());
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(BF16ToFloat(all[q * n + i]), Val(q, i));
    ASSERT_TRUE(pg.AllReduce(mine.data(), n, DType::kBF16, ReduceOp::kSum).ok());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(BF16ToFloat(mine[i]), ((i % 7) + 1) * 21.0f);
    std::vector<uint16_t> b(n, FloatToBF16(static_cast<float>(pg.rank())));
    ASSERT_TRUE(pg.Broadcast(b.data(), n, DType::kBF16, 2).ok());
    EXPECT_EQ(BF16ToFloat(b[n - 1]), 2.0f);
  });
}

TEST(Collectives, InPlaceAllGather) {
  const int P = 5;
  const int64_t n = 333;
  RunRanks(P, [&](ProcessGroup& pg) {
    std::vector<float> flat(n * P, -1.f);
    float* mine = flat.data() + pg.rank() * n;
    for (int64_t i = 0; i < n; ++i) mine[i] = Val(pg.rank(), i);
    ASSERT_TRUE(pg.AllGather(mine, flat.data(), n, DType::kF32).ok());
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(flat[q * n + i], Val(q, i));
  });
}

TEST(Collectives, SequenceNumbersRingBufferAndCommThread) {
  RunRanks(3, [&](ProcessGroup& pg) {
    float x = 1.f;
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kMax).ok());
    EXPECT_EQ(pg.seq(), 40u);
    const std::string ring = pg.RecentCollectives();
    EXPECT_NE(ring.find("#40 all_reduce(max)"), std::string::npos) << ring;
    EXPECT_EQ(ring.find("#8 "), std::string::npos) << "ring keeps only the last 32";
    CommThread comm;
    std::vector<float> in(4, 1.f), out(12);
    auto f = comm.Submit([&] { return pg.AllGather(in.data(), out.data(), 4, DType::kF32); });
    ASSERT_TRUE(f.get().ok());
    EXPECT_EQ(out[11], 1.f);
  });
}

TEST(Collectives, TimeoutNamesOpAndMissingRanks) {
  // Rank 2 of 4 never calls the second all_reduce: the others time out naming it.
  RunRanks(4, [&](ProcessGroup& pg) {
    float x = 1.f;
    ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).ok());
    if (pg.rank() == 2) {
      std::this_thread::sleep_for(milliseconds(3000));
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    Status st = pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {milliseconds(800)});
    ASSERT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_NE(st.message().find("all_reduce(sum) #2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("ranks not seen at #2: 2 (last seen at #1)"), std::string::npos)
        << st.message();
    // The group is now broken: later calls fail at once.
    EXPECT_FALSE(pg.Barrier({milliseconds(100)}).ok());
  });
}

}  // namespace
}  // namespace st::dist
