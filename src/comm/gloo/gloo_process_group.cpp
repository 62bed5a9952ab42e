#include "comm/gloo/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

namespace st::comm {

namespace {

// Our reduce-scatter ring's slot prefix; Gloo's own collectives use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;
// The pair handshake's slots (tag 0: nonces, tag 1: proofs).
constexpr uint8_t kPairAuthSlotPrefix = 0x22;
constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // HMAC-SHA256
using Proof = std::array<unsigned char, kProofBytes>;

// What rank `from` sends rank `to` to prove the key: HMAC-SHA256(key, domain | group | from | to |
// to's nonce | from's nonce). Both nonces are fresh per rendezvous (no replay), the ranks give the
// direction (a proof cannot be reflected back), and the group name keeps groups apart.
Proof PairProof(const std::string& key, const std::string& group, int from, int to,
                const unsigned char* nonce_of_to, const unsigned char* nonce_of_from) {
  std::string msg = "slicetrain-gloo-pair-v1";
  msg.push_back('\0');
  msg += group;
  msg.push_back('\0');
  msg += std::to_string(from) + ">" + std::to_string(to);
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(nonce_of_to), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(nonce_of_from), kNonceBytes);
  Proof out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(),
           &len) == nullptr ||
      len != kProofBytes)
    throw gloo::IoException("HMAC-SHA256 failed in the pair handshake");
  return out;
}

// Sends `size` bytes at offset size * p of `out` to every peer p and receives as much from each
// into `in` at offset size * p, on slot (kPairAuthSlotPrefix, tag).
void ExchangeWithEveryPeer(gloo::Context& ctx, unsigned char* out, unsigned char* in, size_t size,
                           bool same_for_all, uint32_t tag,
                           std::chrono::steady_clock::time_point deadline) {
  const int P = ctx.size, r = ctx.rank;
  auto out_buf = ctx.createUnboundBuffer(out, same_for_all ? size : size * P);
  auto in_buf = ctx.createUnboundBuffer(in, size * P);
  const uint64_t slot = gloo::Slot::build(kPairAuthSlotPrefix, tag);
  for (int p = 0; p < P; ++p) {
    if (p == r) continue;
    in_buf->recv(p, slot, size * p, size);
    out_buf->send(p, slot, same_for_all ? 0 : size * p, size);
  }
  // Which peers answered: a timeout names the others.
  std::vector<bool> heard(P, false);
  heard[r] = true;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  try {
    for (int p = 0; p < P; ++p) {
      if (p == r) continue;
      int from = -1;
      if (!in_buf->waitRecv(&from, left())) throw gloo::IoException("aborted");
      if (from >= 0 && from < P) heard[from] = true;
    }
    for (int p = 0; p < P; ++p)
      if (p != r && !out_buf->waitSend(left())) throw gloo::IoException("aborted");
  } catch (const std::exception& e) {
    std::string silent;
    for (int p = 0; p < P; ++p)
      if (!heard[p]) silent += (silent.empty() ? "" : ", ") + std::to_string(p);
    throw gloo::IoException(
        "the pair handshake got no answer from the connection of rank(s) " +
        (silent.empty() ? std::string("?") : silent) +
        ": that rank did not answer in time, or a process outside this job holds its "
        "connection (" +
        e.what() + ")");
  }
}

