// Shared by the benchmarks: the machine's measured sgemm peak, printed beside every model figure,
// and multi-process runs of workers on this host.
#pragma once

#include <functional>

namespace st::bench {

// Best-of-`reps` GFLOP/s of a square fp32 GEMM (C = A B^T, n x n x n) on the current thread count.
double MeasureSgemmGflops(int n = 2048, int reps = 5);
// The same for the bf16 GEMM (operands already bf16, fp32 output; oneDNN), the peak of
// --precision bf16.
double MeasureBf16GemmGflops(int n = 2048, int reps = 5);

// Runs worker(rank, P, port) in P forked processes that meet through a TCP store on 127.0.0.1:port
// (served by this process); returns how many of them failed (non-zero exit or a signal).
int RunForkedWorkers(int P, const std::function<int(int rank, int P, int port)>& worker);

}  // namespace st::bench
