// Gloo process groups with threads as ranks: bf16, in-place all_gather, the ring buffer and comm
// thread, a timeout naming the missing rank, and the pair handshake. Every collective at world
// sizes 1..16 on every transport is in test_transports.cpp.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "comm/gloo/gloo_process_group.h"
#include "comm/store/store.h"
#include "core/dtype.h"
#include "test_util.h"

namespace st::comm {
namespace {

using std::chrono::milliseconds;

// Runs fn(pg) on `world` threads, each a rank of one Gloo group on a shared MemoryStore.
void RunRanks(int world, const std::function<void(ProcessGroup&)>& fn,
              const std::string& name = "world") {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      GroupOptions o;
      o.name = name;
      o.connect_timeout = milliseconds(30000);
      auto pg = CreateGlooProcessGroup(store, r, world, o);
      ASSERT_TRUE(pg.ok()) << pg.status().message();
      fn(**pg);
    });
  for (auto& t : ts) t.join();
}

// Rank r's value at index i: a small integer, so sums are exact in f32 and bf16-representable.
float Val(int r, int64_t i) {
  return static_cast<float>((r + 1) * ((i % 7) + 1));
}

TEST(Collectives, BF16AllGatherAndAllReduce) {
  const int P = 6;
  const int64_t n = 1001;
  RunRanks(P, [&](ProcessGroup& pg) {
    std::vector<uint16_t> mine(n), all(n * P);
    for (int64_t i = 0; i < n; ++i) mine[i] = FloatToBF16(Val(pg.rank(), i));
    ASSERT_TRUE(pg.AllGather(mine.data(), all.data(), n, DType::kBF16).ok());
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(BF16ToFloat(all[q * n + i]), Val(q, i));
    ASSERT_TRUE(pg.AllReduce(mine.data(), n, DType::kBF16, ReduceOp::kSum).ok());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(BF16ToFloat(mine[i]), ((i % 7) + 1) * 21.0f);
    std::vector<uint16_t> b(n, FloatToBF16(static_cast<float>(pg.rank())));
    ASSERT_TRUE(pg.Broadcast(b.data(), n, DType::kBF16, 2).ok());
    EXPECT_EQ(BF16ToFloat(b[n - 1]), 2.0f);
  });
}

TEST(Collectives, InPlaceAllGather) {
  const int P = 5;
  const int64_t n = 333;
  RunRanks(P, [&](ProcessGroup& pg) {
    std::vector<float> flat(n * P, -1.f);
    float* mine = flat.data() + pg.rank() * n;
    for (int64_t i = 0; i < n; ++i) mine[i] = Val(pg.rank(), i);
    ASSERT_TRUE(pg.AllGather(mine, flat.data(), n, DType::kF32).ok());
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(flat[q * n + i], Val(q, i));
  });
}

TEST(Collectives, SequenceNumbersRingBufferAndCommThread) {
  RunRanks(3, [&](ProcessGroup& pg) {
    float x = 1.f;
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kMax).ok());
    EXPECT_EQ(pg.seq(), 40u);
    const std::string ring = pg.RecentCollectives();
    EXPECT_NE(ring.find("#40 all_reduce(max)"), std::string::npos) << ring;
    EXPECT_EQ(ring.find("#8 "), std::string::npos) << "ring keeps only the last 32";
    CommThread comm;
    std::vector<float> in(4, 1.f), out(12);
    auto f = comm.Submit([&] { return pg.AllGather(in.data(), out.data(), 4, DType::kF32); });
    ASSERT_TRUE(f.get().ok());
    EXPECT_EQ(out[11], 1.f);
  });
}

TEST(Collectives, TimeoutNamesOpAndMissingRanks) {
  // Rank 2 of 4 never calls the second all_reduce: the others time out naming it.
  RunRanks(4, [&](ProcessGroup& pg) {
    float x = 1.f;
    ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).ok());
    if (pg.rank() == 2) {
      std::this_thread::sleep_for(milliseconds(3000));
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    Status st = pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {milliseconds(800)});
    ASSERT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_NE(st.message().find("all_reduce(sum) #2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("ranks not seen at #2: 2 (last seen at #1)"), std::string::npos)
        << st.message();
    // The group is now broken: later calls fail at once.
    EXPECT_FALSE(pg.Barrier({milliseconds(100)}).ok());
  });
}

}  // namespace
}  // namespace st::comm

namespace st::comm {
namespace {

// Forms a group of `world` thread ranks on one store; rank r uses keys[r]. Returns each rank's
// result ("" = formed, else the error) after checking the formed groups work.
std::vector<std::string> FormWithKeys(std::shared_ptr<Store> store,
                                      const std::vector<std::string>& keys, milliseconds timeout) {
  const int world = static_cast<int>(keys.size());
  std::vector<std::string> result(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      GroupOptions o;
      o.connect_timeout = timeout;
      o.auth_key = keys[r];
      auto pg = CreateGlooProcessGroup(store, r, world, o);
      if (!pg.ok()) {
        result[r] = pg.status().message();
        return;
      }
      float x = 1;
      Status st = (*pg)->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {timeout});
      if (!st.ok())
        result[r] = "formed, then: " + st.message();
      else if (x != static_cast<float>(world))
        result[r] = "formed, then a wrong sum";
    });
  for (auto& t : ts) t.join();
  return result;
}

