#include "comm/hier/hier_process_group.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>

#include "comm/gloo/gloo_process_group.h"
#include "comm/shm/shm_process_group.h"

namespace st::comm::hier {

namespace {

// Where every rank of the group sits: host index h (order of first appearance) and local index i
// (rank order within the host); rank_at[h][i] inverts it.
struct Layout {
  std::vector<int> host_of, local_of;
  std::vector<std::vector<int>> rank_at;
  int hosts() const { return static_cast<int>(rank_at.size()); }
  int per_host() const { return static_cast<int>(rank_at[0].size()); }
};

Layout MakeLayout(const std::vector<std::string>& hosts) {
  Layout l;
  std::map<std::string, int> index;
  for (size_t p = 0; p < hosts.size(); ++p) {
    auto [it, fresh] = index.emplace(hosts[p], static_cast<int>(l.rank_at.size()));
    if (fresh) l.rank_at.emplace_back();
    l.host_of.push_back(it->second);
    l.local_of.push_back(static_cast<int>(l.rank_at[it->second].size()));
    l.rank_at[it->second].push_back(static_cast<int>(p));
  }
  return l;
}

class HierProcessGroup final : public ProcessGroup {
 public:
  HierProcessGroup(int rank, int size, const GroupOptions& opts, Layout layout,
                   std::unique_ptr<ProcessGroup> local, std::unique_ptr<ProcessGroup> cross)
      : ProcessGroup(rank, size, opts.name, opts.hostname),
        l_(std::move(layout)),
        local_(std::move(local)),
        cross_(std::move(cross)) {}

 protected:
  Status DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op, uint64_t,
                     std::chrono::milliseconds timeout) override {
    const CollectiveOptions o{timeout};
    if (dtype != DType::kF32) {
      // Reduced in f32 (as the TCP path does): convert, reduce, round once.
      std::vector<float> tmp(static_cast<size_t>(count));
      ConvertToF32(dtype, buf, tmp.data(), count);
      ST_RETURN_IF_ERROR(AllReduceF32(tmp.data(), count, op, o));
      ConvertFromF32(dtype, tmp.data(), buf, count);
      return Status::Ok();
    }
    return AllReduceF32(static_cast<float*>(buf), count, op, o);
  }

  // Pipelined in chunks of m elements per rank (size() x m = kChunk): the cross-host all_gather of
  // chunk k + 1 (comm thread) runs while the host all-gathers chunk k. Cross: the blocks of the
  // ranks with this local index, in host order; local: every local index's column, [L][H] blocks.
  Status DoAllGather(const void* in, void* out, int64_t count, DType dtype, uint64_t,
                     std::chrono::milliseconds timeout) override {
    const CollectiveOptions o{timeout};
    const int H = l_.hosts(), L = l_.per_host();
    const size_t esz = DTypeSize(dtype);
    const int64_t chunk = std::max<int64_t>(1, kChunk / size());
    const int64_t chunks = (count + chunk - 1) / chunk;
    const size_t me = static_cast<size_t>(l_.host_of[rank()]);
    struct Piece {
      int64_t c0 = 0, m = 0;
      std::vector<char> column;  // [H][m]
      std::future<Status> cross;
    };
    std::vector<Piece> pieces(static_cast<size_t>(chunks));
    auto start = [&](int64_t k) {
      Piece& p = pieces[k];
      p.c0 = k * chunk;
      p.m = std::min(chunk, count - p.c0);
      const size_t b = static_cast<size_t>(p.m) * esz;
      p.column.resize(b * H);
      std::memcpy(p.column.data() + b * me, static_cast<const char*>(in) + p.c0 * esz, b);
      p.cross = comm_.Submit([this, &p, b, me, dtype, o] {
        return cross_->AllGather(p.column.data() + b * me, p.column.data(), p.m, dtype, o);
      });
    };
    auto finish = [&](int64_t k) -> Status {
      Piece& p = pieces[k];
      ST_RETURN_IF_ERROR(p.cross.get());
      const size_t b = static_cast<size_t>(p.m) * esz;
      std::vector<char> all(b * H * L);
      ST_RETURN_IF_ERROR(local_->AllGather(p.column.data(), all.data(), p.m * H, dtype, o));
      char* dst = static_cast<char*>(out) + p.c0 * esz;
      const size_t row = static_cast<size_t>(count) * esz;
      for (int i = 0; i < L; ++i)
        for (int h = 0; h < H; ++h)
          std::memcpy(dst + row * l_.rank_at[h][i],
                      all.data() + b * (static_cast<size_t>(i) * H + h), b);
      p = Piece();
      return Status::Ok();
    };
    Status st = Status::Ok();
    start(0);
    for (int64_t k = 0; k < chunks && st.ok(); ++k) {
      if (k + 1 < chunks) start(k + 1);
      st = finish(k);
    }
    return WaitAll(pieces, st);
  }

