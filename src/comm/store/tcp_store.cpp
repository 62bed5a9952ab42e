#include "comm/store/tcp_store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace st::comm {

namespace {

// v2: requests carry a u64 sequence number that the reply echoes (v1 clients are turned away).
constexpr char kMagic[] = "STSTORE2";
constexpr uint32_t kMaxFrame = 64u << 20;  // bytes; a store value is small
constexpr auto kForever = std::chrono::hours(24 * 365);

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCas = 4, kWait = 5, kCheck = 6 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kDenied = 2, kBadRequest = 3 };

void PutU32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
void PutI64(std::string& s, int64_t v) {
  s.append(reinterpret_cast<const char*>(&v), 8);
}
void PutStr(std::string& s, const std::string& v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s += v;
}

// Reads fields from a request or reply; any overrun marks it bad.
struct Reader {
  std::string_view s;
  size_t pos = 0;
  bool bad = false;
  // noinline: GCC 12 otherwise reports a false -Wmaybe-uninitialized on short (SSO) strings.
  template <typename T>
  [[gnu::noinline]] T Fixed() {
    T v{};
    if (bad || s.size() - pos < sizeof(T)) {
      bad = true;
      return v;
    }
    std::memcpy(&v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string Str() {
    uint32_t n = Fixed<uint32_t>();
    if (bad || s.size() - pos < n) {
      bad = true;
      return {};
    }
    std::string v(s.substr(pos, n));
    pos += n;
    return v;
  }
};

Status SendFrame(int fd, const std::string& payload, Clock::time_point deadline) {
  std::string frame;
  frame.reserve(payload.size() + 4);
  PutU32(frame, static_cast<uint32_t>(payload.size()));
  frame += payload;
  return SendAll(fd, frame.data(), frame.size(), deadline);
}

StatusOr<std::string> RecvFrame(int fd, Clock::time_point deadline) {
  uint32_t n = 0;
  ST_RETURN_IF_ERROR(RecvAll(fd, &n, 4, deadline));
  if (n > kMaxFrame) return IoError(StrCat("store frame of ", n, " bytes is too large"));
  std::string payload(n, '\0');
  ST_RETURN_IF_ERROR(RecvAll(fd, payload.data(), n, deadline));
  return payload;
}

// Constant-time comparison, so the reply time does not leak how much of the secret matched.
bool SecretEquals(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

std::vector<std::string> ReadKeys(Reader& r) {
  uint32_t n = r.Fixed<uint32_t>();
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < n && !r.bad; ++i) keys.push_back(r.Str());
  return keys;
}

}  // namespace

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host, int port,
                                                                std::string secret) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->secret_ = std::move(secret);
  ST_ASSIGN_OR_RETURN(s->listen_fd_, Listen(host, port, &s->port_));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return IoError("pipe failed");
  s->stop_read_ = Fd(p[0]);
  s->stop_write_ = Fd(p[1]);
  s->accept_thread_ = std::thread([srv = s.get()] { srv->AcceptLoop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  char c = 1;
  if (::write(stop_write_.get(), &c, 1) < 0) {
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  table_.Stop();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(clients_mu_);
    // Only the receiving side: a reply being sent still goes out. (Rank 0 leaves as soon as the
    // last goodbye is in the table, while the thread that stored it may not have answered yet;
    // cutting that reply made the rank retry against a closed port for its whole timeout.)
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RD);
    threads.swap(client_threads_);
  }
  for (auto& t : threads) t.join();
}

void TcpStoreServer::AcceptLoop() {
  for (;;) {
    auto c = Accept(listen_fd_.get(), stop_read_.get());
    if (!c.ok() || !c->valid()) return;
    std::lock_guard<std::mutex> lock(clients_mu_);
    if (stopping_) return;
    client_fds_.push_back(c->get());
    client_threads_.emplace_back([this, fd = std::move(*c)]() mutable { Serve(std::move(fd)); });
  }
}

void TcpStoreServer::Serve(Fd client) {
  const int fd = client.get();
  // Handshake: the first frame must be the magic followed by the secret, within 10 s.
  auto hello = RecvFrame(fd, Clock::now() + std::chrono::seconds(10));
  const std::string expect = std::string(kMagic) + secret_;
  if (!hello.ok() || !SecretEquals(*hello, expect)) {
    ++rejected_;
    (void)SendFrame(fd, std::string(1, static_cast<char>(kDenied)),
                    Clock::now() + std::chrono::seconds(1));
  } else if (SendFrame(fd, std::string(1, static_cast<char>(kOk)),
                       Clock::now() + std::chrono::seconds(10))
                 .ok()) {
    bool keep_going = true;
    while (keep_going && !stopping_) {
      if (!HandleOne(fd, &keep_going).ok()) break;
    }
  }
  std::lock_guard<std::mutex> lock(clients_mu_);
  std::erase(client_fds_, fd);
  // `client` closes here, under the lock, so the destructor never shuts down a reused number.
  client.Reset();
}

