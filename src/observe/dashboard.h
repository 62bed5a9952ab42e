// The dashboard: an HTTP server (cpp-httplib, on its own threads) with three tabs like Ray's
// dashboard (Jobs, Cluster, Metrics) as one embedded HTML page, JSON endpoints, server-sent events
// and Prometheus text. Served by rank 0 during `slicetrain finetune` (live run + the storage
// path's other runs) and by `slicetrain dashboard` (storage path only, finished runs).
// Endpoints and their JSON are in docs/observe.md. Read-only: nothing here changes a run.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "observe/recorder.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace st::observe {

struct DashboardOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8265;                 // 0: a free port chosen by the system
  std::string storage_path;        // where runs are listed from
  // Required of every request when not empty (as Jupyter's token): `?token=` (which also sets a
  // cookie for the page's later requests), the cookie, or `Authorization: Bearer|token <token>`.
  // Start refuses a host beyond loopback without one.
  std::string token;
};

// True for an address only this machine can reach (127.0.0.0/8, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

// The token of a dashboard on `host`: `configured` (SLICETRAIN_DASHBOARD_TOKEN) when set, else a
// fresh random one beyond loopback, else none.
std::string DashboardToken(const std::string& host, const std::string& configured);

class Dashboard {
 public:
  // Binds and starts serving; `live` (may be null) is the run in progress. An error when the
  // address cannot be bound (port busy, bad host).
  static StatusOr<std::unique_ptr<Dashboard>> Start(const DashboardOptions& options,
                                                    const RunRecorder* live);
  ~Dashboard();  // stops serving and joins the server thread
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const { return port_; }
  // http://host:port/ (an unspecified host shows as 127.0.0.1), without the token: what is
  // recorded in run.json.
  std::string url() const;
  // url() with ?token=... when a token is required: what the user opens (printed once).
  std::string login_url() const;
  // Blocks until no request has arrived for `idle_seconds` (an open page's event stream counts
  // as a request every few seconds).
  void WaitUntilIdle(double idle_seconds) const;

 private:
  Dashboard() = default;
  void Routes();
  void Touch();
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;

  DashboardOptions options_;
  const RunRecorder* live_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> last_request_ms_{0};  // steady clock
};

// The page (HTML with its CSS and JavaScript inline).
const char* DashboardPage();

}  // namespace st::observe
