// Reward functions of online RL: the reward program (a child process that answers JSON lines
// with numbers) and the built-ins (exact, numeric, regex, overlong). The contract is in rewards.h.
#include "train/rewards.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/fd.h"
#include "data/utf8.h"

extern char** environ;

namespace st {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr double kNoReward = std::numeric_limits<double>::quiet_NaN();

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsAlnum(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// At most `max` bytes of `s` for a message, with "..." when cut.
std::string Shorten(std::string_view s, size_t max = 80) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max)) + "...";
}

// ---- the reward program ------------------------------------------------------------------------

// The base name of the first word with a file extension (a dot followed by up to 8 letters and
// digits, at least one a letter), else of the first word; quotes around a word are dropped.
std::string ProgramName(const std::string& command) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < command.size()) {
    while (i < command.size() && IsSpace(command[i])) ++i;
    size_t j = i;
    while (j < command.size() && !IsSpace(command[j])) ++j;
    if (j > i) {
      std::string w = command.substr(i, j - i);
      w.erase(std::remove(w.begin(), w.end(), '\''), w.end());
      w.erase(std::remove(w.begin(), w.end(), '"'), w.end());
      const size_t slash = w.rfind('/');
      if (slash != std::string::npos) w = w.substr(slash + 1);
      if (!w.empty()) words.push_back(std::move(w));
    }
    i = j;
  }
  for (const std::string& w : words) {
    if (w[0] == '-' || w.find('=') != std::string::npos) continue;
    const size_t dot = w.rfind('.');
    if (dot == std::string::npos || dot == 0 || w.size() - dot - 1 > 8) continue;
    const std::string_view ext = std::string_view(w).substr(dot + 1);
    const bool alnum = !ext.empty() && std::all_of(ext.begin(), ext.end(), IsAlnum);
    const bool letter = std::any_of(ext.begin(), ext.end(), [](char c) { return !IsDigit(c); });
    if (alnum && letter) return w;
  }
  return words.empty() ? command : words[0];
}

// One answer line: a finite number, or NaN for null / None / nan; nullopt when it is neither.
std::optional<double> ParseAnswer(std::string_view line) {
  const std::string_view s = Trim(line);
  const std::string lower = Lower(s);
  if (lower == "null" || lower == "none" || lower == "nan") return kNoReward;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

std::string SignalName(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = sigabbrev_np(sig)) return StrCat("SIG", abbrev);
#endif
  return StrCat("signal ", sig);
}

// Blocks SIGPIPE in this thread while it writes to the program: a write to a program that has
// exited fails with EPIPE instead of raising the signal. A SIGPIPE raised meanwhile is consumed.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

class LineProgram final : public JsonLinesProgram {
 public:
  LineProgram(std::string command, double timeout_s, std::string what, std::string flag)
      : command_(std::move(command)),
        what_(std::move(what)),
        flag_(std::move(flag)),
        timeout_s_(timeout_s) {}
  ~LineProgram() override;
  LineProgram(const LineProgram&) = delete;
  LineProgram& operator=(const LineProgram&) = delete;

  StatusOr<std::vector<std::string>> Ask(const std::vector<json>& inputs,
                                         const AnswerCheck& check) override;
  int64_t lines_read() const override { return lines_read_; }
  std::string Quoted() const override { return StrCat(what_, " '", command_, "'"); }
  Status Fail(Status s) override;

 private:
  Status Start();
  // Writes `lines` (line k starts at begins[k]) while reading one answer per line into `out`.
  Status Exchange(const std::string& lines, const std::vector<size_t>& begins,
                  std::vector<std::string>* out);
  // Moves the complete answer lines of buffered_ into `out` (at most `n` in all), each checked.
  Status TakeAnswers(size_t n, std::vector<std::string>* out);
  AnswerCheck check_;  // the current Ask's
  // The error for a program whose stdout closed before it answered `completion`.
  Status ClosedError(size_t completion);
  // SIGKILLs the program's process group and reaps the program.
  void Kill();

  std::string command_, what_, flag_;
  double timeout_s_;
  pid_t pid_ = -1;
  Fd to_child_, from_child_;  // the program's stdin and stdout (our ends, non-blocking)
  std::string buffered_;      // read from the program, not yet taken as answers
  int64_t lines_read_ = 0;    // answer lines of the program's life so far
  Status error_;              // once set, every Ask returns it
};

