#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/cpu/ops_cpu.h"

namespace st::bench {

double MeasureSgemmGflops(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  cpu::LinearForward(a.data(), b.data(), c.data(), n, n, n, 1.0f, false);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::LinearForward(a.data(), b.data(), c.data(), n, n, n, 1.0f, false);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

}  // namespace st::bench
