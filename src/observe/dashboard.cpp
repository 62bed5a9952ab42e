#include "observe/dashboard.h"

#include <httplib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "launch/worker.h"
#include "observe/runs.h"

namespace st::observe {

namespace fs = std::filesystem;

namespace {

constexpr char kPage[] =
#include "observe/assets/dashboard.html.inc"
    ;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SendJson(httplib::Response& res, const nlohmann::json& j, int status = 200) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(j.dump(), "application/json");
}

int64_t IntParam(const httplib::Request& req, const char* name, int64_t fallback) {
  if (!req.has_param(name)) return fallback;
  try {
    return std::stoll(req.get_param_value(name));
  } catch (const std::exception&) {
    return fallback;
  }
}

// The cluster of a finished run, from its cluster.json (no liveness: nothing is running).
nlohmann::json StoredCluster(const RunSummary& run) {
  std::ifstream in(fs::path(run.dir) / "cluster.json");
  nlohmann::json c = nlohmann::json::parse(in, nullptr, false);
  if (c.is_discarded() || !c.is_object()) c = {{"workers", nlohmann::json::array()}};
  const MetricsLog log = ReadMetricsLog(run.dir);
  nlohmann::json workers = nlohmann::json::array();
  std::map<std::string, int> hosts;
  for (nlohmann::json w : c.value("workers", nlohmann::json::array())) {
    const size_t r = w.value("rank", size_t{0});
    if (!log.steps.empty()) {
      const nlohmann::json& last = log.steps.back();
      const auto& ws = last.value("workers", nlohmann::json::array());
      if (r < ws.size()) {
        w["rss_mib"] = ws[r].value("rss_mib", 0.0);
        w["peak_rss_mib"] = ws[r].value("peak_rss_mib", 0.0);
        w["last_step_s"] = ws[r].value("step_s", 0.0);
      }
    }
    w["alive"] = run.status == "running";
    hosts[w.value("hostname", std::string()) + "\n" + w.value("address", std::string())]++;
    workers.push_back(w);
  }
  nlohmann::json host_list = nlohmann::json::array();
  for (const auto& [key, n] : hosts) {
    const size_t nl = key.find('\n');
    host_list.push_back(
        {{"hostname", key.substr(0, nl)}, {"address", key.substr(nl + 1)}, {"workers", n}});
  }
  return {{"run", run.name},
          {"status", run.status},
          {"world_size", c.value("world_size", static_cast<int>(workers.size()))},
          {"device", run.flags.value("accelerator_type", std::string("CPU"))},
          {"topology", run.flags.value("topology", std::string(""))},
          {"hosts", host_list},
          {"workers", workers}};
}

// Equal strings in time that does not depend on where they differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The value of cookie `name` in a Cookie header ("a=1; b=2"), or "".
std::string CookieValue(const std::string& header, const std::string& name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string::npos) end = header.size();
    std::string part = header.substr(pos, end - pos);
    const size_t first = part.find_first_not_of(' ');
    part = first == std::string::npos ? "" : part.substr(first);
    if (part.size() > name.size() && part.compare(0, name.size(), name) == 0 &&
        part[name.size()] == '=')
      return part.substr(name.size() + 1);
    pos = end + 1;
  }
  return "";
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::string DashboardToken(const std::string& host, const std::string& configured) {
  if (!configured.empty()) return configured;
  if (IsLoopbackHost(host)) return "";
  return launch::NewSecret(24);
}

const char* DashboardPage() {
  return kPage;
}