LineProgram::~LineProgram() {
  if (pid_ <= 0) return;
  to_child_.Reset();  // EOF on its stdin: a well-behaved program ends now
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
  siginfo_t info{};
  while (Clock::now() < deadline) {
    info.si_pid = 0;
    // WNOWAIT: the exited program stays a zombie, so its pid still names its process group.
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Kill();
}

void LineProgram::Kill() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // the group: the shell and whatever it started
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  to_child_.Reset();
  from_child_.Reset();
}

Status LineProgram::Fail(Status s) {
  Kill();
  error_ = s;
  return s;
}

Status LineProgram::Start() {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0)
    return IoError(StrCat(Quoted(), ": pipe failed: ", std::strerror(errno)));
  Fd in_read(in[0]), in_write(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0)
    return IoError(StrCat(Quoted(), ": pipe failed: ", std::strerror(errno)));
  Fd out_read(out[0]), out_write(out[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A group of its own (so that a kill reaches what the shell starts), no blocked signals, and
  // SIGPIPE's default action even if this process ignores it.
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, pipe;
  sigemptyset(&none);
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &pipe);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command_;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return IoError(StrCat(Quoted(), ": cannot start /bin/sh: ", std::strerror(rc)));
  pid_ = pid;
  to_child_ = std::move(in_write);
  from_child_ = std::move(out_read);
  for (int fd : {to_child_.get(), from_child_.get()})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Status::Ok();
}

StatusOr<std::vector<std::string>> LineProgram::Ask(const std::vector<json>& inputs,
                                                    const AnswerCheck& check) {
  if (!error_.ok()) return error_;
  check_ = check;
  if (inputs.empty()) return std::vector<std::string>{};
  if (pid_ <= 0) {
    Status s = Start();
    if (!s.ok()) return Fail(s);
  }
  std::string lines;
  std::vector<size_t> begins;
  begins.reserve(inputs.size());
  for (const json& input : inputs) {
    begins.push_back(lines.size());
    // Invalid UTF-8 (a completion cut inside a character) becomes U+FFFD rather than throwing.
    lines += input.dump(-1, ' ', false, json::error_handler_t::replace);
    lines += '\n';
  }
  std::vector<std::string> out;
  out.reserve(inputs.size());
  Status s = Exchange(lines, begins, &out);
  if (!s.ok()) return Fail(s);
  return out;
}

Status LineProgram::TakeAnswers(size_t n, std::vector<std::string>* out) {
  size_t pos = 0, nl = 0;
  Status status;
  while (out->size() < n && (nl = buffered_.find('\n', pos)) != std::string::npos) {
    ++lines_read_;
    const std::string_view line = Trim(std::string_view(buffered_.data() + pos, nl - pos));
    if (check_) {
      const std::string why = check_(line);
      if (!why.empty()) {
        status = InvalidArgument(StrCat(Quoted(), " answered line ", lines_read_, " (completion ",
                                        out->size(), ") with '", Shorten(line), "', ", why));
        break;
      }
    }
    out->emplace_back(line);
    pos = nl + 1;
  }
  buffered_.erase(0, pos);
  return status;
}

