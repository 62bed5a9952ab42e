// The transports side by side (comm/group.h): TCP (Gloo), shared memory, and the hierarchical
// group (shared memory within a host, TCP across hosts; here several "hosts" are threads of this
// process with different host keys). Every collective, f32 and bf16, sizes from one element to
// 64 MiB, uneven shards, 1-4 ranks per host and 1-3 hosts. Results are checked three ways:
// exact for small-integer inputs (every order gives the same float); bit for bit against the
// rank-order reference where the transport reduces in rank order (shared memory); within f32
// tolerance where it does not (TCP rings, hierarchical). Every rank must hold the same bits.
// Then the failure paths: a timeout naming the missing rank, a peer process that dies, and no
// shared segment or descriptor left behind.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "comm/group.h"
#include "comm/store/store.h"
#include "core/dtype.h"
#include "proc_util.h"
#include "test_util.h"

namespace st::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A way to build a group: the transport, and how many hosts the ranks pretend to be on.
struct Layout {
  std::string label;
  Transport transport;
  int hosts = 1;  // ranks [h * P / hosts, (h + 1) * P / hosts) share host key h
  int ranks = 1;
  size_t slot_bytes = 0;
  bool rank_order = false;  // reduces in rank order: bit-exact against the reference
};

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return info.param.label;
}

// Runs fn(pg) on setup.ranks threads, each a rank of one group on a shared MemoryStore.
void RunRanks(const Layout& s, const std::function<void(ProcessGroup&)>& fn) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> ts;
  for (int r = 0; r < s.ranks; ++r)
    ts.emplace_back([&, r] {
      GroupOptions o;
      o.connect_timeout = milliseconds(30000);
      o.transport = s.transport;
      o.host_key = StrCat("host", r * s.hosts / s.ranks);
      o.shm_slot_bytes = s.slot_bytes;
      auto pg = CreateProcessGroup(store, r, s.ranks, o);
      ASSERT_TRUE(pg.ok()) << pg.status().message();
      fn(**pg);
    });
  for (auto& t : ts) t.join();
}

float Val(int r, int64_t i) {
  return static_cast<float>((r + 1) * ((i % 7) + 1));
}

// Random inputs of rank r, rounded to bf16 when the buffer is bf16.
std::vector<float> Inputs(int r, int64_t n, DType dt) {
  std::vector<float> v = test::RandomVec(n, 1000 + r);
  if (dt == DType::kBF16)
    for (float& x : v) x = BF16ToFloat(FloatToBF16(x));
  return v;
}

// Rank-order reduction of every rank's inputs: ((x0 op x1) op x2) ..., in f32.
std::vector<float> Reference(int P, int64_t n, DType dt, ReduceOp op) {
  std::vector<float> acc = Inputs(0, n, dt);
  for (int p = 1; p < P; ++p) {
    const std::vector<float> x = Inputs(p, n, dt);
    for (int64_t i = 0; i < n; ++i)
      acc[i] = op == ReduceOp::kMax   ? std::max(acc[i], x[i])
               : op == ReduceOp::kMin ? std::min(acc[i], x[i])
                                      : acc[i] + x[i];
  }
  if (op == ReduceOp::kAvg)
    for (float& a : acc) a *= 1.0f / static_cast<float>(P);
  return acc;
}

