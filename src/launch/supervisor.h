// Starts local worker processes and supervises them as one group (the role of torchrun's agent):
// prefixes every output line with "(rank R pid=P ip=A)", forwards SIGINT/SIGTERM/SIGHUP, and when
// one worker fails takes the others down (SIGTERM, then SIGKILL after a grace period), so no
// process is left behind. Children also get SIGKILL if the supervisor itself dies
// (PR_SET_PDEATHSIG). Not a restart policy: restarting from a checkpoint belongs to the trainer.
#pragma once

#include <chrono>
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

struct SupervisorOptions {
  bool prefix_stdout = true;
  bool prefix_stderr = true;
  std::chrono::milliseconds grace{std::chrono::seconds(3)};  // SIGTERM -> SIGKILL
  std::chrono::milliseconds timeout{0};                      // whole group; 0 = none
};

struct SupervisorResult {
  int exit_code = 0;     // 0 when every worker exited 0
  int failed_rank = -1;  // the first worker that failed
  std::string message;   // "worker rank 3 (pid 1234) exited with code 1"
};

// Runs the workers to completion. Output is written to this process's stdout/stderr.
SupervisorResult RunWorkers(const std::vector<WorkerSpec>& workers, const SupervisorOptions& opts);

}  // namespace st::launch