Status LineProgram::ClosedError(size_t completion) {
  // The program usually exits along with its stdout: give it a moment to, for its status.
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
  siginfo_t info{};
  for (;;) {
    info.si_pid = 0;
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
      return Internal(StrCat(Quoted(), ": waitid failed: ", std::strerror(errno)));
    if (info.si_pid != 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string before = StrCat(" before answering completion ", completion);
  if (info.si_pid == 0) return Internal(StrCat(Quoted(), " closed its stdout", before));
  if (info.si_code == CLD_EXITED)
    return Internal(StrCat(Quoted(), " exited (status ", info.si_status, ")", before,
                           info.si_status == 127 ? " (127: command not found?)" : ""));
  return Internal(StrCat(Quoted(), " was killed by ", SignalName(info.si_status), " (signal ",
                         info.si_status, ")", before));
}

// Writes and reads at once (poll on both pipes), so that a program that answers each line as it
// reads it never blocks on a full stdout pipe while we block on its full stdin pipe. The wait
// for answer k starts when answer k - 1 has arrived and line k is being written.
Status LineProgram::Exchange(const std::string& lines, const std::vector<size_t>& begins,
                             std::vector<std::string>* out) {
  ScopedSigpipeBlock no_sigpipe;
  const size_t n = begins.size();
  const auto timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  std::vector<Clock::time_point> reached(n);  // when the writing of line k began
  size_t written = 0, lines_reached = 0;
  bool stdin_open = true;
  Clock::time_point last_answer = Clock::now();
  ST_RETURN_IF_ERROR(TakeAnswers(n, out));
  while (out->size() < n) {
    const Clock::time_point now = Clock::now();
    while (lines_reached < n && written >= begins[lines_reached]) reached[lines_reached++] = now;
    const size_t k = out->size();
    const Clock::time_point deadline =
        (k < lines_reached ? std::max(last_answer, reached[k]) : last_answer) + timeout;
    if (now >= deadline)
      return Unavailable(StrCat(Quoted(), " gave no answer for completion ", k, " within ",
                                timeout_s_, " s (", flag_, ")"));
    const bool writing = stdin_open && written < lines.size();
    pollfd fds[2] = {{from_child_.get(), POLLIN, 0}, {to_child_.get(), POLLOUT, 0}};
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    const int rc =
        ::poll(fds, writing ? 2 : 1, static_cast<int>(std::min<int64_t>(wait_ms, 60000)));
    if (rc < 0 && errno != EINTR)
      return IoError(StrCat(Quoted(), ": poll failed: ", std::strerror(errno)));
    if (rc <= 0) continue;
    if (writing && fds[1].revents != 0) {
      const ssize_t w = ::write(to_child_.get(), lines.data() + written, lines.size() - written);
      if (w > 0) {
        written += static_cast<size_t>(w);
      } else if (errno == EPIPE) {
        stdin_open = false;  // it closed its stdin (or exited): read what it said, then EOF
        to_child_.Reset();
      } else if (errno != EAGAIN && errno != EINTR) {
        return IoError(StrCat(Quoted(), ": write to its stdin failed: ", std::strerror(errno)));
      }
    }
    if (fds[0].revents != 0) {
      char buf[65536];
      const ssize_t r = ::read(from_child_.get(), buf, sizeof(buf));
      if (r == 0) {
        ST_RETURN_IF_ERROR(TakeAnswers(n, out));  // answers before the EOF still count
        if (out->size() < n) return ClosedError(out->size());
      } else if (r > 0) {
        buffered_.append(buf, static_cast<size_t>(r));
        const size_t before = out->size();
        ST_RETURN_IF_ERROR(TakeAnswers(n, out));
        if (out->size() > before) last_answer = Clock::now();
      } else if (errno != EAGAIN && errno != EINTR) {
        return IoError(StrCat(Quoted(), ": read from its stdout failed: ", std::strerror(errno)));
      }
    }
  }
  // Lines beyond the last answer would be taken as the next call's answers: out of step.
  if (!buffered_.empty()) {
    const std::string_view extra =
        Trim(std::string_view(buffered_).substr(0, buffered_.find('\n')));
    return InvalidArgument(StrCat(Quoted(), " wrote more answers than it was given completions (",
                                  n, "): an extra line '", Shorten(extra), "'"));
  }
  return Status::Ok();
}

// A reward program: LineProgram's answers read as numbers.
class CommandReward final : public RewardFunction {
 public:
  CommandReward(const std::string& command, double timeout_s)
      : name_(ProgramName(command)),
        program_(command, timeout_s, "reward command", "--reward-timeout") {}
  const std::string& name() const override { return name_; }
  StatusOr<std::vector<double>> Score(const std::vector<json>& inputs) override {
    ST_ASSIGN_OR_RETURN(
        const std::vector<std::string> lines, program_.Ask(inputs, [](std::string_view line) {
          return ParseAnswer(line) ? std::string()
                                   : std::string("not a number (nor null, None or nan)");
        }));
    std::vector<double> out;
    out.reserve(lines.size());
    for (const std::string& line : lines) out.push_back(*ParseAnswer(line));
    return out;
  }

 private:
  std::string name_;
  LineProgram program_;
};

// ---- the built-ins -----------------------------------------------------------------------------

// The last number in `s` (see numeric:COLUMN in rewards.h); nullopt when it has none.
std::optional<double> LastNumber(std::string_view s) {
  const size_t n = s.size();
  auto digit = [&](size_t i) { return i < n && IsDigit(s[i]); };
  std::optional<double> last;
  size_t i = 0;
  while (i < n) {
    // A number starts at a digit (never one inside a number: the scan skips whole numbers), or
    // at a sign or a '.' before one that does not follow a letter or digit ("5-3" is 5 and 3).
    const bool after_alnum = i > 0 && IsAlnum(s[i - 1]);
    const bool sign = (s[i] == '-' || s[i] == '+') && !after_alnum;
    size_t j = sign ? i + 1 : i;
    const bool dot = j < n && s[j] == '.' && digit(j + 1) && !after_alnum;
    if (!digit(j) && !dot) {
      ++i;
      continue;
    }
    std::string text = s[i] == '-' ? "-0" : "0";  // a leading 0 so that ".5" parses too
    const size_t first = j;
    while (digit(j)) text += s[j++];
    // Groups of three after commas: "1,234,567" (not "1,2" nor "1,2345").
    if (j > first && j - first <= 3) {
      while (j < n && s[j] == ',' && digit(j + 1) && digit(j + 2) && digit(j + 3) &&
             !digit(j + 4)) {
        text.append(s.substr(j + 1, 3));
        j += 4;
      }
    }
    if (j < n && s[j] == '.' && digit(j + 1)) {
      text += s[j++];
      while (digit(j)) text += s[j++];
    }
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
      size_t e = j + 1;
      if (e < n && (s[e] == '+' || s[e] == '-')) ++e;
      if (digit(e)) {
        while (digit(e)) ++e;
        text.append(s.substr(j, e - j));
        j = e;
      }
    }
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    last = ec == std::errc() ? v : kNoReward;  // out of range ("1e999"): equals nothing
    i = j;
  }
  return last;
}

bool SameNumber(double a, double b) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  return std::fabs(a - b) <= std::max(1e-9, 1e-6 * std::max(std::fabs(a), std::fabs(b)));
}