TEST(GlooAuth, RanksWithTheSameSecretFormTheGroup) {
  for (int world : {2, 3}) {
    auto result = FormWithKeys(std::make_shared<MemoryStore>(),
                               std::vector<std::string>(world, "s3cret"), milliseconds(10000));
    for (int r = 0; r < world; ++r) EXPECT_EQ(result[r], "") << "rank " << r;
  }
}

// A rank that holds another secret is refused by every peer, and refuses them, by name.
TEST(GlooAuth, APeerWithoutTheSecretIsRefusedByName) {
  const auto start = std::chrono::steady_clock::now();
  auto result = FormWithKeys(std::make_shared<MemoryStore>(), {"s3cret", "s3cret", "guess"},
                             milliseconds(10000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(9)) << "no waiting";
  for (int r : {0, 1}) {
    EXPECT_NE(result[r].find("the connection of rank(s) 2 did not prove the job secret"),
              std::string::npos)
        << "rank " << r << ": " << result[r];
  }
  EXPECT_NE(result[2].find("the connection of rank(s) 0, 1 did not prove the job secret"),
            std::string::npos)
      << result[2];
}

// A store that lets a stranger connect to every TCP port this process listens on just before a
// rank publishes its addresses, so the stranger reaches each Gloo pair's listening socket before
// any rank can (Gloo's pair takes the first connection that arrives).
class StrangerFirstStore final : public Store {
 public:
  StrangerFirstStore(std::shared_ptr<Store> inner, std::string say)
      : inner_(std::move(inner)), say_(std::move(say)) {}
  ~StrangerFirstStore() override {
    for (int fd : fds_) ::close(fd);
  }
  int connections() const { return static_cast<int>(fds_.size()); }
  Status Set(const std::string& key, const std::string& value, const StoreOptions& opts) override {
    ConnectToNewPorts();
    return inner_->Set(key, value, opts);
  }
  StatusOr<std::string> Get(const std::string& key, const StoreOptions& opts) override {
    return inner_->Get(key, opts);
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, const StoreOptions& opts) override {
    return inner_->Add(key, delta, opts);
  }
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired, const StoreOptions& opts) override {
    return inner_->CompareSet(key, expected, desired, opts);
  }
  Status Wait(const std::vector<std::string>& keys, const StoreOptions& opts) override {
    return inner_->Wait(keys, opts);
  }
  StatusOr<bool> Check(const std::vector<std::string>& keys, const StoreOptions& opts) override {
    return inner_->Check(keys, opts);
  }

 private:
  void ConnectToNewPorts() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::set<std::string> mine = test::SocketInodes(::getpid());
    for (const test::ListeningSocket& s : test::ListeningSockets()) {
      if (!mine.count(s.inode) || !ports_.insert(s.port).second) continue;
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(s.port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(fd);
        continue;
      }
      if (!say_.empty()) (void)!::write(fd, say_.data(), say_.size());
      fds_.push_back(fd);
    }
  }
  std::shared_ptr<Store> inner_;
  std::string say_;
  std::mutex mu_;
  std::set<int> ports_;
  std::vector<int> fds_;
};

// A process outside the job that holds a collective port (silent, or sending junk) never becomes
// part of a group: forming fails on the ranks it reached, with an error, within the timeout, and
// nothing crashes.
TEST(GlooAuth, AStrangerOnACollectivePortNeverJoins) {
  for (const std::string& say :
       {std::string(), std::string(64, '\x7f'), std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")}) {
    SCOPED_TRACE(say.empty() ? "silent stranger" : "stranger sends " + std::to_string(say.size()));
    auto store = std::make_shared<StrangerFirstStore>(std::make_shared<MemoryStore>(), say);
    const auto start = std::chrono::steady_clock::now();
    auto result = FormWithKeys(store, {"s3cret", "s3cret"}, milliseconds(3000));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    EXPECT_GT(store->connections(), 0) << "the stranger reached no port";
    int failed = 0;
    for (int r = 0; r < 2; ++r) {
      if (result[r].empty()) continue;
      ++failed;
      EXPECT_EQ(result[r].find("formed, then"), std::string::npos) << result[r];
    }
    EXPECT_EQ(failed, 2) << "rank 0: " << result[0] << "\nrank 1: " << result[1];
    std::printf("rank 0: %s\nrank 1: %s\n", result[0].c_str(), result[1].c_str());
  }
}

}  // namespace
}  // namespace st::comm
