#include "comm/store/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace st::comm {

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& host, int port,
                                                             bool passive, int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  const char* h = (host.empty() || host == "0.0.0.0") && passive ? nullptr : host.c_str();
  int rc = getaddrinfo(h, port_s.c_str(), &hints, &res);
  if (rc != 0) return IoError(StrCat("cannot resolve ", host, ":", port, ": ", gai_strerror(rc)));
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

}  // namespace

StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port) {
  ST_ASSIGN_OR_RETURN(auto res, Resolve(host, port, /*passive=*/true, SOCK_STREAM));
  std::string last_error = "no address";
  for (addrinfo* a = res.get(); a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 512) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    if (bound_port)
      *bound_port = ss.ss_family == AF_INET
                        ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                        : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return fd;
  }
  return IoError(StrCat("cannot listen on ", host, ":", port, ": ", last_error));
}

StatusOr<Fd> ConnectWithRetry(const std::string& host, int port, Clock::time_point deadline) {
  std::string last_error;
  for (;;) {
    auto res = Resolve(host, port, false, SOCK_STREAM);
    if (res.ok()) {
      for (addrinfo* a = res->get(); a; a = a->ai_next) {
        // Non-blocking, so that a host that drops SYNs (a link down on its side) costs at most
        // the time left, not the kernel's two minutes of SYN retries.
        Fd fd(
            ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (!fd.valid()) continue;
        int err = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
          pollfd p{fd.get(), POLLOUT, 0};
          // Retry a silent attempt every 2 s: a SYN lost while a link was down is not resent
          // before 3 s (then 6, 12 ...), and a fresh socket starts over at once.
          const int wait = std::min(MillisLeft(deadline), 2000);
          int rc;
          do {
            rc = ::poll(&p, 1, wait);
          } while (rc < 0 && errno == EINTR);
          socklen_t len = sizeof(err);
          if (rc <= 0)
            err = ETIMEDOUT;
          else if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        }
        if (err == 0) {
          int one = 1;
          setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          // Back to blocking mode: SendAll/RecvAll poll themselves and pass MSG_DONTWAIT.
          ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
          return fd;
        }
        last_error = std::strerror(err);
      }
    } else {
      last_error = res.status().message();
    }
    if (Clock::now() >= deadline)
      return IoError(StrCat("cannot connect to ", host, ":", port, " (", last_error, ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

StatusOr<Fd> Accept(int listen_fd, int stop_fd) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return IoError(StrCat("poll: ", std::strerror(errno)));
    if (p[1].revents) return Fd();
    if (p[0].revents & POLLIN) {
      int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
        return IoError(StrCat("accept: ", std::strerror(errno)));
      }
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Fd(c);
    }
    if (p[0].revents) return IoError("listening socket closed");
  }
}

Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    pollfd pf{fd, POLLOUT, 0};
    int rc = ::poll(&pf, 1, MillisLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return IoError("send timed out");
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return IoError(StrCat("send: ", std::strerror(errno)));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int rc = ::poll(&pf, 1, MillisLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return IoError("receive timed out");
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0) return IoError("connection closed by peer");
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return IoError(StrCat("recv: ", std::strerror(errno)));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::Ok();
}

StatusOr<std::string> LocalAddressFor(const std::string& peer) {
  ST_ASSIGN_OR_RETURN(auto res, Resolve(peer, 9, false, SOCK_DGRAM));
  for (addrinfo* a = res.get(); a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        ss.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr);
    if (inet_ntop(ss.ss_family, src, buf, sizeof(buf))) return std::string(buf);
  }
  return IoError(StrCat("no local address routes to ", peer));
}

StatusOr<int> PickFreePort(const std::string& host) {
  int port = 0;
  ST_ASSIGN_OR_RETURN(Fd fd, Listen(host, 0, &port));
  return port;
}

}  // namespace st::comm
