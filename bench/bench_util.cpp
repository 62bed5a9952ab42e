#include "bench_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "comm/store/socket.h"
#include "comm/store/tcp_store.h"
#include "core/dtype.h"
#include "kernels/cpu/gemm.h"
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

double MeasureBf16GemmGflops(int n, int reps) {
  std::vector<uint16_t> a(static_cast<size_t>(n) * n, FloatToBF16(0.5f)),
      b(a.size(), FloatToBF16(0.25f));
  std::vector<float> c(a.size());
  auto run = [&] {
    cpu::GemmBf16(cpu::Trans::kNo, cpu::Trans::kYes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                  c.data(), n);
  };
  run();  // warm-up (and the primitive's creation)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

int RunForkedWorkers(int P, const std::function<int(int rank, int P, int port)>& worker) {
  auto port = comm::PickFreePort("127.0.0.1");
  if (!port.ok()) return P;
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(worker(r, P, *port));
    pids.push_back(pid);
  }
  auto server = comm::TcpStoreServer::Start("127.0.0.1", *port, "bench");
  int failures = server.ok() ? 0 : 1;
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
  }
  return failures;
}

}  // namespace st::bench