StatusOr<StoreRequest> DecodeStoreRequest(std::string_view payload) {
  Reader r{payload};
  StoreRequest q;
  const uint8_t op = r.Fixed<uint8_t>();
  switch (op) {
    case kSet:
      q.keys = {r.Str()};
      q.value = r.Str();
      break;
    case kGet:
      q.keys = {r.Str()};
      q.number = r.Fixed<int64_t>();
      break;
    case kAdd:
      q.keys = {r.Str()};
      q.number = r.Fixed<int64_t>();
      break;
    case kCas:
      q.keys = {r.Str()};
      q.expected = r.Str();
      q.value = r.Str();
      break;
    case kWait:
      q.keys = ReadKeys(r);
      q.number = r.Fixed<int64_t>();
      break;
    case kCheck:
      q.keys = ReadKeys(r);
      break;
    default:
      return InvalidArgument(StrCat("store request with unknown op ", static_cast<int>(op)));
  }
  if (r.bad)
    return InvalidArgument(StrCat("store request (op ", static_cast<int>(op), ") runs past its ",
                                  payload.size(), "-byte frame"));
  if (r.pos != payload.size())
    return InvalidArgument(StrCat("store request (op ", static_cast<int>(op), ") has ",
                                  payload.size() - r.pos, " trailing bytes"));
  q.op = static_cast<StoreRequest::Op>(op);
  return q;
}

std::string ServeStoreRequest(KvTable& table, const StoreRequest& q) {
  std::string reply(1, static_cast<char>(kOk));
  // A client's timeout is any int64; clamp it so that the deadline arithmetic cannot overflow.
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(
                                           q.number, 0, kForever / std::chrono::milliseconds(1)));
  switch (q.op) {
    case StoreRequest::Op::kSet:
      table.Set(q.keys[0], q.value);
      break;
    case StoreRequest::Op::kGet:
      if (table.WaitFor(q.keys, deadline))
        PutStr(reply, table.GetExisting(q.keys[0]));
      else
        reply[0] = static_cast<char>(kTimeout);
      break;
    case StoreRequest::Op::kAdd:
      PutI64(reply, table.Add(q.keys[0], q.number));
      break;
    case StoreRequest::Op::kCas:
      PutStr(reply, table.CompareSet(q.keys[0], q.expected, q.value));
      break;
    case StoreRequest::Op::kWait:
      if (!table.WaitFor(q.keys, deadline)) reply[0] = static_cast<char>(kTimeout);
      break;
    case StoreRequest::Op::kCheck:
      reply.push_back(table.Check(q.keys) ? 1 : 0);
      break;
  }
  return reply;
}

Status TcpStoreServer::HandleOne(int fd, bool* keep_going) {
  ST_ASSIGN_OR_RETURN(std::string req, RecvFrame(fd, Clock::now() + kForever));
  // u64 sequence number, echoed in the reply, then the request.
  std::string reply;
  if (req.size() < 8) {
    reply = std::string(8, '\0') + static_cast<char>(kBadRequest);
    *keep_going = false;
  } else {
    reply = req.substr(0, 8);
    StatusOr<StoreRequest> q = DecodeStoreRequest(std::string_view(req).substr(8));
    if (q.ok()) {
      reply += ServeStoreRequest(table_, *q);
    } else {
      reply += static_cast<char>(kBadRequest);
      *keep_going = false;
    }
  }
  return SendFrame(fd, reply, Clock::now() + std::chrono::seconds(30));
}

StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    const std::string& host, int port, const std::string& secret, const StoreOptions& opts,
    std::chrono::milliseconds dead_peer) {
  std::unique_ptr<TcpStoreClient> c(new TcpStoreClient());
  c->host_ = host;
  c->port_ = port;
  c->secret_ = secret;
  c->where_ = StrCat("store ", host, ":", port);
  c->dead_peer_ = dead_peer;
  ST_RETURN_IF_ERROR(c->Open(Clock::now() + opts.timeout));
  c->reconnects_ = 0;
  return c;
}

Status TcpStoreClient::Open(Clock::time_point deadline) {
  fd_.Reset();
  ST_ASSIGN_OR_RETURN(Fd fd, ConnectWithRetry(host_, port_, deadline));
  if (dead_peer_.count() > 0) {
    // Probe an idle connection every second and give up on unacknowledged data (or probes) after
    // `dead_peer_`: a blocking get on a host that vanished fails then, not at its own timeout.
    const int one = 1, idle = 1, interval = 1;
    const int count = static_cast<int>(std::max<int64_t>(1, dead_peer_.count() / 1000));
    const unsigned user_timeout = static_cast<unsigned>(dead_peer_.count());
    setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  }
  Status st = SendFrame(fd.get(), std::string(kMagic) + secret_, deadline);
  StatusOr<std::string> reply = st.ok() ? RecvFrame(fd.get(), deadline) : StatusOr<std::string>(st);
  if (!reply.ok()) return reply.status().WithContext(where_);
  if (reply->size() != 1 || (*reply)[0] != static_cast<char>(kOk))
    return InvalidArgument(where_ + " rejected this client: wrong job secret (SLICETRAIN_SECRET)");
  fd_ = std::move(fd);
  ++reconnects_;
  return Status::Ok();
}

