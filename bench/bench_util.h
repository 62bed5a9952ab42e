// Shared by the benchmarks: the machine's measured sgemm peak, printed beside every model figure.
#pragma once

namespace st::bench {

// Best-of-`reps` GFLOP/s of a square fp32 GEMM (C = A B^T, n x n x n) on the current thread count.
double MeasureSgemmGflops(int n = 2048, int reps = 5);

}  // namespace st::bench
