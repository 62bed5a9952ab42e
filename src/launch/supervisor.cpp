#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>

#include "comm/store/socket.h"

extern char** environ;

namespace st::launch {

namespace {

using comm::Fd;
using Clock = std::chrono::steady_clock;

// Signal handlers can only reach the supervisor through a global; it holds the write end of the
// self-pipe of the RunWorkers call in progress (one at a time per process).
std::atomic<int> g_signal_pipe{-1};

void OnSignal(int sig) {
  int fd = g_signal_pipe.load();
  if (fd >= 0) {
    unsigned char c = static_cast<unsigned char>(sig);
    ssize_t rc = ::write(fd, &c, 1);
    (void)rc;
  }
}

// Installs the forwarding handlers for the lifetime of one RunWorkers call.
class SignalForwarding {
 public:
  explicit SignalForwarding(int write_fd) {
    g_signal_pipe = write_fd;
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalForwarding() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
    g_signal_pipe = -1;
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

struct Stream {
  Fd fd;
  std::string partial;
  bool is_stderr = false;
  std::string last_line;          // the last complete non-empty line (stderr: the worker's error)
  std::string failed_collective;  // the first "... #N ... failed after ..." line, if any
  // A worker's own error lines ("slicetrain <cmd>: error: ..."), prefixed, held back until the
  // group is done: the supervisor's summary quotes the ones that explain the failure, and only
  // the others are printed (so one failure is one error line, not the same text twice).
  std::vector<std::string> held_errors;
};

struct Child {
  int rank = 0;
  std::string ip;
  pid_t pid = -1;
  bool running = false;
  std::string prefix;
  Stream out, err;
};

// Builds envp: the parent's environment with `overrides` applied.
std::vector<std::string> ChildEnv(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::map<std::string, std::string> m;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) m[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : overrides) m[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k + "=" + v);
  return out;
}

StatusOr<Child> Spawn(const WorkerSpec& w) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return IoError("pipe failed");
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return IoError("pipe failed");
  }
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<std::string> env = ChildEnv(w.env);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = w.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return IoError(StrCat("fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own process group, so that a kill reaches its children too
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "slicetrain launch: exec failed\n";
    ssize_t rc = ::write(2, msg, sizeof(msg) - 1);
    (void)rc;
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Child c;
  c.rank = w.rank;
  c.ip = w.ip;
  c.pid = pid;
  c.running = true;
  c.prefix = StrCat("(rank ", w.rank, " pid=", pid, " ip=", w.ip, ") ");
  c.out.fd = Fd(out_pipe[0]);
  c.err.fd = Fd(err_pipe[0]);
  c.err.is_stderr = true;
  return c;
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = ::write(fd, s.data() + off, s.size() - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    off += static_cast<size_t>(k);
  }
}

constexpr const char kErrorMark[] = ": error: ";

bool IsErrorLine(const std::string& line) {
  return line.find(kErrorMark) != std::string::npos;
}

// The text of a worker's error line after "slicetrain <cmd>: error: " (empty if it has none).
std::string ErrorText(const std::string& line) {
  const size_t at = line.find(kErrorMark);
  return at == std::string::npos ? std::string() : line.substr(at + sizeof(kErrorMark) - 1);
}

// Emits complete lines (or everything on EOF), each prefixed when asked, in one write.
void Drain(Stream& s, const std::string& prefix, bool prefix_it, bool eof) {
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    if (nl > start) s.last_line = s.partial.substr(start, nl - start);
    if (s.failed_collective.empty() && s.last_line.find(" failed after ") != std::string::npos)
      s.failed_collective = s.last_line;
    std::string line = (prefix_it ? prefix : std::string()) + s.partial.substr(start, nl - start);
    if (s.is_stderr && IsErrorLine(line))
      s.held_errors.push_back(std::move(line));
    else
      out += line + "\n";
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (eof && !s.partial.empty()) {
    s.last_line = s.partial;
    std::string line = (prefix_it ? prefix : std::string()) + s.partial;
    if (s.is_stderr && IsErrorLine(line))
      s.held_errors.push_back(std::move(line));
    else
      out += line + "\n";
    s.partial.clear();
  }
  if (!out.empty()) WriteAll(s.is_stderr ? 2 : 1, out);
}

// Reads what `s` holds right now (without blocking) and emits its complete lines.
void ReadAvailable(Stream& s, const std::string& prefix, bool prefix_it) {
  while (s.fd.valid()) {
    pollfd p{s.fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    char buf[65536];
    ssize_t k = ::read(s.fd.get(), buf, sizeof(buf));
    if (k > 0) {
      s.partial.append(buf, static_cast<size_t>(k));
      Drain(s, prefix, prefix_it, false);
    } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
      Drain(s, prefix, prefix_it, true);
      s.fd.Reset();
    }
  }
}

}  // namespace

SupervisorResult RunWorkers(const std::vector<WorkerSpec>& workers, const SupervisorOptions& opts) {
  SupervisorResult result;
  int sp[2];
  if (::pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0) return {1, -1, "pipe failed", false, ""};
  Fd sig_read(sp[0]), sig_write(sp[1]);
  SignalForwarding forwarding(sig_write.get());

  std::vector<Child> children;
  auto kill_all = [&](int sig) {
    for (auto& c : children)
      if (c.running) ::kill(-c.pid, sig);
  };
  for (const auto& w : workers) {
    auto c = Spawn(w);
    if (!c.ok()) {
      kill_all(SIGKILL);
      result = {1, w.rank, c.status().message(), false, ""};
      break;
    }
    children.push_back(std::move(*c));
  }

  const auto start = Clock::now();
  Clock::time_point all_exited_at;
  bool killed_hard = false, termed = false;
  bool tearing_down = !result.message.empty();
  // True while the failure on record is a worker that exited with kExitUnavailable, i.e. one that
  // only reported a lost peer: the peer itself, reaped a moment later, is the better cause.
  bool cause_is_secondary = false;
  Clock::time_point term_at = tearing_down ? Clock::now() : Clock::time_point::max();
  Clock::time_point kill_deadline = term_at;
  // `drain`: let the others notice the failure and say where they were before SIGTERM.
  auto begin_teardown = [&](int failed_rank, std::string why, int code, bool drain,
                            bool restartable) {
    if (tearing_down) return;
    tearing_down = true;
    result = {code, failed_rank, std::move(why), restartable, ""};
    term_at = Clock::now() + (drain ? opts.drain : std::chrono::milliseconds(0));
    kill_deadline = term_at + opts.grace;
  };

  for (;;) {
    // Reap exited children.
    int running = 0;
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) {
        c.running = false;
        // Make sure anything it left in its process group goes too.
        ::kill(-c.pid, SIGKILL);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        // A worker that dies on its own (a signal, or an exit code other than 75) before the
        // SIGTERM replaces a cause that only reported the loss: peers often notice a killed rank
        // and exit before the supervisor reaps it, and the report must name the one that died.
        const bool secondary = WIFEXITED(status) && WEXITSTATUS(status) == kExitUnavailable;
        const bool replaces =
            tearing_down && cause_is_secondary && !termed && !secondary && result.failed_rank >= 0;
        if (!ok && (!tearing_down || replaces)) {
          // Its last words are already in the pipe: read them so the message can quote them.
          ReadAvailable(c.out, c.prefix, opts.prefix_stdout);
          ReadAvailable(c.err, c.prefix, opts.prefix_stderr);
          const std::string who =
              StrCat("worker rank ", c.rank, " (pid ", c.pid, ", host ", c.ip, ")");
          std::string why = WIFEXITED(status)
                                ? StrCat(who, " exited with code ", WEXITSTATUS(status))
                                : StrCat(who, " was killed by signal ", WTERMSIG(status), " (",
                                         strsignal(WTERMSIG(status)), ")",
                                         WTERMSIG(status) == SIGKILL
                                             ? "; if nobody sent it, the kernel's out-of-memory "
                                               "killer did (see dmesg): the job needs more memory "
                                               "than the host gives"
                                             : "");
          const bool restartable = !WIFEXITED(status) || WEXITSTATUS(status) == kExitUnavailable;
          // Quote the worker's own one-line error ("slicetrain <cmd>: error: <what>").
          std::string last = c.err.last_line;
          if (IsErrorLine(last)) last = ErrorText(last);
          if (!last.empty()) why += ": " + last;
          // The worker's exit code is the group's (2: bad input, 75: a lost peer...); a worker
          // killed by a signal makes it 1, as torchrun does.
          const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
          if (replaces) {
            result = {code, c.rank, std::move(why), restartable, ""};
          } else {
            begin_teardown(c.rank, why, code, /*drain=*/true, restartable);
          }
          cause_is_secondary = secondary;
        }
      } else {
        ++running;
      }
    }
    // Gather the fds still open.
    std::vector<pollfd> pfds;
    std::vector<Stream*> streams;
    std::vector<Child*> owners;
    for (auto& c : children)
      for (Stream* s : {&c.out, &c.err})
        if (s->fd.valid()) {
          pfds.push_back({s->fd.get(), POLLIN, 0});
          streams.push_back(s);
          owners.push_back(&c);
        }
    if (running == 0 && pfds.empty()) break;
    // Pipes still held open by something the workers started: give them a second, then stop.
    if (running == 0 && all_exited_at == Clock::time_point()) all_exited_at = Clock::now();
    if (running == 0 && Clock::now() - all_exited_at > std::chrono::seconds(1)) break;
    pfds.push_back({sig_read.get(), POLLIN, 0});
    int rc = ::poll(pfds.data(), pfds.size(), 100);
    if (rc < 0 && errno != EINTR) break;
    for (size_t i = 0; i + 1 < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      char buf[65536];
      ssize_t k = ::read(pfds[i].fd, buf, sizeof(buf));
      Stream& s = *streams[i];
      const bool prefix_it = s.is_stderr ? opts.prefix_stderr : opts.prefix_stdout;
      if (k > 0) {
        s.partial.append(buf, static_cast<size_t>(k));
        Drain(s, owners[i]->prefix, prefix_it, false);
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        Drain(s, owners[i]->prefix, prefix_it, true);
        s.fd.Reset();
      }
    }
    if (pfds.back().revents) {
      unsigned char sig = 0;
      while (::read(sig_read.get(), &sig, 1) == 1) {
        kill_all(sig);
        begin_teardown(-1,
                       StrCat("interrupted by signal ", static_cast<int>(sig), " (", strsignal(sig),
                              "); workers stopped"),
                       128 + sig, /*drain=*/false, /*restartable=*/false);
      }
    }
    if (!tearing_down && opts.timeout.count() > 0 && Clock::now() - start > opts.timeout)
      begin_teardown(-1, StrCat("workers did not finish within ", opts.timeout.count(), " ms"), 1,
                     /*drain=*/false, /*restartable=*/false);
    if (tearing_down && !termed && Clock::now() >= term_at) {
      kill_all(SIGTERM);
      kill_all(SIGCONT);  // a stopped worker must run to die
      termed = true;
    }
    if (tearing_down && !killed_hard && Clock::now() > kill_deadline) {
      kill_all(SIGKILL);
      killed_hard = true;
    }
  }
  // Nothing may outlive the supervisor.
  kill_all(SIGKILL);
  for (auto& c : children)
    if (c.running) ::waitpid(c.pid, nullptr, 0);
  // What the others said when they noticed: the first error line names a collective and a peer.
  for (const auto& c : children) {
    if (c.rank == result.failed_rank) continue;
    const std::string& last = c.err.last_line;
    if (IsErrorLine(last)) {
      result.peer_report = ErrorText(last);
      break;
    }
    if (!c.err.failed_collective.empty()) {
      result.peer_report = c.err.failed_collective;
      break;
    }
  }
  // The held error lines that the result does not already quote.
  std::string rest;
  for (const auto& c : children)
    for (const std::string& line : c.err.held_errors) {
      const std::string text = ErrorText(line);
      const bool quoted = result.exit_code != 0 && !text.empty() &&
                          (result.message.find(text) != std::string::npos ||
                           result.peer_report.find(text) != std::string::npos);
      if (!quoted) rest += line + "\n";
    }
  if (!rest.empty()) WriteAll(2, rest);
  return result;
}

SupervisorResult RunWorkersWithRestarts(
    const std::vector<WorkerSpec>& workers, const SupervisorOptions& opts, int max_failures,
    const std::function<void(int attempt, const SupervisorResult& failure)>& on_restart) {
  for (int attempt = 0;; ++attempt) {
    std::vector<WorkerSpec> specs = workers;
    for (auto& w : specs) w.env.emplace_back("SLICETRAIN_RESTART_ATTEMPT", std::to_string(attempt));
    SupervisorResult r = RunWorkers(specs, opts);
    if (r.exit_code == 0 || !r.restartable || attempt >= max_failures) return r;
    if (on_restart) on_restart(attempt + 1, r);
  }
}

}  // namespace st::launch