// `text` with each invalid UTF-8 byte replaced by U+FFFD (PCRE2 matches valid UTF-8 only).
std::string ValidUtf8(const std::string& text) {
  if (IsValidUtf8(text)) return text;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min<size_t>(static_cast<size_t>(Utf8Len(text[i])), text.size() - i);
    const std::string_view c(text.data() + i, len);
    if (IsValidUtf8(c)) {
      out.append(c);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += 1;
    }
  }
  return out;
}

// One score per input object, given its index (for messages); errors get "reward SPEC: ".
using ScoreOne = std::function<StatusOr<double>(const json& input, size_t index)>;

class BuiltinReward final : public RewardFunction {
 public:
  BuiltinReward(std::string spec, std::string name, ScoreOne score)
      : spec_(std::move(spec)), name_(std::move(name)), score_(std::move(score)) {}
  const std::string& name() const override { return name_; }
  StatusOr<std::vector<double>> Score(const std::vector<json>& inputs) override {
    std::vector<double> out;
    out.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      StatusOr<double> r = score_(inputs[i], i);
      if (!r.ok()) return r.status().WithContext("reward " + spec_);
      out.push_back(r.value());
    }
    return out;
  }

 private:
  std::string spec_, name_;
  ScoreOne score_;
};

// The row's COLUMN of input `index`, or InvalidArgument when it has none.
StatusOr<const json*> Column(const json& input, const std::string& column, size_t index) {
  if (input.is_object()) {
    auto it = input.find(column);
    if (it != input.end()) return &*it;
  }
  return InvalidArgument(StrCat("completion ", index, "'s row has no column '", column, "'"));
}

Status NotTextOrNumber(const json& value, const std::string& column, size_t index) {
  return InvalidArgument(StrCat("completion ", index, "'s column '", column, "' holds ",
                                value.type_name(), " ", Shorten(value.dump()),
                                ", not text or a number"));
}

