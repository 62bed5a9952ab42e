// Starts local worker processes and supervises them as one group (the role of torchrun's agent):
// prefixes every output line with "(rank R pid=P ip=A)", forwards SIGINT/SIGTERM/SIGHUP, and when
// one worker fails takes the others down (SIGTERM, then SIGKILL after a grace period), so no
// process is left behind. Children also get SIGKILL if the supervisor itself dies
// (PR_SET_PDEATHSIG). RunWorkersWithRestarts adds Ray Train's FailureConfig(max_failures): a group
// that failed in a way a restart may cure is started again; resuming from a checkpoint is the
// workers' part (they see SLICETRAIN_RESTART_ATTEMPT).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace st::launch {

struct WorkerSpec {
  int rank = 0;
  std::string ip;                                        // shown in the output prefix
  std::vector<std::string> argv;                         // argv[0] is the executable path
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing) the parent's
};

// The exit code of a worker whose failure a restart may cure: a peer was lost or did not answer
// in time (BSD's EX_TEMPFAIL). Bad input and other errors exit 1 or 2 and are never retried.
inline constexpr int kExitUnavailable = 75;

struct SupervisorOptions {
  bool prefix_stdout = true;
  bool prefix_stderr = true;
  std::chrono::milliseconds grace{std::chrono::seconds(3)};  // SIGTERM -> SIGKILL
  std::chrono::milliseconds timeout{0};                      // whole group; 0 = none
  // After the first failure, how long the others may take to notice it and exit with their own
  // error line (which names the collective they were in) before they are sent SIGTERM.
  std::chrono::milliseconds drain{std::chrono::seconds(1)};
};

struct SupervisorResult {
  int exit_code = 0;         // 0 when every worker exited 0
  int failed_rank = -1;      // the first worker that failed
  std::string message;       // "worker rank 3 (pid 1234, host 10.0.0.2) exited with code 1: ..."
  bool restartable = false;  // killed by a signal, or exited with kExitUnavailable
  std::string peer_report;   // the first error line of another worker ("rank 0 ...: all_gather #8")
};

// Runs the workers to completion. Output is written to this process's stdout/stderr.
SupervisorResult RunWorkers(const std::vector<WorkerSpec>& workers, const SupervisorOptions& opts);

// RunWorkers, and when the group fails restartably, again, at most max_failures times (0: never).
// Every worker of attempt n gets SLICETRAIN_RESTART_ATTEMPT=n. Before each restart `on_restart`
// is told the attempt about to start and what failed (to print it and where the run resumes).
SupervisorResult RunWorkersWithRestarts(
    const std::vector<WorkerSpec>& workers, const SupervisorOptions& opts, int max_failures,
    const std::function<void(int attempt, const SupervisorResult& failure)>& on_restart);

}  // namespace st::launch