// Buffer of n elements of dtype dt holding v.
std::vector<char> Pack(const std::vector<float>& v, DType dt) {
  std::vector<char> out(v.size() * DTypeSize(dt));
  ConvertFromF32(dt, v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}
std::vector<float> Unpack(const std::vector<char>& b, DType dt) {
  std::vector<float> out(b.size() / DTypeSize(dt));
  ConvertToF32(dt, b.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}

// memcmp that accepts empty (possibly null) ranges.
bool SameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// Every rank's copy of `bytes` equal to rank 0's (all_reduce must give every rank the same bits).
void ExpectSameOnEveryRank(ProcessGroup& pg, const std::vector<char>& bytes) {
  std::vector<char> all(bytes.size() * pg.size());
  ASSERT_TRUE(
      pg.AllGather(bytes.data(), all.data(), static_cast<int64_t>(bytes.size() / 2), DType::kBF16)
          .ok());
  for (int p = 1; p < pg.size(); ++p)
    ASSERT_TRUE(SameBytes(all.data(), all.data() + p * bytes.size(), bytes.size()))
        << "rank " << p << " differs from rank 0";
}

class Transports : public ::testing::TestWithParam<Layout> {};

TEST_P(Transports, ExactResultsForEveryCollective) {
  const Layout s = GetParam();
  const int P = s.ranks;
  const std::vector<int64_t> counts = {0, 1, 13, 256, 1000003 / (P * 4) * 4 + 3};
  // One host: shared memory; several with more than one rank each: hierarchical; else TCP.
  const std::string want = s.transport == Transport::kTcp ? "tcp"
                           : s.hosts == 1                 ? "shm"
                           : s.ranks / s.hosts > 1        ? "shm+tcp"
                                                          : "tcp";
  RunRanks(s, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.transport(), want);
    const int r = pg.rank();
    const int64_t tri = static_cast<int64_t>(P) * (P + 1) / 2;
    for (int64_t n : counts) {
      SCOPED_TRACE(::testing::Message() << s.label << " n=" << n << " rank=" << r);
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
          std::vector<float> v(n);
          for (int64_t i = 0; i < n; ++i) v[i] = Val(r, i);
          std::vector<char> buf = Pack(v, dt);
          ASSERT_TRUE(pg.AllReduce(buf.data(), n, dt, op).ok());
          const std::vector<float> got = Unpack(buf, dt);
          for (int64_t i = 0; i < n; ++i) {
            const float k = static_cast<float>((i % 7) + 1);
            float want = op == ReduceOp::kSum   ? k * tri
                         : op == ReduceOp::kAvg ? k * tri / P
                         : op == ReduceOp::kMax ? k * P
                                                : k;
            // Reduced in f32, rounded once to the buffer's type.
            if (dt == DType::kBF16) want = BF16ToFloat(FloatToBF16(want));
            const double tol = op == ReduceOp::kAvg ? (dt == DType::kF32 ? 1e-6 : 8e-3) * want : 0;
            ASSERT_NEAR(got[i], want, tol) << ReduceOpName(op) << " " << DTypeName(dt);
          }
        }
        // all_gather: out of place and in place.
        std::vector<float> v(n);
        for (int64_t i = 0; i < n; ++i) v[i] = Val(r, i);
        const std::vector<char> mine = Pack(v, dt);
        const size_t b = mine.size();
        std::vector<char> all(b * P, 0x55);
        ASSERT_TRUE(pg.AllGather(mine.data(), all.data(), n, dt).ok());
        std::vector<char> flat(b * P, 0x33);
        std::copy(mine.begin(), mine.end(), flat.begin() + b * r);
        ASSERT_TRUE(pg.AllGather(flat.data() + b * r, flat.data(), n, dt).ok());
        for (int q = 0; q < P; ++q) {
          std::vector<float> want(n);
          for (int64_t i = 0; i < n; ++i) want[i] = Val(q, i);
          const std::vector<char> w = Pack(want, dt);
          ASSERT_TRUE(SameBytes(all.data() + b * q, w.data(), b)) << "block " << q;
          ASSERT_TRUE(SameBytes(flat.data() + b * q, w.data(), b)) << "in place, block " << q;
        }
        // broadcast from the last rank.
        std::vector<char> bc = mine;
        ASSERT_TRUE(pg.Broadcast(bc.data(), n, dt, P - 1).ok());
        if (n > 0) {
          ASSERT_EQ(Unpack(bc, dt)[n - 1], Val(P - 1, n - 1));
        }
      }
      // reduce_scatter (f32): block q of rank r holds Val(r, q * n + i).
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> in(n * P), out(n, -1.f);
        for (int64_t i = 0; i < n * P; ++i) in[i] = Val(r, i);
        ASSERT_TRUE(pg.ReduceScatter(in.data(), out.data(), n, DType::kF32, op).ok());
        for (int64_t i = 0; i < n; ++i) {
          const float k = static_cast<float>(((r * n + i) % 7) + 1);
          const float want = op == ReduceOp::kSum   ? k * tri
                             : op == ReduceOp::kAvg ? k * tri / P
                             : op == ReduceOp::kMax ? k * P
                                                    : k;
          ASSERT_NEAR(out[i], want, 1e-6 * want) << ReduceOpName(op);
        }
      }
    }
    ASSERT_TRUE(pg.Barrier().ok());
  });
}

class TransportsRandom : public ::testing::TestWithParam<Layout> {};

