// Status / StatusOr: the error policy for expected failures (bad files, bad flags, I/O, peers).
// Broken invariants (programmer errors) use ST_CHECK, which prints context and aborts.
// Library code never calls exit(): it returns a Status and lets the CLI decide. See docs/errors.md.
#pragma once

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace st {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad flag, bad config value, impossible shape
  kNotFound,         // missing file or tensor
  kDataLoss,         // truncated / corrupt file
  kIo,               // read/write failure (errno in the message)
  kUnimplemented,    // a valid request this build cannot serve
  kInternal,
  kUnavailable,        // a peer was lost or did not answer in time: restarting the group may help
  kResourceExhausted,  // the job needs more memory (or another resource) than the host gives
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // One line: "<message>" (the code name is for tests and logs, the message is for users).
  std::string ToString() const;

  // Prepends context, e.g. the path of the file being read: "model.safetensors: <message>".
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status DataLoss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status IoError(std::string m) {
  return {StatusCode::kIo, std::move(m)};
}
inline Status Unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status Internal(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

// Formats any streamable values into one string: StrCat("tensor ", name, " has ", n, " elements").
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// The text of an errno value ("No such file or directory") for a message's "why" part; call it
// before anything else can change errno.
std::string ErrnoMessage(int err);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace detail {
// The label ST_CHECK prints before the host name, e.g. "rank 3, ". Set by the worker at start-up.
std::string& CheckContext();

// Collects the message of a failed ST_CHECK and aborts when destroyed.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace st

#define ST_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::st::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define ST_CHECK_OP(a, op, b) ST_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define ST_CHECK_EQ(a, b) ST_CHECK_OP(a, ==, b)
#define ST_CHECK_LE(a, b) ST_CHECK_OP(a, <=, b)
#define ST_CHECK_LT(a, b) ST_CHECK_OP(a, <, b)
#define ST_CHECK_GE(a, b) ST_CHECK_OP(a, >=, b)

#define ST_CONCAT_INNER(a, b) a##b
#define ST_CONCAT(a, b) ST_CONCAT_INNER(a, b)

#define ST_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::st::Status _st_status = (expr);        \
    if (!_st_status.ok()) return _st_status; \
  } while (0)

#define ST_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define ST_ASSIGN_OR_RETURN(lhs, expr) \
  ST_ASSIGN_OR_RETURN_IMPL(ST_CONCAT(_st_or_, __LINE__), lhs, expr)