ScoreOne ExactScore(const std::string& column) {
  return [column](const json& input, size_t index) -> StatusOr<double> {
    ST_ASSIGN_OR_RETURN(const json* want, Column(input, column, index));
    if (want->is_null()) return kNoReward;
    std::string text;
    if (want->is_string())
      text = want->get<std::string>();
    else if (want->is_number() || want->is_boolean())
      text = want->dump();
    else
      return NotTextOrNumber(*want, column, index);
    return Trim(CompletionText(input)) == Trim(text) ? 1.0 : 0.0;
  };
}

ScoreOne NumericScore(const std::string& column) {
  return [column](const json& input, size_t index) -> StatusOr<double> {
    ST_ASSIGN_OR_RETURN(const json* want, Column(input, column, index));
    std::optional<double> expected;
    if (want->is_number())
      expected = want->get<double>();
    else if (want->is_string())
      expected = LastNumber(want->get_ref<const std::string&>());
    else if (!want->is_null())
      return NotTextOrNumber(*want, column, index);
    if (!expected || std::isnan(*expected)) return kNoReward;
    const std::optional<double> got = LastNumber(CompletionText(input));
    return got && SameNumber(*got, *expected) ? 1.0 : 0.0;
  };
}

ScoreOne OverlongScore(int64_t max_len, int64_t cache) {
  return [max_len, cache](const json& input, size_t index) -> StatusOr<double> {
    auto it = input.is_object() ? input.find("completion_ids") : input.end();
    if (it == input.end() || !it->is_array())
      return InvalidArgument(StrCat("completion ", index, " has no completion_ids list"));
    const int64_t len = static_cast<int64_t>(it->size());
    if (len <= max_len - cache) return 0.0;
    if (len <= max_len) return static_cast<double>(max_len - cache - len) / cache;
    return -1.0;
  };
}

constexpr const char kForms[] =
    "the built-in rewards are exact:COLUMN, numeric:COLUMN, regex:PATTERN and overlong:MAX:CACHE "
    "(0 < MAX, 0 <= CACHE <= MAX)";

Status BadSpec(const std::string& spec, const std::string& why) {
  return InvalidArgument(StrCat("reward spec '", spec, "': ", why, "; ", kForms));
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

StatusOr<std::unique_ptr<RewardFunction>> MakeOverlong(const std::string& spec,
                                                       const std::string& arg) {
  const size_t colon = arg.find(':');
  if (colon == std::string::npos) return BadSpec(spec, "overlong needs MAX:CACHE");
  const std::optional<int64_t> max_len = ParseInt(arg.substr(0, colon));
  const std::optional<int64_t> cache = ParseInt(arg.substr(colon + 1));
  if (!max_len || !cache) return BadSpec(spec, "MAX and CACHE must be integers");
  if (*max_len <= 0 || *cache < 0 || *cache > *max_len)
    return BadSpec(spec, StrCat("MAX ", *max_len, " and CACHE ", *cache, " are out of range"));
  return std::unique_ptr<RewardFunction>(std::make_unique<BuiltinReward>(
      spec, "soft_overlong_punishment_reward", OverlongScore(*max_len, *cache)));
}

// PCRE2 handles, each freed by its own function.
template <typename T, void (*Free)(T*)>
struct PcreFree {
  void operator()(T* p) const { Free(p); }
};
using PcreCode = std::unique_ptr<pcre2_code, PcreFree<pcre2_code, pcre2_code_free>>;
using PcreMatchData =
    std::unique_ptr<pcre2_match_data, PcreFree<pcre2_match_data, pcre2_match_data_free>>;
using PcreMatchContext =
    std::unique_ptr<pcre2_match_context, PcreFree<pcre2_match_context, pcre2_match_context_free>>;
using PcreJitStack =
    std::unique_ptr<pcre2_jit_stack, PcreFree<pcre2_jit_stack, pcre2_jit_stack_free>>;

std::string PcreMessage(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// regex:PATTERN through PCRE2 rather than std::regex, whose recursive matcher overflows the
// stack on texts of some 50 KB ("(.|\n)*" or "[\s\S]*" over a long completion). The JIT gets
// a stack of up to 64 MiB: its default 32 KiB ends "(.|\n)*" after a few thousand characters.
class RegexReward final : public RewardFunction {
 public:
  RegexReward(std::string spec, PcreCode code) : spec_(std::move(spec)), code_(std::move(code)) {}
  const std::string& name() const override { return name_; }

  StatusOr<std::vector<double>> Score(const std::vector<json>& inputs) override {
    constexpr size_t kJitStackBytes = size_t{64} << 20;  // address space, touched as needed
    PcreMatchData data(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    PcreMatchContext context(pcre2_match_context_create(nullptr));
    PcreJitStack stack(pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr));
    if (!data || !context || !stack)
      return ResourceExhausted(StrCat("reward ", spec_, ": cannot allocate PCRE2 match state"));
    pcre2_jit_stack_assign(context.get(), nullptr, stack.get());
    std::vector<double> out;
    out.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string text = ValidUtf8(CompletionText(inputs[i]));
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                 text.size(), 0, 0, data.get(), context.get());
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
        return InvalidArgument(StrCat("reward ", spec_, ": matching completion ", i, " (",
                                      text.size(), " bytes) failed: ", PcreMessage(rc)));
      out.push_back(rc >= 0 ? 1.0 : 0.0);
    }
    return out;
  }

 private:
  std::string spec_, name_ = "regex";
  PcreCode code_;
};

