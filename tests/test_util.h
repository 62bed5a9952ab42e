// Helpers shared by the tests: random buffers and error metrics; running the slicetrain binary,
// reading a file, finding a run's newest checkpoint.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/rng.h"

namespace st::test {

inline std::vector<float> RandomVec(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal()) * scale;
  return v;
}

// max |a - b| / max(max |b|, tiny): error relative to the tensor's scale.
inline double RelError(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}
inline double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  return RelError(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())));
}

inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// The directories TempDir made: removed when the test program exits, by the process that made
// them (a forked worker's exit leaves them alone); kept, and named, when a test failed.
class TempDirs {
 public:
  static TempDirs& Get() {
    static TempDirs dirs;
    return dirs;
  }
  void Add(std::string dir) { dirs_.push_back(std::move(dir)); }
  ~TempDirs() {
    if (getpid() != owner_) return;
    const bool keep = ::testing::UnitTest::GetInstance()->Failed();
    for (const std::string& d : dirs_) {
      std::error_code ec;
      if (keep) {
        if (std::filesystem::exists(d, ec))
          std::fprintf(stderr, "kept %s (a test failed)\n", d.c_str());
      } else {
        std::filesystem::remove_all(d, ec);
      }
    }
  }

 private:
  TempDirs() : owner_(getpid()) {}
  pid_t owner_;
  std::vector<std::string> dirs_;
};

// A fresh directory /tmp/st_<tag>_XXXXXX ("" if it cannot be made), removed at exit (TempDirs).
inline std::string TempDir(const std::string& tag) {
  std::string tmpl = "/tmp/st_" + tag + "_XXXXXX";
  if (!mkdtemp(tmpl.data())) return "";
  TempDirs::Get().Add(tmpl);
  return tmpl;
}

struct Ran {
  int code;         // the exit code; -1 when killed by a signal
  std::string out;  // stdout and stderr together
};

// Runs `cmd` through the shell with stderr joined to stdout.
inline Ran RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The records of one type ("step", "epoch", "eval") of a run directory's metrics.jsonl, in order.
inline std::vector<nlohmann::json> MetricsRecords(const std::string& run, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == type) out.push_back(std::move(j));
  }
  return out;
}

// The newest checkpoint of a run directory (checkpoint_<time> names sort by time); "" if none.
inline std::string NewestCheckpoint(const std::string& run) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run, ec))
    if (e.path().filename().string().rfind("checkpoint_", 0) == 0)
      dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs.empty() ? "" : dirs.back();
}

// A TCP socket in the LISTEN state (from /proc/net/tcp and tcp6).
struct ListeningSocket {
  std::string address;  // the local address as /proc writes it (hex, little-endian for IPv4)
  int port = 0;
  std::string inode;
};

inline std::vector<ListeningSocket> ListeningSockets() {
  std::vector<ListeningSocket> out;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A") continue;  // LISTEN
      const size_t colon = local.find(':');
      out.push_back(
          {local.substr(0, colon), std::stoi(local.substr(colon + 1), nullptr, 16), inode});
    }
  }
  return out;
}

// The inodes of the sockets process `pid` holds open.
inline std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) out.insert(target.substr(8, target.size() - 9));
  }
  return out;
}

// The pids of `parent`'s children, sorted (a driver's or launcher's workers, started in rank
// order).
inline std::vector<pid_t> ChildPids(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2) continue;
    if (ppid == parent) out.push_back(std::stoi(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace st::test
