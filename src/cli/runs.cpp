// `slicetrain runs`: the runs of a storage path and their checkpoints as a table (or JSON), and
// `slicetrain dashboard`: the dashboard's pages for those runs when no run is in progress.
#include "observe/runs.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "launch/cluster_env.h"
#include "observe/dashboard.h"

namespace st::cli {

namespace {

std::string StoragePath(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("STORAGE_PATH");
  return env && *env ? env : "runs";
}

// Serves until SIGINT or SIGTERM: both are blocked before the server's threads start (they
// inherit the mask) and taken here with sigwait, so no handler and no global are needed.
Status ServeStored(const std::string& storage, const std::string& host, int port) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  observe::DashboardOptions o;
  o.host = host;
  o.port = port;
  o.storage_path = storage;
  o.token =
      observe::DashboardToken(host, launch::ReadProcessEnvironment()["SLICETRAIN_DASHBOARD_TOKEN"]);
  ST_ASSIGN_OR_RETURN(auto dash, observe::Dashboard::Start(o, nullptr));
  std::printf("Dashboard: %s (runs in %s; Ctrl-C to stop)\n", dash->login_url().c_str(),
              storage.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  dash.reset();
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  return Status::Ok();
}

}  // namespace

void RegisterRunsCommand(CLI::App& app, Context& ctx) {
  struct Args {
    std::string storage;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("runs", "List the runs of a storage path and their checkpoints");
  cmd->add_option("--storage-path", a->storage,
                  "Where runs are (default: $STORAGE_PATH, else ./runs)");
  cmd->add_flag("--json", a->json, "One JSON document instead of the table");
  cmd->callback([&ctx, a] {
    const std::string storage = StoragePath(a->storage);
    const auto runs = observe::ScanRuns(storage);
    if (a->json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& r : runs) j.push_back(observe::ToJson(r));
      std::printf("%s\n", nlohmann::json({{"storage_path", storage}, {"runs", j}}).dump(2).c_str());
    } else if (runs.empty()) {
      std::printf("No runs in %s\n", storage.c_str());
    } else {
      std::printf("%s", observe::RunsTable(runs).c_str());
    }
    ctx.exit_code = 0;
  });
}

void RegisterDashboardCommand(CLI::App& app, Context& ctx) {
  struct Args {
    std::string storage, host = "127.0.0.1";
    int port = 8265;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "dashboard", "Serve the dashboard (Jobs, Cluster, Metrics) for the runs of a storage path");
  cmd->add_option("--storage-path", a->storage,
                  "Where runs are (default: $STORAGE_PATH, else ./runs)");
  cmd->add_option("--host", a->host, "Address to bind (loopback by default)")
      ->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0 = any free port)")->capture_default_str();
  cmd->callback([&ctx, a] {
    Status st = ServeStored(StoragePath(a->storage), a->host, a->port);
    if (!st.ok()) ctx.exit_code = ReportError("dashboard", st);
  });
}

}  // namespace st::cli