  // Pipelined in chunks of m elements per block (size() x m = kChunk): the blocks of chunk k are
  // reordered to [L][H] (local index i receives the host's sum of the blocks meant for the ranks
  // with local index i, one per host), reduce-scattered on the host, then across hosts on the
  // comm thread while the host works on chunk k + 1.
  Status DoReduceScatter(const void* in, void* out, int64_t count, DType, ReduceOp op, uint64_t,
                         std::chrono::milliseconds timeout) override {
    const CollectiveOptions o{timeout};
    const int H = l_.hosts(), L = l_.per_host();
    const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const int64_t chunk = std::max<int64_t>(1, kChunk / size());
    const int64_t chunks = (count + chunk - 1) / chunk;
    const float* src = static_cast<const float*>(in);
    float* dst = static_cast<float*>(out);
    struct Piece {
      std::vector<float> column;  // [H][m]
      std::future<Status> cross;
    };
    std::vector<Piece> pieces(static_cast<size_t>(chunks));
    std::vector<float> packed;
    Status st = Status::Ok();
    for (int64_t k = 0; k < chunks && st.ok(); ++k) {
      Piece& p = pieces[k];
      const int64_t c0 = k * chunk, m = std::min(chunk, count - c0);
      const size_t n = static_cast<size_t>(m);
      packed.resize(n * size());
      p.column.resize(n * H);
      for (int i = 0; i < L; ++i)
        for (int h = 0; h < H; ++h)
          std::memcpy(packed.data() + n * (static_cast<size_t>(i) * H + h),
                      src + static_cast<size_t>(count) * l_.rank_at[h][i] + c0, n * sizeof(float));
      st = local_->ReduceScatter(packed.data(), p.column.data(), m * H, DType::kF32, inner, o);
      if (!st.ok()) break;
      p.cross = comm_.Submit([this, &p, dst, c0, m, inner, o] {
        return cross_->ReduceScatter(p.column.data(), dst + c0, m, DType::kF32, inner, o);
      });
      if (k > 0) st = pieces[k - 1].cross.get();
    }
    if (st.ok() && pieces.back().cross.valid()) st = pieces.back().cross.get();
    ST_RETURN_IF_ERROR(WaitAll(pieces, st));
    if (op == ReduceOp::kAvg) Scale(dst, count);
    return Status::Ok();
  }

  Status DoBroadcast(void* buf, int64_t count, DType dtype, int root, uint64_t,
                     std::chrono::milliseconds timeout) override {
    const CollectiveOptions o{timeout};
    const int root_local = l_.local_of[root];
    if (l_.local_of[rank()] == root_local)
      ST_RETURN_IF_ERROR(cross_->Broadcast(buf, count, dtype, l_.host_of[root], o));
    return local_->Broadcast(buf, count, dtype, root_local, o);
  }

  std::string transport() const override {
    return StrCat(local_->transport(), "+", cross_->transport());
  }

  Status DoBarrier(uint64_t, std::chrono::milliseconds timeout) override {
    const CollectiveOptions o{timeout};
    ST_RETURN_IF_ERROR(local_->Barrier(o));
    if (l_.local_of[rank()] == 0) ST_RETURN_IF_ERROR(cross_->Barrier(o));
    return local_->Barrier(o);
  }

