// Rendezvous stores: memory, TCP (with its secret) and prefix; blocking calls honour timeouts.
#include <gtest/gtest.h>

#include <thread>

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
