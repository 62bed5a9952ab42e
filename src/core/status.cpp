#include "core/status.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace st {

std::string ErrnoMessage(int err) {
  return std::strerror(err);
}

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kIo:
      return "IO_ERROR";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return message_;
}

namespace detail {

std::string& CheckContext() {
  // Diagnostic label only (e.g. "rank 3, "), set once by the worker at start-up; never read for
  // logic.
  static std::string context;
  return context;
}

CheckFailure::CheckFailure(const char* file, int line, const char* expr) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  os_ << "slicetrain: internal error (" << CheckContext() << "host " << host << ", pid " << getpid()
      << ") at " << file << ":" << line << ": check failed: " << expr << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail
}  // namespace st
