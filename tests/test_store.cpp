// Rendezvous stores: memory, TCP (with its secret) and prefix; blocking calls honour timeouts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "comm/store/socket.h"
#include "comm/store/store.h"
#include "comm/store/tcp_store.h"

namespace st::comm {
namespace {

using std::chrono::milliseconds;

// `other` sets the key a blocked Get waits for (a TCP client serialises its own calls).
void ExerciseStore(Store& s, Store& other) {
  ASSERT_TRUE(s.Set("a", "1", {}).ok());
  auto v = s.Get("a", {});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "1");
  EXPECT_EQ(*s.Add("n", 5, {}), 5);
  EXPECT_EQ(*s.Add("n", -2, {}), 3);
  // compare-set: absent key matches "", wrong expectation leaves the value alone.
  EXPECT_EQ(*s.CompareSet("c", "", "x", {}), "x");
  EXPECT_EQ(*s.CompareSet("c", "y", "z", {}), "x");
  EXPECT_EQ(*s.CompareSet("c", "x", "z", {}), "z");
  EXPECT_TRUE(*s.Check({"a", "c"}, {}));
  EXPECT_FALSE(*s.Check({"a", "missing"}, {}));
  // Binary values survive.
  std::string bin("\0\x01\xff", 3);
  ASSERT_TRUE(s.Set("bin", bin, {}).ok());
  EXPECT_EQ(*s.Get("bin", {}), bin);
  // A get that waits for a later set.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(other.Set("late", "v", {}).ok());
  });
  auto late = s.Get("late", {milliseconds(5000)});
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status().message();
  EXPECT_EQ(*late, "v");
  // Timeouts return an error that names the key, never hang.
  auto t0 = std::chrono::steady_clock::now();
  auto miss = s.Get("never", {milliseconds(100)});
  EXPECT_FALSE(miss.ok());
  EXPECT_NE(miss.status().message().find("never"), std::string::npos) << miss.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE(s.Wait({"a", "never"}, {milliseconds(100)}).ok());
}

TEST(MemoryStore, Semantics) {
  MemoryStore s;
  ExerciseStore(s, s);
}

TEST(TcpStore, SemanticsAndManyClients) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "s3cret");
  ASSERT_TRUE(server.ok()) << server.status().message();
  const int port = (*server)->port();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, "s3cret");
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto c2 = TcpStoreClient::Connect("127.0.0.1", port, "s3cret");
  ASSERT_TRUE(c2.ok());
  ExerciseStore(**c, **c2);
  // 16 clients increment one counter concurrently and meet at a barrier.
  std::vector<std::thread> ts;
  for (int i = 0; i < 16; ++i)
    ts.emplace_back([port] {
      auto ci = TcpStoreClient::Connect("127.0.0.1", port, "s3cret");
      ASSERT_TRUE(ci.ok());
      for (int k = 0; k < 10; ++k) ASSERT_TRUE((*ci)->Add("counter", 1, {}).ok());
      ASSERT_TRUE(StoreBarrier(**ci, "b", 16, {milliseconds(10000)}).ok());
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(*(*c)->Add("counter", 0, {}), 160);
}

TEST(TcpStore, RejectsWrongSecret) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "right");
  ASSERT_TRUE(server.ok());
  auto c = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), "wrong", {milliseconds(3000)});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("secret"), std::string::npos) << c.status().message();
  EXPECT_EQ((*server)->rejected_clients(), 1);
}

TEST(TcpStore, ClientFailsFastWhenServerGoes) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "k");
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, "k");
  ASSERT_TRUE(c.ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server.value().reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto v = (*c)->Get("never", {std::chrono::seconds(30)});
  killer.join();
  EXPECT_FALSE(v.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Connecting to nothing times out with the address in the message.
  auto none = TcpStoreClient::Connect("127.0.0.1", port, "k", {milliseconds(300)});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("127.0.0.1"), std::string::npos);
}

// A store server that misbehaves on purpose: it admits every client, then hands each connection
// (numbered from 0) to a script that reads requests and writes whatever replies it likes.
class FakeStoreServer {
 public:
  using Script = std::function<void(int conn, int fd)>;
  explicit FakeStoreServer(Script script) : script_(std::move(script)) {
    auto l = Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(l.ok());
    listen_ = std::move(*l);
    int p[2];
    EXPECT_EQ(pipe2(p, O_CLOEXEC), 0);
    stop_r_ = Fd(p[0]);
    stop_w_ = Fd(p[1]);
    thread_ = std::thread([this] {
      for (int conn = 0;; ++conn) {
        auto c = Accept(listen_.get(), stop_r_.get());
        if (!c.ok() || !c->valid()) return;
        Fd fd = std::move(*c);
        if (!ReadFrame(fd.get()).has_value()) continue;  // the hello
        SendFrame(fd.get(), std::string(1, '\0'));       // admitted
        script_(conn, fd.get());
      }
    });
  }
  ~FakeStoreServer() {
    char c = 1;
    EXPECT_EQ(::write(stop_w_.get(), &c, 1), 1);
    thread_.join();
  }
  int port() const { return port_; }