TEST_P(TransportsRandom, RandomInputsMatchTheRankOrderReference) {
  const Layout s = GetParam();
  const int P = s.ranks;
  for (int64_t n : {int64_t{1}, int64_t{7777}, int64_t{300001}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const std::vector<float> ref = Reference(P, n, dt, op);
        RunRanks(s, [&](ProcessGroup& pg) {
          SCOPED_TRACE(::testing::Message() << s.label << " n=" << n << " " << DTypeName(dt) << " "
                                            << ReduceOpName(op) << " rank=" << pg.rank());
          std::vector<char> buf = Pack(Inputs(pg.rank(), n, dt), dt);
          ASSERT_TRUE(pg.AllReduce(buf.data(), n, dt, op).ok());
          ExpectSameOnEveryRank(pg, buf);
          const std::vector<float> got = Unpack(buf, dt);
          // The reference rounded the way the buffer is.
          const std::vector<float> want = Unpack(Pack(ref, dt), dt);
          if (s.rank_order || op == ReduceOp::kMax) {
            ASSERT_TRUE(SameBytes(got.data(), want.data(), n * sizeof(float)));
          } else {
            const double tol = dt == DType::kF32 ? 2e-6 : 1e-2;
            for (int64_t i = 0; i < n; ++i)
              ASSERT_NEAR(got[i], want[i], tol * (std::abs(want[i]) + 1)) << i;
          }
          // reduce_scatter of the same random data, rank r's block r.
          if (dt == DType::kF32) {
            std::vector<float> in(n * P), out(n);
            for (int q = 0; q < P; ++q) {
              const std::vector<float> x = Inputs(pg.rank(), n, dt);
              std::memcpy(in.data() + q * n, x.data(), n * sizeof(float));
            }
            ASSERT_TRUE(pg.ReduceScatter(in.data(), out.data(), n, DType::kF32, op).ok());
            if (s.rank_order || op == ReduceOp::kMax) {
              ASSERT_TRUE(SameBytes(out.data(), ref.data(), n * sizeof(float)));
            } else {
              for (int64_t i = 0; i < n; ++i)
                ASSERT_NEAR(out[i], ref[i], 2e-6 * (std::abs(ref[i]) + 1)) << i;
            }
          }
        });
      }
    }
  }
}

// Every world size of the old Gloo suite (odd and prime included) on TCP and shared memory.
std::vector<Layout> WorldSizes() {
  std::vector<Layout> out;
  for (int P : {1, 2, 3, 4, 5, 7, 8, 11, 13, 16}) {
    out.push_back(Layout{StrCat("tcp", P), Transport::kTcp, 1, P});
    out.push_back(Layout{StrCat("shm", P), Transport::kShm, 1, P, 0, true});
  }
  return out;
}

// Several chunks per message, and hosts as groups of threads with their own host key.
const Layout kMixed[] = {
    // Slots of one page: every message runs in many chunks.
    Layout{"shm3_small_slots", Transport::kShm, 1, 3, 4096, true},
    Layout{"auto_2hosts_x2", Transport::kAuto, 2, 4},
    Layout{"auto_2hosts_x3", Transport::kAuto, 2, 6},
    Layout{"auto_3hosts_x2", Transport::kAuto, 3, 6},
    Layout{"auto_3hosts_x4_small_slots", Transport::kAuto, 3, 12, 4096},
    // One rank per host: a flat TCP group.
    Layout{"auto_3hosts_x1", Transport::kAuto, 3, 3}};

INSTANTIATE_TEST_SUITE_P(WorldSizes, Transports, ::testing::ValuesIn(WorldSizes()), LayoutName);
INSTANTIATE_TEST_SUITE_P(Mixed, Transports, ::testing::ValuesIn(kMixed), LayoutName);
INSTANTIATE_TEST_SUITE_P(All, TransportsRandom,
                         ::testing::Values(Layout{"tcp2", Transport::kTcp, 1, 2},
                                           Layout{"tcp3", Transport::kTcp, 1, 3},
                                           Layout{"shm1", Transport::kShm, 1, 1, 0, true},
                                           Layout{"shm2", Transport::kShm, 1, 2, 0, true},
                                           Layout{"shm3", Transport::kShm, 1, 3, 0, true},
                                           Layout{"shm4", Transport::kShm, 1, 4, 0, true},
                                           Layout{"shm7", Transport::kShm, 1, 7, 0, true}),
                         LayoutName);
INSTANTIATE_TEST_SUITE_P(Mixed, TransportsRandom, ::testing::ValuesIn(kMixed), LayoutName);