// Every pair of the freshly connected mesh proves `key` to each other. Throws naming the ranks
// whose connection did not.
void AuthenticatePairs(gloo::Context& ctx, const std::string& key, const std::string& group,
                       std::chrono::milliseconds timeout) {
  const int P = ctx.size, r = ctx.rank;
  if (P == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<unsigned char, kNonceBytes> mine{};
  if (RAND_bytes(mine.data(), static_cast<int>(mine.size())) != 1)
    throw gloo::IoException("no random bytes for the pair handshake (OpenSSL RAND_bytes)");
  std::vector<unsigned char> nonces(kNonceBytes * P);
  ExchangeWithEveryPeer(ctx, mine.data(), nonces.data(), kNonceBytes, /*same_for_all=*/true, 0,
                        deadline);
  std::vector<unsigned char> sent(kProofBytes * P), got(kProofBytes * P);
  for (int p = 0; p < P; ++p) {
    if (p == r) continue;
    const Proof proof = PairProof(key, group, r, p, &nonces[kNonceBytes * p], mine.data());
    std::memcpy(&sent[kProofBytes * p], proof.data(), kProofBytes);
  }
  ExchangeWithEveryPeer(ctx, sent.data(), got.data(), kProofBytes, /*same_for_all=*/false, 1,
                        deadline);
  std::string refused;
  for (int p = 0; p < P; ++p) {
    if (p == r) continue;
    const Proof expect = PairProof(key, group, p, r, mine.data(), &nonces[kNonceBytes * p]);
    if (CRYPTO_memcmp(expect.data(), &got[kProofBytes * p], kProofBytes) != 0)
      refused += (refused.empty() ? "" : ", ") + std::to_string(p);
  }
  if (!refused.empty())
    throw gloo::IoException(
        "the connection of rank(s) " + refused +
        " did not prove the job secret: a process outside this job connected to a collective "
        "port, or the ranks were started with different SLICETRAIN_SECRET values");
}

// Gloo's Store interface on top of ours (Gloo reports failures by exceptions).
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<st::comm::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string(data.begin(), data.end()), {timeout_}));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->Get(key, {timeout_});
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    Check(store_->Wait(keys, {t}));
  }

 private:
  static void Check(const Status& st) {
    if (!st.ok()) throw gloo::IoException(st.message());
  }
  std::shared_ptr<st::comm::Store> store_;
  std::chrono::milliseconds timeout_;
};

