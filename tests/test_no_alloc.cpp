// "No allocation inside a step": after a warm-up step, forward + backward must not call the C++
// allocator (activations, scratch and RoPE tables are planned once at construction).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "io/model_loader.h"
#include "model/gemma4.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}

void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace st {
namespace {

TEST(NoAllocation, ForwardBackwardAfterWarmUp) {
  auto m = LoadModel("gemma4-tiny", 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int64_t B = 2, T = 96;
  const int64_t at_start = g_allocations.load();
  Gemma4Engine engine(m->config, B, T);
  ASSERT_GT(g_allocations.load(), at_start) << "the counting operator new is not in effect";
  const AlignedBuffer params = MaterializeParams(*m);
  std::vector<float> grads(params.size(), 0.0f);
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = static_cast<int32_t>(1 + (i * 37) % 1000);
  std::vector<uint8_t> mask(B * T, 1);
  mask[B * T - 1] = 0;
  const Batch batch{ids.data(), mask.data(), ids.data(), B, T};
  for (int step = 0; step < 3; ++step) {
    const int64_t before = g_allocations.load();
    ForwardResult r = engine.Forward(params.data(), batch);
    engine.Backward(params.data(), grads.data(), batch, 1.0f / r.num_valid);
    const int64_t during = g_allocations.load() - before;
    if (step > 0) {
      EXPECT_EQ(during, 0) << "allocations in step " << step;
    }
  }
}

}  // namespace
}  // namespace st