// The largest size the issue names, on the two transports of one host.
TEST(TransportsLarge, AllReduce64MiB) {
  const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  for (Transport t : {Transport::kShm, Transport::kTcp}) {
    RunRanks(Layout{"large", t, 1, 2}, [&](ProcessGroup& pg) {
      std::vector<float> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Val(pg.rank(), i);
      ASSERT_TRUE(pg.AllReduce(buf.data(), n, DType::kF32, ReduceOp::kSum).ok());
      for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(buf[i], Val(0, i) * 3) << TransportName(t);
      ASSERT_EQ(buf[n - 1], Val(0, n - 1) * 3);
    });
  }
}

// Messages of several pipeline chunks (the hierarchical all_reduce overlaps the cross-host part of
// one chunk with the local parts of its neighbours), with an uneven last chunk.
TEST(TransportsLarge, HierarchicalPipelineOfSeveralChunks) {
  const int64_t n = 3 * (int64_t{1} << 20) + 5;
  const Layout hier{"hier", Transport::kAuto, 2, 4};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    const std::vector<float> ref = Reference(4, n, DType::kF32, op);
    RunRanks(hier, [&](ProcessGroup& pg) {
      EXPECT_EQ(pg.transport(), "shm+tcp");
      std::vector<float> buf = Inputs(pg.rank(), n, DType::kF32);
      ASSERT_TRUE(pg.AllReduce(buf.data(), n, DType::kF32, op).ok());
      std::vector<char> bytes(n * sizeof(float));
      std::memcpy(bytes.data(), buf.data(), bytes.size());
      ExpectSameOnEveryRank(pg, bytes);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(buf[i], ref[i], 2e-6 * (std::abs(ref[i]) + 1)) << ReduceOpName(op) << " " << i;
    });
  }
}

// reduce_scatter and all_gather over several pipeline chunks (chunks of 1 M elements over all
// ranks' blocks), an uneven last one included, on 2 hosts x 2 and 3 hosts x 2.
TEST(TransportsLarge, HierarchicalReduceScatterAndAllGatherOfSeveralChunks) {
  const int64_t n = 600001;
  for (const Layout& hier :
       {Layout{"hier", Transport::kAuto, 2, 4}, Layout{"hier", Transport::kAuto, 3, 6}}) {
    const int P = hier.ranks;
    RunRanks(hier, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      // reduce_scatter: block q of rank p holds Val(p, q * n + i); sum = Val(0, .) * P(P+1)/2.
      std::vector<float> in(n * P), out(n, -1.f);
      for (int64_t i = 0; i < n * P; ++i) in[i] = Val(r, i);
      ASSERT_TRUE(pg.ReduceScatter(in.data(), out.data(), n, DType::kF32, ReduceOp::kSum).ok());
      const float tri = static_cast<float>(P * (P + 1) / 2);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], Val(0, r * n + i) * tri) << i;
      // all_gather, bf16 (raw 2-byte elements).
      std::vector<uint16_t> mine(n), all(n * P, 0);
      for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<uint16_t>(r * 1000 + i % 997);
      ASSERT_TRUE(pg.AllGather(mine.data(), all.data(), n, DType::kBF16).ok());
      for (int q = 0; q < P; ++q)
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(all[q * n + i], static_cast<uint16_t>(q * 1000 + i % 997)) << q << " " << i;
    });
  }
}

TEST(Transports, ShmNeedsOneHost) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      GroupOptions o;
      o.transport = Transport::kShm;
      o.host_key = StrCat("host", r);
      o.connect_timeout = milliseconds(5000);
      auto pg = CreateProcessGroup(store, r, 2, o);
      err[r] = pg.ok() ? "" : pg.status().message();
    });
  for (auto& t : ts) t.join();
  for (const auto& e : err)
    EXPECT_NE(e.find("transport shm needs every rank on one host"), std::string::npos) << e;
  EXPECT_FALSE(ParseTransport("rdma").ok());
  EXPECT_EQ(*ParseTransport("shm"), Transport::kShm);
}

