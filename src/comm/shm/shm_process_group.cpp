#include "comm/shm/shm_process_group.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <vector>

#include "comm/shm/segment.h"
#include "core/fd.h"

namespace st::comm::shm {

namespace {

constexpr uint64_t kMagic = 0x31484d5354534c53ull;  // "SLSTSMH1"

// One rank's line of the header. Written by that rank only (besides zero-initialisation).
struct alignas(64) RankState {
  std::atomic<uint64_t> epoch{0};    // barriers this rank has arrived at
  std::atomic<uint64_t> started{0};  // seq of the last collective it started
  std::atomic<int32_t> pid{0};
  char reason[160] = {};  // why it aborted the group (written before Header::abort_by)
};

struct Header {
  uint64_t magic = 0;
  uint64_t nonce = 0;
  int32_t ranks = 0;
  uint64_t slot_bytes = 0;
  uint64_t data_offset = 0;
  alignas(64) std::atomic<uint32_t> arrive{0};  // every barrier arrival; the futex word
  alignas(64) std::atomic<uint32_t> sleepers{0};
  alignas(64) std::atomic<int32_t> abort_by{-1};  // the rank that gave up, or -1
  RankState rank[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "atomics in a shared mapping must be lock-free");

constexpr size_t RoundUp(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}
constexpr size_t kDataOffset = RoundUp(sizeof(Header), 4096);

// Below this, all_reduce is one step: every rank reduces the whole message itself (one barrier).
constexpr size_t kOneShotBytes = 32 * 1024;
// Reduction block, in elements: the accumulator lives on the stack.
constexpr int64_t kBlock = 2048;
// Barrier wait: spin this many pauses, then yield for up to kYieldMicros, then sleep on the futex
// in slices of kSleepMillis, checking abort, deadline and dead peers between slices.
constexpr int kSpins = 500;
// With more ranks than CPUs a spinning rank holds the CPU its laggard needs: yield almost at once.
constexpr int kSpinsOversubscribed = 16;
constexpr int kYieldMicros = 200;
constexpr int kSleepMillis = 5;

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

int PidfdOpen(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// out[i] = op over sources s (in order 0..n-1) of src[s][i], times `scale`, for f32 or bf16
// elements; written to out1 and (if not null) out2. Accumulates in f32 on the stack, so an output
// may alias a source.
void Reduce(ReduceOp op, DType dtype, const void* const* src, int n, int64_t count, float scale,
            void* out1, void* out2) {
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  const size_t esz = DTypeSize(dtype);
  for (int64_t b0 = 0; b0 < count; b0 += kBlock) {
    const int64_t m = std::min(kBlock, count - b0);
    auto load = [&](int s, float* dst) {
      const char* p = static_cast<const char*>(src[s]) + b0 * esz;
      if (dtype == DType::kF32)
        std::memcpy(dst, p, m * sizeof(float));
      else
        ConvertToF32(dtype, p, dst, m);
    };
    load(0, acc);
    for (int s = 1; s < n; ++s) {
      const float* x = tmp;
      if (dtype == DType::kF32)
        x = reinterpret_cast<const float*>(static_cast<const char*>(src[s]) + b0 * esz);
      else
        load(s, tmp);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          for (int64_t i = 0; i < m; ++i) acc[i] += x[i];
          break;
        case ReduceOp::kMax:
          for (int64_t i = 0; i < m; ++i) acc[i] = acc[i] > x[i] ? acc[i] : x[i];
          break;
        case ReduceOp::kMin:
          for (int64_t i = 0; i < m; ++i) acc[i] = acc[i] < x[i] ? acc[i] : x[i];
          break;
      }
    }
    if (scale != 1.0f)
      for (int64_t i = 0; i < m; ++i) acc[i] *= scale;
    for (void* out : {out1, out2}) {
      if (out == nullptr) continue;
      char* p = static_cast<char*>(out) + b0 * esz;
      if (dtype == DType::kF32)
        std::memcpy(p, acc, m * sizeof(float));
      else
        ConvertFromF32(dtype, acc, p, m);
    }
  }
}

class ShmProcessGroup final : public ProcessGroup {
 public:
  ShmProcessGroup(int rank, int size, const GroupOptions& opts, SharedSegment seg)
      : ProcessGroup(rank, size, opts.name, opts.hostname),
        seg_(std::move(seg)),
        hdr_(static_cast<Header*>(seg_.data())),
        slot_bytes_(hdr_->slot_bytes),
        data_(static_cast<char*>(seg_.data()) + hdr_->data_offset) {
    cpu_set_t cpus;
    if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && size > CPU_COUNT(&cpus))
      spins_ = kSpinsOversubscribed;
    const int self = ::getpid();
    peers_.resize(size);
    for (int p = 0; p < size; ++p) {
      peers_[p].pid = hdr_->rank[p].pid.load();
      if (p != rank && peers_[p].pid != self) peers_[p].pidfd = Fd(PidfdOpen(peers_[p].pid));
    }
  }