StatusOr<std::unique_ptr<Dashboard>> Dashboard::Start(const DashboardOptions& options,
                                                      const RunRecorder* live) {
  if (!IsLoopbackHost(options.host) && options.token.empty())
    return InvalidArgument(StrCat("a dashboard on ", options.host,
                                  " (beyond loopback) needs a token: set "
                                  "SLICETRAIN_DASHBOARD_TOKEN or let slicetrain generate one"));
  std::unique_ptr<Dashboard> d(new Dashboard());
  d->options_ = options;
  d->live_ = live;
  d->server_ = std::make_unique<httplib::Server>();
  d->server_->set_keep_alive_timeout(5);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second run share
  // (and steal requests from) a port already in use instead of failing to bind.
  d->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  d->Routes();
  if (options.port == 0) {
    d->port_ = d->server_->bind_to_any_port(options.host);
    if (d->port_ <= 0)
      return IoError(StrCat("cannot bind the dashboard to ", options.host, " (any port)"));
  } else {
    if (options.port < 0 || options.port > 65535)
      return InvalidArgument(StrCat("--dashboard-port ", options.port, " is not a port"));
    if (!d->server_->bind_to_port(options.host, options.port))
      return IoError(StrCat("cannot bind the dashboard to ", options.host, ":", options.port,
                            " (in use? pick another with --dashboard-port, 0 = any free)"));
    d->port_ = options.port;
  }
  d->Touch();
  httplib::Server* server = d->server_.get();
  auto returned = std::make_shared<std::atomic<bool>>(false);
  d->thread_ = std::thread([server, returned] {
    server->listen_after_bind();
    *returned = true;
  });
  // Return only once the server loop runs: a stop() before that would be lost (httplib ignores
  // it while not running) and the destructor's join would wait forever.
  while (!server->is_running() && !*returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return d;
}

Dashboard::~Dashboard() {
  stopping_ = true;
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string Dashboard::url() const {
  const std::string host =
      options_.host.empty() || options_.host == "0.0.0.0" ? "127.0.0.1" : options_.host;
  return StrCat("http://", host, ":", port_, "/");
}

std::string Dashboard::login_url() const {
  return options_.token.empty() ? url() : url() + "?token=" + options_.token;
}

bool Dashboard::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (options_.token.empty()) return true;
  // Cookies are per host, not per port: one name per dashboard port.
  const std::string cookie = StrCat("slicetrain_token_", port_);
  if (req.has_param("token") && SameSecret(req.get_param_value("token"), options_.token)) {
    // The page's own later requests (fetch, EventSource) carry the cookie instead.
    res.set_header("Set-Cookie",
                   StrCat(cookie, "=", options_.token, "; Path=/; HttpOnly; SameSite=Strict"));
    return true;
  }
  if (SameSecret(CookieValue(req.get_header_value("Cookie"), cookie), options_.token)) return true;
  const std::string auth = req.get_header_value("Authorization");
  for (const char* scheme : {"Bearer ", "token "})
    if (auth.rfind(scheme, 0) == 0 && SameSecret(auth.substr(std::strlen(scheme)), options_.token))
      return true;
  return false;
}

void Dashboard::Touch() {
  last_request_ms_ = SteadyMs();
}

void Dashboard::WaitUntilIdle(double idle_seconds) const {
  const int64_t idle_ms = static_cast<int64_t>(idle_seconds * 1000);
  while (SteadyMs() - last_request_ms_.load() < idle_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

void Dashboard::Routes() {
  httplib::Server& s = *server_;
  // Every route behind the token, when there is one (beyond loopback).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 403;
    res.set_header("Cache-Control", "no-store");
    res.set_content(
        "403: this slicetrain dashboard needs its token: open the URL with ?token=... that the "
        "run printed, or send 'Authorization: Bearer <token>' (SLICETRAIN_DASHBOARD_TOKEN)\n",
        "text/plain; charset=utf-8");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Which run a request is about: ?run=NAME (a plain name under the storage path), else the live
  // run, else the newest stored run. Null when there is none.
  auto select = [this](const httplib::Request& req, RunSummary* out, bool* is_live) {
    std::string name = req.has_param("run") ? req.get_param_value("run") : "";
    const std::string live_name = live_ && live_->started() ? live_->run_name() : "";
    *is_live = !live_name.empty() && (name.empty() || name == live_name);
    if (*is_live) {
      out->name = live_name;
      return true;
    }
    if (name.find('/') != std::string::npos || name == "." || name == "..") return false;
    if (name.empty()) {
      const auto runs = ScanRuns(options_.storage_path);
      if (runs.empty()) return false;
      *out = runs.front();
      return true;
    }
    std::error_code ec;
    const fs::path dir = fs::path(options_.storage_path) / name;
    if (!fs::is_directory(dir, ec)) return false;
    *out = ReadRun(dir.string());
    return true;
  };

  s.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    Touch();
    res.set_header("Cache-Control", "no-store");
    res.set_content(kPage, "text/html; charset=utf-8");
  });
  s.Get("/api/jobs", [this](const httplib::Request&, httplib::Response& res) {
    Touch();
    nlohmann::json runs = nlohmann::json::array();
    const std::string live_name = live_ && live_->started() ? live_->run_name() : "";
    for (const RunSummary& r : ScanRuns(options_.storage_path)) {
      nlohmann::json j = ToJson(r);
      if (r.name == live_name) j["status"] = live_->status();
      runs.push_back(j);
    }
    SendJson(res, {{"live", live_name.empty() ? nlohmann::json() : nlohmann::json(live_name)},
                   {"storage_path", options_.storage_path},
                   {"runs", runs}});
  });
  s.Get("/api/cluster", [this, select](const httplib::Request& req, httplib::Response& res) {
    Touch();
    RunSummary run;
    bool is_live = false;
    if (!select(req, &run, &is_live)) return SendJson(res, {{"error", "no such run"}}, 404);
    SendJson(res, is_live ? live_->ClusterJson() : StoredCluster(run));
  });
  s.Get("/api/metrics", [this, select](const httplib::Request& req, httplib::Response& res) {
    Touch();
    RunSummary run;
    bool is_live = false;
    if (!select(req, &run, &is_live)) return SendJson(res, {{"error", "no such run"}}, 404);
    const int64_t since = IntParam(req, "since", 0);
    if (is_live) return SendJson(res, live_->MetricsJson(since));
    const MetricsLog log = ReadMetricsLog(run.dir, since);
    SendJson(res, {{"run", run.name},
                   {"status", run.status},
                   {"num_epochs", run.num_epochs},
                   {"steps", log.steps},
                   {"epochs", log.epochs},
                   {"evals", log.evals}});
  });
  s.Get("/events", [this](const httplib::Request& req, httplib::Response& res) {
    Touch();
    if (!live_ || !live_->started() ||
        (req.has_param("run") && req.get_param_value("run") != live_->run_name()))
      return SendJson(res, {{"error", "no live run of that name: events exist for the live run"}},
                      404);
    struct Cursor {
      int64_t step = 0, epoch = 0, eval = 0;
      std::string status;
      uint64_t version = 0;
    };
    auto cur = std::make_shared<Cursor>();
    cur->step = IntParam(req, "since", 0);
    cur->epoch = IntParam(req, "since_epoch", 0);
    cur->eval = IntParam(req, "since_eval", 0);
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [this, cur](size_t, httplib::DataSink& sink) {
          if (stopping_) return false;
          cur->version = live_->WaitForChange(cur->version, 2000);
          if (stopping_) return false;
          Touch();
          const nlohmann::json next = live_->Since(cur->step, cur->epoch, cur->eval);
          std::string out;
          for (const auto& st : next["steps"]) {
            out += "event: step\ndata: " + st.dump() + "\n\n";
            cur->step = st.value("step", cur->step);
          }
          for (const auto& ep : next["epochs"]) {
            out += "event: epoch\ndata: " + ep.dump() + "\n\n";
            cur->epoch = ep.value("epoch", cur->epoch);
          }
          for (const auto& ev : next["evals"]) {
            out += "event: eval\ndata: " + ev.dump() + "\n\n";
            cur->eval = ev.value("step", cur->eval);
          }
          const std::string status = next.value("status", std::string());
          if (status != cur->status) {
            out += "event: status\ndata: " + nlohmann::json({{"status", status}}).dump() + "\n\n";
            cur->status = status;
          }
          if (out.empty()) out = ": keep-alive\n\n";
          if (!sink.write(out.data(), out.size())) return false;
          if (status == "finished" || status == "failed") sink.done();
          return true;
        });
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    Touch();
    std::string text;
    if (live_ && live_->started()) text = live_->Prometheus();
    text +=
        "# HELP slicetrain_stored_run_best_score Best checkpoint score of each run in the "
        "storage path.\n# TYPE slicetrain_stored_run_best_score gauge\n";
    for (const RunSummary& r : ScanRuns(options_.storage_path))
      if (r.has_best)
        text += "slicetrain_stored_run_best_score{run=\"" + PrometheusLabel(r.name) +
                "\",attribute=\"" + PrometheusLabel(r.score_attribute) + "\"} " +
                std::to_string(r.best_score) + "\n";
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace st::observe