// A segment that cannot be set up (here: slots too large to map) makes every rank of an `auto`
// group fall back to TCP together, and is an error on every rank of an `shm` group.
TEST(Transports, NoSegmentMeansTcpForEveryRankOrAnErrorWithShm) {
  for (Transport t : {Transport::kAuto, Transport::kShm}) {
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::string> got(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        GroupOptions o;
        o.transport = t;
        o.shm_slot_bytes = size_t{1} << 46;
        o.connect_timeout = milliseconds(10000);
        auto pg = CreateProcessGroup(store, r, 3, o);
        if (!pg.ok()) {
          got[r] = "error: " + pg.status().message();
          return;
        }
        float x = 1.f;
        ASSERT_TRUE((*pg)->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).ok());
        EXPECT_EQ(x, 3.f);
        got[r] = (*pg)->transport();
      });
    for (auto& th : ts) th.join();
    for (const std::string& g : got) {
      if (t == Transport::kAuto) {
        EXPECT_EQ(g, "tcp");
      } else {
        EXPECT_EQ(g.rfind("error: ", 0), 0u) << g;
      }
    }
  }
}

TEST(Transports, ShmTimeoutNamesTheMissingRank) {
  RunRanks(Layout{"shm4", Transport::kShm, 1, 4}, [&](ProcessGroup& pg) {
    float x = 1.f;
    ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).ok());
    if (pg.rank() == 2) {
      std::this_thread::sleep_for(milliseconds(2500));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status st = pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {milliseconds(800)});
    ASSERT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(5));
    EXPECT_NE(st.message().find("all_reduce(sum) #2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("ranks not seen at #2: 2 (last seen at #1)"), std::string::npos)
        << st.message();
    EXPECT_FALSE(pg.Barrier({milliseconds(100)}).ok());
  });
}

// What this process maps and holds: shared segments and open descriptors.
int CountMaps(const std::string& needle) {
  std::ifstream in("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}
int CountFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}
std::set<std::string> DevShm() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    out.insert(e.path().filename());
  return out;
}

TEST(Transports, NothingIsLeftBehind) {
  const auto shm_before = DevShm();
  const int fds_before = CountFds();
  RunRanks(Layout{"shm3", Transport::kShm, 1, 3}, [&](ProcessGroup& pg) {
    float x = 1.f;
    ASSERT_TRUE(pg.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum).ok());
    // While the group lives: mapped, but no name anywhere.
    EXPECT_GE(CountMaps("memfd:slicetrain-"), 1);
  });
  EXPECT_EQ(CountMaps("memfd:slicetrain-"), 0) << "a segment is still mapped";
  EXPECT_EQ(CountFds(), fds_before) << "a descriptor is still open";
  EXPECT_EQ(DevShm(), shm_before) << "something was left in /dev/shm";
}

// Worker processes started directly (no launcher to take the others down): when one is killed in
// the middle of the loop, every survivor reports it by itself, within the timeout.
int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

class PeerKilled : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerKilled, SurvivorsReportItWithinTheTimeout) {
  const int P = 3;
  const int port = FreePort();
  const auto shm_before = DevShm();
  std::vector<std::unique_ptr<testing::Proc>> ranks;
  for (int r = 0; r < P; ++r)
    ranks.push_back(std::make_unique<testing::Proc>(
        std::vector<std::string>{ST_BINARY, "allreduce-loop", "--iters", "100000000", "--count",
                                 "100000"},
        std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=3",
                                 "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=3",
                                 "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                 "SLICETRAIN_SECRET=s", "SLICETRAIN_TIMEOUT_MS=8000",
                                 "SLICETRAIN_TRANSPORT=" + GetParam()}));
  ASSERT_TRUE(ranks[0]->ReadUntil(
      [](const std::string& o) { return o.find("iteration 20 done") != std::string::npos; },
      seconds(30)))
      << ranks[0]->output();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(ranks[1]->pid(), SIGKILL), 0);
  for (int r : {0, 2}) {
    const int rc = ranks[r]->Wait(seconds(20));
    EXPECT_NE(rc, -1) << "rank " << r << " hung:\n" << ranks[r]->output();
    EXPECT_NE(rc, 0) << ranks[r]->output();
    EXPECT_LT(rc, 128) << "rank " << r << " was killed by signal " << rc - 128 << ":\n"
                       << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("all_reduce(sum)"), std::string::npos) << ranks[r]->output();
    if (GetParam() == "shm") {
      EXPECT_NE(ranks[r]->output().find("rank 1 (pid " + std::to_string(ranks[1]->pid())),
                std::string::npos)
          << ranks[r]->output();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(12));
  ranks[1]->Wait(seconds(5));
  EXPECT_EQ(DevShm(), shm_before) << "something was left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(All, PeerKilled, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace st::comm