 protected:
  Status DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op, uint64_t,
                     std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(op_mu_);
    const auto deadline = Clock::now() + timeout;
    const int P = size(), r = rank();
    const size_t esz = DTypeSize(dtype);
    const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(P) : 1.0f;
    char* data = static_cast<char*>(buf);
    if (P == 1) return Status::Ok();  // sum, avg, max and min of one rank: its own values
    std::vector<const void*> src(P);
    const size_t bytes = static_cast<size_t>(count) * esz;
    if (bytes <= kOneShotBytes && bytes <= slot_bytes_) {
      // One step: everyone publishes the whole message, everyone reduces all of it.
      std::memcpy(Slot(r), data, bytes);
      ST_RETURN_IF_ERROR(Sync("all_reduce", deadline));
      for (int p = 0; p < P; ++p) src[p] = Slot(p);
      Reduce(op, dtype, src.data(), P, count, scale, data, nullptr);
      Flip();
      return Status::Ok();
    }
    // Chunks of one slot; chunk c is cut into P slices (multiples of 16 elements), rank p owns
    // slice p: it reduces it over every rank and publishes the result in its own slot.
    const int64_t chunk = static_cast<int64_t>(slot_bytes_ / esz);
    for (int64_t c0 = 0; c0 < count; c0 += chunk) {
      const int64_t m = std::min(chunk, count - c0);
      const int64_t slice = (m + 16 * P - 1) / (16 * P) * 16;
      auto lo = [&](int p) { return std::min<int64_t>(m, p * slice); };
      auto hi = [&](int p) { return std::min<int64_t>(m, (p + 1) * slice); };
      char* chunk_data = data + c0 * esz;
      // Publish the slices the other ranks reduce (this rank reads its own from `buf`).
      for (int p = 0; p < P; ++p)
        if (p != r && hi(p) > lo(p))
          std::memcpy(Slot(r) + lo(p) * esz, chunk_data + lo(p) * esz, (hi(p) - lo(p)) * esz);
      ST_RETURN_IF_ERROR(Sync("all_reduce", deadline));
      if (hi(r) > lo(r)) {
        for (int p = 0; p < P; ++p)
          src[p] = p == r ? chunk_data + lo(r) * esz : Slot(p) + lo(r) * esz;
        Reduce(op, dtype, src.data(), P, hi(r) - lo(r), scale, chunk_data + lo(r) * esz,
               Slot(r) + lo(r) * esz);
      }
      ST_RETURN_IF_ERROR(Sync("all_reduce", deadline));
      for (int p = 0; p < P; ++p)
        if (p != r && hi(p) > lo(p))
          std::memcpy(chunk_data + lo(p) * esz, Slot(p) + lo(p) * esz, (hi(p) - lo(p)) * esz);
      Flip();
    }
    return Status::Ok();
  }

  Status DoAllGather(const void* in, void* out, int64_t count, DType dtype, uint64_t,
                     std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(op_mu_);
    const auto deadline = Clock::now() + timeout;
    const int P = size(), r = rank();
    const size_t b = static_cast<size_t>(count) * DTypeSize(dtype);
    const char* input = static_cast<const char*>(in);
    char* output = static_cast<char*>(out);
    if (input != output + b * r) std::memmove(output + b * r, input, b);
    if (P == 1) return Status::Ok();
    for (size_t off = 0; off < b; off += slot_bytes_) {
      const size_t m = std::min(slot_bytes_, b - off);
      std::memcpy(Slot(r), output + b * r + off, m);
      ST_RETURN_IF_ERROR(Sync("all_gather", deadline));
      for (int p = 0; p < P; ++p)
        if (p != r) std::memcpy(output + b * p + off, Slot(p), m);
      Flip();
    }
    return Status::Ok();
  }