 private:
  // Pipelined in chunks of kChunk elements: local reduce_scatter of chunk k into this rank's 1/L
  // part (zero-padded to L equal parts), cross-host all_reduce of the part on the comm thread,
  // local all_gather of the parts, so that chunk k crosses the network while this host
  // reduce-scatters chunk k + 1 and gathers chunk k - 1. Each group sees its ops in one order on
  // every rank: local RS0, RS1, AG0, RS2, AG1, ...; cross AR0, AR1, ...
  Status AllReduceF32(float* buf, int64_t count, ReduceOp op, const CollectiveOptions& o) {
    const int L = l_.per_host();
    const ReduceOp inner = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const int64_t chunk = std::max<int64_t>(L, kChunk / L * L);
    const int64_t chunks = (count + chunk - 1) / chunk;
    struct Piece {
      float* data = nullptr;  // [part * L]: the chunk in `buf`, or `padded`
      int64_t m = 0, part = 0;
      std::vector<float> padded, mine;  // mine: [part]
      std::future<Status> cross;
    };
    std::vector<Piece> pieces(static_cast<size_t>(chunks));
    auto start = [&](int64_t k) -> Status {
      Piece& p = pieces[k];
      float* at = buf + k * chunk;
      p.m = std::min(chunk, count - k * chunk);
      p.part = (p.m + L - 1) / L;
      p.data = at;
      if (p.part * L != p.m) {
        p.padded.assign(static_cast<size_t>(p.part * L), 0.0f);
        std::memcpy(p.padded.data(), at, static_cast<size_t>(p.m) * sizeof(float));
        p.data = p.padded.data();
      }
      p.mine.resize(static_cast<size_t>(p.part));
      ST_RETURN_IF_ERROR(
          local_->ReduceScatter(p.data, p.mine.data(), p.part, DType::kF32, inner, o));
      p.cross = comm_.Submit([this, &p, inner, o] {
        return cross_->AllReduce(p.mine.data(), p.part, DType::kF32, inner, o);
      });
      return Status::Ok();
    };
    auto finish = [&](int64_t k) -> Status {
      Piece& p = pieces[k];
      ST_RETURN_IF_ERROR(p.cross.get());
      ST_RETURN_IF_ERROR(local_->AllGather(p.mine.data(), p.data, p.part, DType::kF32, o));
      if (!p.padded.empty())
        std::memcpy(buf + k * chunk, p.padded.data(), static_cast<size_t>(p.m) * sizeof(float));
      p = Piece();
      return Status::Ok();
    };
    Status st = Status::Ok();
    for (int64_t k = 0; k < chunks && st.ok(); ++k) {
      st = start(k);
      if (st.ok() && k > 0) st = finish(k - 1);
    }
    if (st.ok()) st = finish(chunks - 1);
    ST_RETURN_IF_ERROR(WaitAll(pieces, st));
    if (op == ReduceOp::kAvg) Scale(buf, count);
    return Status::Ok();
  }

  // No comm-thread task may outlive the pieces it reads and writes (after a failure some are
  // still queued or running): waits for them, then returns `st`.
  template <typename Piece>
  static Status WaitAll(std::vector<Piece>& pieces, Status st) {
    for (Piece& p : pieces)
      if (p.cross.valid()) p.cross.wait();
    return st;
  }

  void Scale(float* p, int64_t n) const {
    const float inv = 1.0f / static_cast<float>(size());
    for (int64_t i = 0; i < n; ++i) p[i] *= inv;
  }

  // Elements per pipelined chunk (4 MiB of f32): of the whole buffer for all_reduce, of all
  // ranks' blocks together for all_gather and reduce_scatter.
  static constexpr int64_t kChunk = int64_t{1} << 20;

  const Layout l_;
  std::unique_ptr<ProcessGroup> local_;  // the ranks of this host (shared memory)
  std::unique_ptr<ProcessGroup> cross_;  // the ranks with this local index, one per host (TCP)
  CommThread comm_;                      // runs the cross-host part beside the local one
};

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> CreateHierarchicalGroup(
    std::shared_ptr<Store> store, int rank, int size, const std::vector<std::string>& hosts,
    const GroupOptions& opts) {
  Layout l = MakeLayout(hosts);
  bool even = l.per_host() > 1;
  for (const auto& on_host : l.rank_at) even = even && on_host.size() == l.rank_at[0].size();
  // One rank per host, or hosts with different numbers of ranks: one flat TCP group.
  if (!even) return CreateGlooProcessGroup(store, rank, size, opts);
  const int h = l.host_of[rank], i = l.local_of[rank];
  GroupOptions local_opts = opts;
  local_opts.name = StrCat(opts.name, "/local/", h);
  auto local = shm::CreateShmProcessGroup(
      std::make_shared<PrefixStore>("pg/" + local_opts.name, store), i, l.per_host(), local_opts);
  if (!local.ok() && local.status().code() == StatusCode::kUnimplemented) {
    // Decided by the ranks of this host together; other hosts may still share memory.
    if (i == 0)
      std::fprintf(stderr,
                   "slicetrain: warning: group '%s': no shared memory between the ranks of host "
                   "%d (%s); using TCP there\n",
                   opts.name.c_str(), h, local.status().message().c_str());
    local = CreateGlooProcessGroup(store, i, l.per_host(), local_opts);
  }
  if (!local.ok()) return local.status();
  GroupOptions cross_opts = opts;
  cross_opts.name = StrCat(opts.name, "/cross/", i);
  ST_ASSIGN_OR_RETURN(auto cross, CreateGlooProcessGroup(store, h, l.hosts(), cross_opts));
  return std::unique_ptr<ProcessGroup>(
      new HierProcessGroup(rank, size, opts, std::move(l), std::move(*local), std::move(cross)));
}

}  // namespace st::comm::hier
