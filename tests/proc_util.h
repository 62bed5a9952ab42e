// Test helper: runs a command with stdout+stderr captured, with deadlines (never hangs a test).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace st::testing {

class Proc {
 public:
  // argv[0] is a path; env entries "K=V" are added to the current environment.
  Proc(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
       bool merge_stderr = true) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<std::string> a = argv, e = env;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      if (merge_stderr) dup2(out[1], 2);
      for (auto& kv : e) putenv(kv.data());
      std::vector<char*> av;
      for (auto& s : a) av.push_back(s.data());
      av.push_back(nullptr);
      execv(av[0], av.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
  }
  ~Proc() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return out_; }

  // Reads output until `pred(output)` holds, EOF, or the deadline; returns pred's last value.
  bool ReadUntil(const std::function<bool(const std::string&)>& pred, std::chrono::milliseconds t) {
    const auto deadline = std::chrono::steady_clock::now() + t;
    while (!pred(out_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || fd_ < 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[8192];
      ssize_t k = read(fd_, buf, sizeof(buf));
      if (k <= 0) {
        close(fd_);
        fd_ = -1;
        return pred(out_);
      }
      out_.append(buf, static_cast<size_t>(k));
    }
    return true;
  }
  // Waits for exit (reading output meanwhile); returns the exit status or -1 on timeout (the
  // process is then killed).
  int Wait(std::chrono::milliseconds t) {
    const auto deadline = std::chrono::steady_clock::now() + t;
    ReadUntil([](const std::string&) { return false; }, t);
    for (;;) {
      int st = 0;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        exited_ = true;
        return -1;
      }
      usleep(20000);
    }
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string out_;
};

// A child process (in a process group of its own) whose stdout and stderr a thread collects, so
// that a test can wait for a line and act (kill a worker, cut a link) while several jobs run.
class BackgroundProc {
 public:
  explicit BackgroundProc(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env = {}) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> env = extra_env;
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(p[1], 1);
      dup2(p[1], 2);
      for (auto& kv : env) putenv(kv.data());
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    close(p[1]);
    reader_ = std::thread([this, fd = p[0]] {
      char buf[4096];
      for (;;) {
        ssize_t k = read(fd, buf, sizeof(buf));
        std::lock_guard<std::mutex> lock(mu_);
        if (k <= 0) {
          eof_ = true;
          cv_.notify_all();
          break;
        }
        out_.append(buf, static_cast<size_t>(k));
        cv_.notify_all();
      }
      close(fd);
    });
  }
  ~BackgroundProc() {
    if (pid_ > 0 && !waited_) {
      kill(-pid_, SIGKILL);
      Wait(std::chrono::seconds(30));
    }
    if (reader_.joinable()) reader_.join();
  }
  BackgroundProc(const BackgroundProc&) = delete;
  BackgroundProc& operator=(const BackgroundProc&) = delete;

  pid_t pid() const { return pid_; }
  std::string out() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }
  // Waits until the output matches `re` (true), or the process closed its output or the timeout
  // passed (false).
  bool WaitFor(const std::string& re, std::chrono::seconds timeout) {
    const std::regex r(re);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return eof_ || std::regex_search(out_, r); });
    return std::regex_search(out_, r);
  }
  // Exit code, 128 + signal, or -1 when it did not end in time (then it is killed).
  int Wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        waited_ = true;
        if (reader_.joinable()) reader_.join();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    waited_ = true;
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool waited_ = false;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;
  bool eof_ = false;
};

// Lines of `s` that contain `needle`.
inline std::vector<std::string> LinesWith(const std::string& s, const std::string& needle) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (line.find(needle) != std::string::npos) out.push_back(line);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return out;
}

// True when no process with this pid exists any more (zombies count as gone only when reaped).
inline bool PidGone(pid_t pid) {
  return kill(pid, 0) != 0;
}

}  // namespace st::testing
