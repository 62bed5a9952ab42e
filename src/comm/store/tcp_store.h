// The TCP rendezvous store: rank 0 serves a KvTable at MASTER_ADDR:MASTER_PORT; every rank
// (rank 0 included) talks to it through a TcpStoreClient. A client must present the job's secret
// in its first message or the server closes the connection. Protocol: docs/runtime.md.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/store/socket.h"
#include "comm/store/store.h"

namespace st::comm {

// One client request as the server sees it, decoded from a frame's payload (the bytes after the
// 4-byte length; layout in docs/runtime.md). Decoding is a pure function so that it can be tested
// and fuzzed without sockets (fuzz/fuzz_store_protocol.cpp).
struct StoreRequest {
  enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCas = 4, kWait = 5, kCheck = 6 };
  Op op = Op::kSet;
  std::vector<std::string> keys;  // one for set/get/add/compare_set; any number for wait/check
  std::string value;              // set: the value; compare_set: the desired value
  std::string expected;           // compare_set only
  int64_t number = 0;             // get/wait: timeout in ms; add: the delta
};

// InvalidArgument for an unknown op, a length running past the payload, or trailing bytes.
StatusOr<StoreRequest> DecodeStoreRequest(std::string_view payload);
// Serves a decoded request against `table` (get/wait block up to their timeout, clamped to
// [0, one year]) and returns the reply payload: a status byte, then the op's fields.
std::string ServeStoreRequest(KvTable& table, const StoreRequest& request);

// Serves the store on its own threads (one accept thread, one thread per client) until destroyed.
class TcpStoreServer {
 public:
  // host "" binds every interface; port 0 picks a free port (see port()).
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port,
                                                         std::string secret);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  int rejected_clients() const { return rejected_.load(); }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(Fd client);
  Status HandleOne(int fd, bool* keep_going);

  std::string secret_;
  int port_ = 0;
  Fd listen_fd_;
  Fd stop_read_, stop_write_;
  KvTable table_;
  std::thread accept_thread_;
  std::mutex clients_mu_;
  std::vector<std::thread> client_threads_;
  std::vector<int> client_fds_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> rejected_{0};
};

// A client never reads a reply that is not its own: every request carries a sequence number the
// server echoes, and a call that fails on the wire (timeout, reset, a reply with another number or
// malformed) closes the connection; the next call opens a new one (with the secret) first. A
// server that answered "timeout" to a blocking get/wait leaves the connection in use.
class TcpStoreClient final : public Store {
 public:
  // Connects (retrying until opts.timeout: the server may start later) and authenticates.
  // `dead_peer` > 0 bounds how long the connection survives a silent peer (a host or link that is
  // gone): TCP keepalive probes every second and TCP_USER_TIMEOUT, so that even a blocking get
  // fails within about `dead_peer` instead of its own timeout.
  static StatusOr<std::unique_ptr<TcpStoreClient>> Connect(
      const std::string& host, int port, const std::string& secret, const StoreOptions& opts = {},
      std::chrono::milliseconds dead_peer = std::chrono::milliseconds(0));
  Status Set(const std::string& key, const std::string& value, const StoreOptions& opts) override;
  StatusOr<std::string> Get(const std::string& key, const StoreOptions& opts) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, const StoreOptions& opts) override;
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired, const StoreOptions& opts) override;
  Status Wait(const std::vector<std::string>& keys, const StoreOptions& opts) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys, const StoreOptions& opts) override;

 private:
  TcpStoreClient() = default;
  // Opens and authenticates a connection, retrying refused connects until `deadline`.
  Status Open(Clock::time_point deadline);
  // Sends one request and reads its reply; `reply` gets the payload after the status byte.
  // `blocking`: the server may hold the reply for `wait` (get, wait), so the deadline is `wait`
  // plus a network allowance; other calls must be answered within `wait`.
  Status Call(const std::string& request, std::string* reply, std::chrono::milliseconds wait,
              bool blocking, const std::string& what);

  std::mutex mu_;
  Fd fd_;  // invalid after a failed call, until the next call reconnects
  std::string host_, secret_, where_;
  int port_ = 0;
  std::chrono::milliseconds dead_peer_{0};
  uint64_t seq_ = 0;  // of the last request sent
  int reconnects_ = 0;

 public:
  // Connections opened after the first (for tests and the fault docs).
  int reconnects() const { return reconnects_; }
};

}  // namespace st::comm