StatusOr<std::unique_ptr<RewardFunction>> MakeRegex(const std::string& spec,
                                                    const std::string& pattern) {
  if (pattern.empty()) return BadSpec(spec, "the pattern is empty");
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // Anchored at both ends: the whole text must match (Python's re.fullmatch).
  PcreCode code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &err,
                              &err_offset, nullptr));
  if (!code)
    return BadSpec(spec, StrCat("bad pattern at offset ", err_offset, ": ", PcreMessage(err)));
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);  // best effort: else the interpreter runs
  return std::unique_ptr<RewardFunction>(std::make_unique<RegexReward>(spec, std::move(code)));
}

}  // namespace

std::string CompletionText(const json& input) {
  if (!input.is_object()) return "";
  auto it = input.find("completion");
  if (it == input.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array() || it->empty() || !it->back().is_object()) return "";
  auto content = it->back().find("content");
  if (content == it->back().end()) return "";
  if (content->is_string()) return content->get<std::string>();
  std::string text;
  if (content->is_array())
    for (const json& part : *content)
      if (part.is_object() && part.contains("text") && part["text"].is_string())
        text += part["text"].get<std::string>();
  return text;
}

StatusOr<std::unique_ptr<RewardFunction>> MakeCommandReward(const std::string& command,
                                                            double timeout_s) {
  if (Trim(command).empty()) return InvalidArgument("--reward-command is empty");
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    return InvalidArgument(
        StrCat("--reward-timeout must be a number of seconds > 0, got ", timeout_s));
  return std::unique_ptr<RewardFunction>(std::make_unique<CommandReward>(command, timeout_s));
}

StatusOr<std::unique_ptr<JsonLinesProgram>> MakeJsonLinesProgram(const std::string& command,
                                                                 double timeout_s,
                                                                 const std::string& what,
                                                                 const std::string& flag) {
  if (Trim(command).empty()) return InvalidArgument(StrCat("the ", what, " is empty"));
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    return InvalidArgument(StrCat(flag, " must be a number of seconds > 0, got ", timeout_s));
  return std::unique_ptr<JsonLinesProgram>(
      std::make_unique<LineProgram>(command, timeout_s, what, flag));
}

StatusOr<std::unique_ptr<RewardFunction>> MakeBuiltinReward(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return BadSpec(spec, "no ':' after the kind");
  const std::string kind = spec.substr(0, colon), arg = spec.substr(colon + 1);
  if (kind == "exact" || kind == "numeric") {
    if (Trim(arg).empty()) return BadSpec(spec, kind + " needs a COLUMN");
    ScoreOne score = kind == "exact" ? ExactScore(arg) : NumericScore(arg);
    return std::unique_ptr<RewardFunction>(
        std::make_unique<BuiltinReward>(spec, kind + "_" + arg, std::move(score)));
  }
  if (kind == "regex") return MakeRegex(spec, arg);
  if (kind == "overlong") return MakeOverlong(spec, arg);
  return BadSpec(spec, StrCat("unknown kind '", kind, "'"));
}

}  // namespace st