  static std::optional<std::string> ReadFrame(int fd) {
    uint32_t n = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    if (!RecvAll(fd, &n, 4, deadline).ok()) return std::nullopt;
    std::string s(n, '\0');
    if (!RecvAll(fd, s.data(), n, deadline).ok()) return std::nullopt;
    return s;
  }
  static void SendFrame(int fd, const std::string& payload) {
    const auto n = static_cast<uint32_t>(payload.size());
    std::string f(reinterpret_cast<const char*>(&n), 4);
    f += payload;
    (void)SendAll(fd, f.data(), f.size(), Clock::now() + std::chrono::seconds(10));
  }
  // The sequence number that starts a request frame.
  static uint64_t Seq(const std::string& request) {
    uint64_t seq = 0;
    std::memcpy(&seq, request.data(), 8);
    return seq;
  }
  // An "ok" reply to request `seq` carrying the i64 `value` (the reply to an add).
  static std::string AddReply(uint64_t seq, int64_t value) {
    std::string r(reinterpret_cast<const char*>(&seq), 8);
    r.push_back('\0');
    r.append(reinterpret_cast<const char*>(&value), 8);
    return r;
  }

 private:
  Script script_;
  int port_ = 0;
  Fd listen_, stop_r_, stop_w_;
  std::thread thread_;
};

// The reply to a call the client gave up on arrives late: the client closed that connection, so
// the next call, on a new one, gets its own reply (before, it read the stale one).
TEST(TcpStoreClient, ALateReplyIsNeverTakenForTheNextCallsReply) {
  FakeStoreServer server([](int conn, int fd) {
    if (conn == 0) {
      auto req = FakeStoreServer::ReadFrame(fd);
      ASSERT_TRUE(req.has_value());
      std::this_thread::sleep_for(milliseconds(600));  // past the client's 200 ms
      FakeStoreServer::SendFrame(fd, FakeStoreServer::AddReply(FakeStoreServer::Seq(*req), 111));
      std::this_thread::sleep_for(milliseconds(200));
      return;
    }
    while (auto req = FakeStoreServer::ReadFrame(fd))
      FakeStoreServer::SendFrame(fd, FakeStoreServer::AddReply(FakeStoreServer::Seq(*req), 222));
  });
  auto c = TcpStoreClient::Connect("127.0.0.1", server.port(), "k");
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto first = (*c)->Add("x", 1, {milliseconds(200)});
  EXPECT_FALSE(first.ok());
  std::this_thread::sleep_for(milliseconds(700));  // the late reply has been sent by now
  auto second = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(*second, 222);
  EXPECT_EQ((*c)->reconnects(), 1);
}

// A server that answers one request twice: the duplicate carries the old sequence number, so the
// next call fails (never returns the duplicate's value) and the one after works on a new
// connection.
TEST(TcpStoreClient, ADuplicateReplyIsRefusedAndTheConnectionReplaced) {
  FakeStoreServer server([](int conn, int fd) {
    int64_t value = conn == 0 ? 7 : 9;
    while (auto req = FakeStoreServer::ReadFrame(fd)) {
      const uint64_t seq = FakeStoreServer::Seq(*req);
      FakeStoreServer::SendFrame(fd, FakeStoreServer::AddReply(seq, value));
      if (conn == 0) FakeStoreServer::SendFrame(fd, FakeStoreServer::AddReply(seq, value));
    }
  });
  auto c = TcpStoreClient::Connect("127.0.0.1", server.port(), "k");
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto a = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(*a, 7);
  std::this_thread::sleep_for(milliseconds(100));  // the duplicate is in the socket
  auto b = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_FALSE(b.ok()) << "returned another request's reply: " << *b;
  EXPECT_NE(b.status().message().find("reply to request #1 while waiting for #2"),
            std::string::npos)
      << b.status().message();
  auto d = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(*d, 9);
}