template <typename F>
void ReduceF32(float* out, const float* a, const float* b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

// Elementwise reduction of f32 buffers: out = a (op) b (avg reduces as a sum, divided at the end).
void ReduceInto(ReduceOp op, float* out, const float* a, const float* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      ReduceF32(out, a, b, n, [](float x, float y) { return x + y; });
      break;
    case ReduceOp::kMax:
      ReduceF32(out, a, b, n, [](float x, float y) { return x > y ? x : y; });
      break;
    case ReduceOp::kMin:
      ReduceF32(out, a, b, n, [](float x, float y) { return x < y ? x : y; });
      break;
  }
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(int rank, int size, const GroupOptions& opts, std::shared_ptr<Store> store,
                   std::shared_ptr<gloo::Context> ctx)
      : ProcessGroup(rank, size, opts.name, opts.hostname),
        store_(std::move(store)),
        ctx_(std::move(ctx)),
        watchdog_([this] { WatchdogLoop(); }) {}

  ~GlooProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(wd_mu_);
      wd_stop_ = true;
    }
    wd_cv_.notify_all();
    watchdog_.join();
  }

 protected:
  Status DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op, uint64_t seq,
                     std::chrono::milliseconds timeout) override {
    if (dtype == DType::kBF16) {
      // bf16 travels as f32 so that the sum of many ranks keeps its precision.
      std::vector<float> tmp(static_cast<size_t>(count));
      ConvertToF32(DType::kBF16, buf, tmp.data(), count);
      ST_RETURN_IF_ERROR(DoAllReduce(tmp.data(), count, DType::kF32, op, seq, timeout));
      ConvertFromF32(DType::kBF16, tmp.data(), buf, count);
      return Status::Ok();
    }
    return Guard([&] {
      gloo::AllreduceOptions o(ctx_);
      o.setOutput(static_cast<float*>(buf), static_cast<size_t>(count));
      o.setReduceFunction([op](void* out, const void* a, const void* b, size_t n) {
        ReduceInto(op, static_cast<float*>(out), static_cast<const float*>(a),
                   static_cast<const float*>(b), n);
      });
      o.setTag(Tag(seq));
      o.setTimeout(timeout);
      gloo::allreduce(o);
      if (op == ReduceOp::kAvg) {
        float* p = static_cast<float*>(buf);
        const float inv = 1.0f / static_cast<float>(size());
        for (int64_t i = 0; i < count; ++i) p[i] *= inv;
      }
    });
  }

  Status DoAllGather(const void* in, void* out, int64_t count, DType dtype, uint64_t seq,
                     std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::AllgatherOptions o(ctx_);
      const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
      // In place when `in` is already this rank's block of `out` (Gloo then sends from `out`).
      // Otherwise Gloo reads the input through an unbound buffer; it never writes it.
      const bool in_place = in == static_cast<const char*>(out) + bytes * rank();
      auto* in_ptr = const_cast<void*>(in);
      const size_t out_bytes = bytes * static_cast<size_t>(size());
      if (dtype == DType::kF32) {
        if (!in_place) o.setInput<float>(ctx_->createUnboundBuffer(in_ptr, bytes));
        o.setOutput<float>(ctx_->createUnboundBuffer(out, out_bytes));
      } else {
        if (!in_place) o.setInput<uint16_t>(ctx_->createUnboundBuffer(in_ptr, bytes));
        o.setOutput<uint16_t>(ctx_->createUnboundBuffer(out, out_bytes));
      }
      o.setTag(Tag(seq));
      o.setTimeout(timeout);
      gloo::allgather(o);
    });
  }

  // Ring reduce-scatter. Step s (0 <= s < P-1): send the running partial of block (r-s-1) to
  // rank r+1, receive the partial of block (r-s-2) from rank r-1 and add this rank's own input
  // block to it. After P-1 steps the received partial is block r, reduced over every rank.
  Status DoReduceScatter(const void* in, void* out, int64_t count, DType, ReduceOp op, uint64_t seq,
                         std::chrono::milliseconds timeout) override {
    const int P = size(), r = rank();
    const float* input = static_cast<const float*>(in);
    float* output = static_cast<float*>(out);
    const size_t n = static_cast<size_t>(count);
    if (P == 1) {
      std::memcpy(output, input, n * sizeof(float));
      return Status::Ok();
    }
    return Guard([&] {
      // Two staging blocks [count], kept between calls (fresh pages would fault in on every
      // call); every element is received before use.
      if (stage_.size() < 2 * n) stage_.resize(2 * n);
      float* a = stage_.data();
      float* b = stage_.data() + n;
      auto in_buf = ctx_->createUnboundBuffer(const_cast<float*>(input), n * P * sizeof(float));
      auto a_buf = ctx_->createUnboundBuffer(a, n * sizeof(float));
      auto b_buf = ctx_->createUnboundBuffer(b, n * sizeof(float));
      const auto base = gloo::Slot::build(kReduceScatterSlotPrefix, Tag(seq));
      const int next = (r + 1) % P, prev = (r + P - 1) % P;
      auto block = [&](int k) { return static_cast<size_t>(((k % P) + P) % P); };
      gloo::transport::UnboundBuffer* send = in_buf.get();
      gloo::transport::UnboundBuffer* recv = a_buf.get();
      float* recv_data = a;
      size_t send_off = block(r - 1) * n * sizeof(float);
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      for (int s = 0; s < P - 1; ++s) {
        const uint64_t slot = base + static_cast<uint8_t>(s % 256);
        recv->recv(prev, slot, 0, n * sizeof(float));
        send->send(next, slot, send_off, n * sizeof(float));
        if (!recv->waitRecv(deadline) || !send->waitSend(deadline))
          throw gloo::IoException("reduce_scatter ring step timed out or was aborted");
        const float* mine = input + block(r - s - 2) * n;
        ReduceInto(op, recv_data, recv_data, mine, n);
        // The block just reduced is what this rank sends next.
        send = recv;
        send_off = 0;
        recv = recv == a_buf.get() ? b_buf.get() : a_buf.get();
        recv_data = recv_data == a ? b : a;
      }
      const float* result = send == a_buf.get() ? a : b;
      const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(P) : 1.0f;
      for (size_t i = 0; i < n; ++i) output[i] = result[i] * scale;
    });
  }

  Status DoBroadcast(void* buf, int64_t count, DType dtype, int root, uint64_t seq,
                     std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::BroadcastOptions o(ctx_);
      const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
      if (dtype == DType::kF32)
        o.setOutput<float>(ctx_->createUnboundBuffer(buf, bytes));
      else
        o.setOutput<uint16_t>(ctx_->createUnboundBuffer(buf, bytes));
      o.setRoot(root);
      o.setTag(Tag(seq));
      o.setTimeout(timeout);
      gloo::broadcast(o);
    });
  }

  Status DoBarrier(uint64_t seq, std::chrono::milliseconds timeout) override {
    return Guard([&] {
      gloo::BarrierOptions o(ctx_);
      o.setTag(Tag(seq));
      o.setTimeout(timeout);
      gloo::barrier(o);
    });
  }

  std::string transport() const override { return "tcp"; }

  void OnStart(uint64_t seq) override { started_.store(seq); }

  // Waits briefly so every live peer's watchdog publishes its progress, then names the ranks
  // whose last published collective is older than `seq` (dead, stuck or stopped ranks; a rank
  // that entered `seq` less than one publish period before stopping may also be listed).
  std::string MissingRanks(uint64_t seq) override {
    // Within a second of the timeout in all: two publish periods, then calls that a reachable
    // store answers in milliseconds (an unreachable one makes the report "unknown").
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * kPublishMs));
    std::string out;
    const StoreOptions quick{std::chrono::milliseconds(500)};
    for (int p = 0; p < size(); ++p) {
      const std::string key = "progress/" + std::to_string(p);
      auto has = store_->Check({key}, quick);
      if (!has.ok()) return "unknown (store unreachable: " + has.status().message() + ")";
      uint64_t theirs = 0;
      if (*has) {
        auto v = store_->Get(key, quick);
        if (!v.ok()) return "unknown (store unreachable)";
        theirs = std::strtoull(v->c_str(), nullptr, 10);
      }
      if (theirs < seq)
        out += (out.empty() ? "" : ", ") + std::to_string(p) + " (last seen at #" +
               std::to_string(theirs) + ")";
    }
    return out.empty() ? "none (every rank started it; a peer failed inside it)" : out;
  }

 private:
  static constexpr int kPublishMs = 200;
  static uint32_t Tag(uint64_t seq) { return static_cast<uint32_t>(seq & 0xffffffffu); }

  template <typename F>
  Status Guard(F&& f) {
    try {
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      return IoError(e.what());
    }
  }

  // Publishes this rank's last started collective to the store, so that a peer that times out
  // can say who did not arrive.
  void WatchdogLoop() {
    uint64_t published = 0;
    std::unique_lock<std::mutex> lock(wd_mu_);
    while (!wd_stop_) {
      wd_cv_.wait_for(lock, std::chrono::milliseconds(kPublishMs));
      const uint64_t s = started_.load();
      if (s != published && !wd_stop_) {
        lock.unlock();
        if (store_
                ->Set("progress/" + std::to_string(rank()), std::to_string(s),
                      {std::chrono::milliseconds(500)})  // short: the destructor joins this
                .ok())
          published = s;
        lock.lock();
      }
    }
  }

  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<float> stage_;  // reduce-scatter staging, [2 x count] of the largest call so far
  std::atomic<uint64_t> started_{0};
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(std::shared_ptr<Store> store,
                                                               int rank, int size,
                                                               const GroupOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument(StrCat("rank ", rank, " is outside a group of ", size));
  auto scoped = std::make_shared<PrefixStore>("pg/" + opts.name, store);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.hostname;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(opts.connect_timeout);
    GlooStoreAdapter adapter(scoped, opts.connect_timeout);
    ctx->connectFullMesh(adapter, dev);
    AuthenticatePairs(*ctx, opts.auth_key, opts.name, opts.connect_timeout);
    return std::unique_ptr<ProcessGroup>(
        new GlooProcessGroup(rank, size, opts, scoped, std::move(ctx)));
  } catch (const std::exception& e) {
    return IoError(StrCat("rank ", rank, " (host ", opts.hostname, ") group '", opts.name,
                          "': Gloo rendezvous of ", size, " ranks failed: ", e.what()));
  }
}

}  // namespace st::comm