Status TcpStoreClient::Call(const std::string& request, std::string* reply,
                            std::chrono::milliseconds wait, bool blocking,
                            const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  // A blocking get/wait may legitimately take `wait`; allow 2 s more for the network. Other calls
  // are answered at once, so `wait` bounds the round trip.
  const auto deadline =
      Clock::now() + wait + (blocking ? std::chrono::seconds(2) : std::chrono::seconds(0));
  const std::string context = StrCat(where_, " (", what, "; is rank 0 still alive?)");
  // The previous call failed on the wire: its reply (if any) died with that connection.
  if (!fd_.valid()) {
    Status opened = Open(deadline);
    if (!opened.ok()) return opened.WithContext(context);
  }
  const uint64_t seq = ++seq_;
  std::string frame;
  frame.reserve(8 + request.size());
  PutI64(frame, static_cast<int64_t>(seq));
  frame += request;
  Status st = SendFrame(fd_.get(), frame, deadline);
  StatusOr<std::string> r = st.ok() ? RecvFrame(fd_.get(), deadline) : StatusOr<std::string>(st);
  // Whatever goes wrong from here on leaves the connection in an unknown state: close it.
  if (!r.ok()) {
    fd_.Reset();
    return r.status().WithContext(context);
  }
  Reader rr{*r};
  const auto echoed = static_cast<uint64_t>(rr.Fixed<int64_t>());
  const uint8_t code = rr.Fixed<uint8_t>();
  if (rr.bad || echoed != seq) {
    fd_.Reset();
    return Internal(rr.bad ? StrCat(where_, ": malformed reply to ", what)
                           : StrCat(where_, ": reply to request #", echoed, " while waiting for #",
                                    seq, " (", what, "); connection closed"));
  }
  switch (code) {
    case kOk:
      *reply = r->substr(rr.pos);
      return Status::Ok();
    case kTimeout:
      return Unavailable(StrCat(where_, ": ", what, " timed out after ", wait.count(), " ms"));
    default:
      fd_.Reset();
      return Internal(StrCat(where_, ": server refused ", what));
  }
}

Status TcpStoreClient::Set(const std::string& key, const std::string& value,
                           const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kSet)), reply;
  PutStr(req, key);
  PutStr(req, value);
  return Call(req, &reply, opts.timeout, false, "set " + key);
}

StatusOr<std::string> TcpStoreClient::Get(const std::string& key, const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kGet)), reply;
  PutStr(req, key);
  PutI64(req, opts.timeout.count());
  ST_RETURN_IF_ERROR(Call(req, &reply, opts.timeout, true, "get " + key));
  Reader r{reply};
  std::string v = r.Str();
  if (r.bad) return Internal(where_ + ": malformed reply to get");
  return v;
}

StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta,
                                      const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kAdd)), reply;
  PutStr(req, key);
  PutI64(req, delta);
  ST_RETURN_IF_ERROR(Call(req, &reply, opts.timeout, false, "add " + key));
  Reader r{reply};
  int64_t v = r.Fixed<int64_t>();
  if (r.bad) return Internal(where_ + ": malformed reply to add");
  return v;
}

StatusOr<std::string> TcpStoreClient::CompareSet(const std::string& key,
                                                 const std::string& expected,
                                                 const std::string& desired,
                                                 const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kCas)), reply;
  PutStr(req, key);
  PutStr(req, expected);
  PutStr(req, desired);
  ST_RETURN_IF_ERROR(Call(req, &reply, opts.timeout, false, "compare_set " + key));
  Reader r{reply};
  std::string v = r.Str();
  if (r.bad) return Internal(where_ + ": malformed reply to compare_set");
  return v;
}

Status TcpStoreClient::Wait(const std::vector<std::string>& keys, const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kWait)), reply, names;
  PutU32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    PutStr(req, k);
    names += (names.empty() ? "" : ", ") + k;
  }
  PutI64(req, opts.timeout.count());
  return Call(req, &reply, opts.timeout, true, "wait for [" + names + "]");
}

StatusOr<bool> TcpStoreClient::Check(const std::vector<std::string>& keys,
                                     const StoreOptions& opts) {
  std::string req(1, static_cast<char>(kCheck)), reply;
  PutU32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) PutStr(req, k);
  ST_RETURN_IF_ERROR(Call(req, &reply, opts.timeout, false, "check"));
  return !reply.empty() && reply[0] == 1;
}

}  // namespace st::comm