// The server closes the connection in the middle of a reply: that call fails with the address in
// its message, and the next one reconnects.
TEST(TcpStoreClient, AReplyCutShortFailsThatCallOnly) {
  FakeStoreServer server([](int conn, int fd) {
    while (auto req = FakeStoreServer::ReadFrame(fd)) {
      std::string reply = FakeStoreServer::AddReply(FakeStoreServer::Seq(*req), 5);
      if (conn == 0) {
        const uint32_t n = static_cast<uint32_t>(reply.size());
        std::string part(reinterpret_cast<const char*>(&n), 4);
        part += reply.substr(0, 6);
        (void)SendAll(fd, part.data(), part.size(), Clock::now() + std::chrono::seconds(1));
        return;  // closes mid-reply
      }
      FakeStoreServer::SendFrame(fd, reply);
    }
  });
  auto c = TcpStoreClient::Connect("127.0.0.1", server.port(), "k");
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto a = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("127.0.0.1:"), std::string::npos) << a.status().message();
  auto b = (*c)->Add("x", 1, {milliseconds(2000)});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(*b, 5);
  EXPECT_EQ((*c)->reconnects(), 1);
}

// The real server restarted between two calls (rank 0's host restarted its worker): the client's
// next call reconnects with the secret and works on the new server.
TEST(TcpStoreClient, ReconnectsToARestartedServer) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "k");
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, "k");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Set("a", "1", {}).ok());
  server->reset();
  EXPECT_FALSE((*c)->Get("a", {milliseconds(500)}).ok());
  auto again = TcpStoreServer::Start("127.0.0.1", port, "k");
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_TRUE((*c)->Set("b", "2", {milliseconds(2000)}).ok());
  EXPECT_EQ(*(*c)->Get("b", {}), "2");
  EXPECT_FALSE(*(*c)->Check({"a"}, {}));  // a new table
}

TEST(PrefixStore, IsolatesGroups) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore a("g1", base), b("g2", base);
  ASSERT_TRUE(a.Set("k", "A", {}).ok());
  ASSERT_TRUE(b.Set("k", "B", {}).ok());
  EXPECT_EQ(*a.Get("k", {}), "A");
  EXPECT_EQ(*b.Get("k", {}), "B");
  EXPECT_EQ(*base->Get("g1/k", {}), "A");
  EXPECT_TRUE(*a.Check({"k"}, {}));
  EXPECT_FALSE(*a.Check({"other"}, {}));
  ExerciseStore(a, a);
}

// The server's request decoding (fuzz/fuzz_store_protocol.cpp fuzzes it) rejects what a client
// never sends, and serving never overflows: a huge timeout, an Add past INT64_MAX.
TEST(StoreProtocol, DecodeRejectsMalformedRequests) {
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto i64 = [](int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  // Request bytes from parts (appends: GCC 12 warns falsely on "literal" + std::string).
  auto req = [](std::initializer_list<std::string> parts) {
    std::string r;
    for (const std::string& p : parts) r.append(p);
    return r;
  };
  const std::string set = req({"\x01", u32(1), "k", u32(1), "v"});
  auto ok = DecodeStoreRequest(set);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->keys, std::vector<std::string>{"k"});
  EXPECT_EQ(ok->value, "v");
  EXPECT_FALSE(DecodeStoreRequest("").ok());
  EXPECT_FALSE(DecodeStoreRequest("\x09").ok());                           // unknown op
  EXPECT_FALSE(DecodeStoreRequest(set.substr(0, set.size() - 1)).ok());    // truncated
  EXPECT_FALSE(DecodeStoreRequest(req({set, "x"})).ok());                  // trailing bytes
  EXPECT_FALSE(DecodeStoreRequest(req({"\x01", u32(0xffffffffu)})).ok());  // length past the end
  EXPECT_FALSE(DecodeStoreRequest(req({"\x05", u32(1000000), u32(0)})).ok());  // keys past the end

  KvTable table;
  table.Set("k", "v");
  auto get = DecodeStoreRequest(req({"\x02", u32(1), "k", i64(INT64_MAX)}));
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(ServeStoreRequest(table, *get), req({std::string(1, '\0'), u32(1), "v"}));
  auto add = DecodeStoreRequest(req({"\x03", u32(1), "n", i64(INT64_MAX)}));
  ASSERT_TRUE(add.ok());
  (void)ServeStoreRequest(table, *add);
  EXPECT_EQ(ServeStoreRequest(table, *add), req({std::string(1, '\0'), i64(-2)}));  // wraps
}

}  // namespace
}  // namespace st::comm
