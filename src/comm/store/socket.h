// Move-only TCP socket owner and the few blocking helpers the store needs, each with a deadline.
// Not a general networking library: IPv4/IPv6 stream sockets, whole-message send/recv only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/fd.h"
#include "core/status.h"

namespace st::comm {

using Clock = std::chrono::steady_clock;

using ::st::Fd;  // core/fd.h

// Listens on host:port (port 0 picks a free one). host "" or "0.0.0.0" means every interface.
StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port);
// Connects, retrying refused connections until the deadline (the server may start later).
StatusOr<Fd> ConnectWithRetry(const std::string& host, int port, Clock::time_point deadline);
// Waits for an incoming connection or for `stop_fd` to become readable; returns an invalid Fd on
// stop.
StatusOr<Fd> Accept(int listen_fd, int stop_fd);

Status SendAll(int fd, const void* data, size_t n, Clock::time_point deadline);
Status RecvAll(int fd, void* data, size_t n, Clock::time_point deadline);

// The local address this machine would use to reach `peer` (no packet is sent); "127.0.0.1" for
// loopback peers. Used to name a worker's host address in output and for the Gloo device.
StatusOr<std::string> LocalAddressFor(const std::string& peer);
// A currently free TCP port on `host` (best effort: another process may take it afterwards).
StatusOr<int> PickFreePort(const std::string& host);

}  // namespace st::comm