  Status DoReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                         uint64_t, std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(op_mu_);
    const auto deadline = Clock::now() + timeout;
    const int P = size(), r = rank();
    const size_t esz = DTypeSize(dtype);
    const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(P) : 1.0f;
    const char* input = static_cast<const char*>(in);
    char* output = static_cast<char*>(out);
    std::vector<const void*> src(P);
    // Per step, m elements of every block: this rank's slot holds the P - 1 pieces others reduce.
    const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(slot_bytes_ / esz / P));
    for (int64_t c0 = 0; c0 < count; c0 += chunk) {
      const int64_t m = std::min(chunk, count - c0);
      if (P > 1) {
        for (int p = 0; p < P; ++p)
          if (p != r) std::memcpy(Slot(r) + p * m * esz, input + (p * count + c0) * esz, m * esz);
        ST_RETURN_IF_ERROR(Sync("reduce_scatter", deadline));
      }
      for (int p = 0; p < P; ++p)
        src[p] = p == r ? input + (r * count + c0) * esz : Slot(p) + r * m * esz;
      Reduce(op, dtype, src.data(), P, m, scale, output + c0 * esz, nullptr);
      if (P > 1) Flip();
    }
    return Status::Ok();
  }

  Status DoBroadcast(void* buf, int64_t count, DType dtype, int root, uint64_t,
                     std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(op_mu_);
    const auto deadline = Clock::now() + timeout;
    if (size() == 1) return Status::Ok();
    const size_t b = static_cast<size_t>(count) * DTypeSize(dtype);
    const size_t step = slot_bytes_ * size();  // the root fills the whole slot set
    char* data = static_cast<char*>(buf);
    for (size_t off = 0; off < b; off += step) {
      const size_t m = std::min(step, b - off);
      if (rank() == root) std::memcpy(Slot(0), data + off, m);
      ST_RETURN_IF_ERROR(Sync("broadcast", deadline));
      if (rank() != root) std::memcpy(data + off, Slot(0), m);
      Flip();
    }
    return Status::Ok();
  }

  Status DoBarrier(uint64_t, std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(op_mu_);
    return size() == 1 ? Status::Ok() : Sync("barrier", Clock::now() + timeout);
  }

  std::string transport() const override { return "shm"; }

  void OnStart(uint64_t seq) override { hdr_->rank[rank()].started.store(seq); }

  std::string MissingRanks(uint64_t seq) override {
    std::string out;
    for (int p = 0; p < size(); ++p) {
      const uint64_t theirs = hdr_->rank[p].started.load();
      if (theirs < seq) out += StrCat(out.empty() ? "" : ", ", p, " (last seen at #", theirs, ")");
    }
    return out.empty() ? "none (every rank started it; a peer failed inside it)" : out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    int pid = 0;
    Fd pidfd;  // readable once the process has exited (invalid for this process's own threads)
  };

  // Slot of rank p in the current set.
  char* Slot(int p) const { return data_ + (static_cast<size_t>(set_) * size() + p) * slot_bytes_; }
  void Flip() { set_ ^= 1; }

  // Arrives at the next barrier and waits until every rank has.
  Status Sync(const char* what, Clock::time_point deadline) {
    const int P = size();
    ++epoch_;
    hdr_->rank[rank()].epoch.store(epoch_, std::memory_order_release);
    hdr_->arrive.fetch_add(1, std::memory_order_seq_cst);
    if (hdr_->sleepers.load(std::memory_order_seq_cst) > 0)
      Futex(&hdr_->arrive, FUTEX_WAKE, INT_MAX, nullptr);
    const uint32_t target = static_cast<uint32_t>(epoch_ * static_cast<uint64_t>(P));
    auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
    for (int i = 0; i < spins_; ++i) {
      if (reached(hdr_->arrive.load(std::memory_order_acquire))) return Status::Ok();
      _mm_pause();
    }
    const auto yield_until = Clock::now() + std::chrono::microseconds(kYieldMicros);
    while (Clock::now() < yield_until) {
      if (reached(hdr_->arrive.load(std::memory_order_acquire))) return Status::Ok();
      ::sched_yield();
    }
    for (;;) {
      if (reached(hdr_->arrive.load(std::memory_order_acquire))) return Status::Ok();
      const int by = hdr_->abort_by.load();
      if (by >= 0)
        return Unavailable(StrCat("shared-memory ", what, ": rank ", by,
                                  " aborted the group: ", std::string(hdr_->rank[by].reason)));
      const int dead = DeadPeer();
      if (dead >= 0)
        return Abort(StrCat("shared-memory ", what, ": rank ", dead, " (pid ", peers_[dead].pid,
                            ", this host) exited during the collective"));
      if (Clock::now() >= deadline)
        return Abort(
            StrCat("shared-memory ", what, " timed out waiting for rank(s) ", Stragglers()));
      hdr_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t v = hdr_->arrive.load(std::memory_order_seq_cst);
      if (!reached(v)) {
        const timespec ts{0, kSleepMillis * 1000000L};
        Futex(&hdr_->arrive, FUTEX_WAIT, v, &ts);
      }
      hdr_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // Ranks that have not reached this rank's barrier yet: "1 (pid 42), 3 (pid 44)".
  std::string Stragglers() const {
    std::string out;
    for (int p = 0; p < size(); ++p)
      if (hdr_->rank[p].epoch.load() < epoch_)
        out += StrCat(out.empty() ? "" : ", ", p, " (pid ", peers_[p].pid, ")");
    return out.empty() ? "?" : out;
  }

  // A peer process that has exited, or -1.
  int DeadPeer() const {
    for (int p = 0; p < size(); ++p) {
      const Peer& peer = peers_[p];
      if (p == rank() || peer.pid == ::getpid()) continue;
      if (peer.pidfd.valid()) {
        pollfd pfd{peer.pidfd.get(), POLLIN, 0};
        if (::poll(&pfd, 1, 0) > 0) return p;
      } else if (::kill(peer.pid, 0) != 0 && errno == ESRCH) {
        return p;
      }
    }
    return -1;
  }

  // Marks the group aborted by this rank (the others fail at their next wait) and returns `why`.
  Status Abort(const std::string& why) {
    RankState& me = hdr_->rank[rank()];
    std::snprintf(me.reason, sizeof(me.reason), "%s", why.c_str());
    int32_t none = -1;
    hdr_->abort_by.compare_exchange_strong(none, rank());
    Futex(&hdr_->arrive, FUTEX_WAKE, INT_MAX, nullptr);
    return Unavailable(why);
  }

  SharedSegment seg_;
  Header* hdr_;
  const size_t slot_bytes_;
  char* const data_;
  std::vector<Peer> peers_;
  int spins_ = kSpins;
  std::mutex op_mu_;  // one collective at a time (callers on several threads)
  uint64_t epoch_ = 0;
  int set_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> CreateShmProcessGroup(std::shared_ptr<Store> store,
                                                              int rank, int size,
                                                              const GroupOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument(StrCat("rank ", rank, " is outside a group of ", size));
  if (size > kMaxRanks)
    return Unimplemented(StrCat("shared memory for more than ", kMaxRanks, " ranks on one host"));
  const size_t slot = RoundUp(opts.shm_slot_bytes ? opts.shm_slot_bytes : kDefaultSlotBytes, 4096);
  const size_t total = kDataOffset + 2 * static_cast<size_t>(size) * slot;
  const StoreOptions so{opts.connect_timeout};
  SharedSegment seg;
  Status mine = Status::Ok();
  if (rank == 0) {
    std::random_device rd;
    const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    auto created = SharedSegment::Create(total, "slicetrain-" + opts.name);
    std::string published;
    if (created.ok()) {
      seg = std::move(*created);
      // Every page exists from the start (and below, every rank maps every page): the segment
      // counts in each worker's RSS once, at rendezvous, instead of growing into it whenever a
      // larger message or the other slot set first reaches a page.
      std::memset(static_cast<char*>(seg.data()) + kDataOffset, 0, total - kDataOffset);
      Header* h = new (seg.data()) Header();
      h->magic = kMagic;
      h->nonce = nonce;
      h->ranks = size;
      h->slot_bytes = slot;
      h->data_offset = kDataOffset;
      published = StrCat(seg.handle(), " ", nonce);
    } else {
      mine = created.status();
      published = "error " + mine.message();
    }
    ST_RETURN_IF_ERROR(store->Set("shm/segment", published, so));
  } else {
    ST_ASSIGN_OR_RETURN(std::string published, store->Get("shm/segment", so));
    std::istringstream in(published);
    int pid = 0, fd = -1;
    uint64_t nonce = 0;
    if (published.rfind("error ", 0) == 0) {
      mine = Unavailable("rank 0 could not create it: " + published.substr(6));
    } else if (!(in >> pid >> fd >> nonce)) {
      mine = Internal("malformed shared segment handle '" + published + "'");
    } else {
      auto attached = SharedSegment::Attach(pid, fd, total);
      if (!attached.ok()) {
        mine = attached.status();
      } else {
        seg = std::move(*attached);
        const Header* h = static_cast<const Header*>(seg.data());
        if (h->magic != kMagic || h->nonce != nonce || h->ranks != size || h->slot_bytes != slot)
          mine = Internal(StrCat("/proc/", pid, "/fd/", fd, " is not this group's segment"));
      }
    }
  }
  if (mine.ok()) static_cast<Header*>(seg.data())->rank[rank].pid.store(::getpid());
  // Every rank learns every rank's outcome, so all of them keep the segment or none does.
  ST_RETURN_IF_ERROR(
      store->Set(StrCat("shm/attached/", rank), mine.ok() ? "ok" : "error " + mine.message(), so));
  Status first = Status::Ok();
  for (int p = 0; p < size && first.ok(); ++p) {
    auto v = store->Get(StrCat("shm/attached/", p), so);
    if (!v.ok()) return v.status();
    if (v->rfind("error ", 0) == 0) first = Unimplemented(StrCat("rank ", p, ": ", v->substr(6)));
  }
  seg.CloseDescriptor();  // every rank has mapped it (or given up): no name or fd remains
  if (!first.ok()) return first;
  const volatile char* page = static_cast<const char*>(seg.data());
  for (size_t off = 0; off < seg.size(); off += 4096) (void)page[off];
  return std::unique_ptr<ProcessGroup>(new ShmProcessGroup(rank, size, opts, std::move(seg)));
}

}  // namespace st::comm::shm
