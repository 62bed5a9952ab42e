#include "comm/process_group.h"

#include <cstdio>

namespace st::comm {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(int rank, int size, std::string name, std::string host)
    : rank_(rank), size_(size), name_(std::move(name)), host_(std::move(host)) {
  ST_CHECK(size > 0 && rank >= 0 && rank < size) << "rank " << rank << " of " << size;
}

ProcessGroup::~ProcessGroup() = default;

uint64_t ProcessGroup::seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

std::string ProcessGroup::RecentCollectives() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& r : ring_) {
    const char* state = r.state == CollectiveRecord::State::kDone     ? "done"
                        : r.state == CollectiveRecord::State::kFailed ? "FAILED"
                                                                      : "started";
    char line[256];
    std::snprintf(line, sizeof(line), "  #%llu %s count=%lld dtype=%s %s %.1f ms\n",
                  static_cast<unsigned long long>(r.seq), r.op.c_str(),
                  static_cast<long long>(r.count), DTypeName(r.dtype), state, r.millis);
    out += line;
  }
  return out;
}

CollectiveTotals ProcessGroup::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

Status ProcessGroup::Run(const std::string& op, int64_t count, DType dtype,
                         const std::function<Status(uint64_t)>& body) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++seq_;
    if (broken_)
      return Unavailable(StrCat("rank ", rank_, " (host ", host_, ") group '", name_, "': ", op,
                                " #", seq, " refused: the group is broken: ", broken_reason_));
    CollectiveRecord rec;
    rec.seq = seq;
    rec.op = op;
    rec.count = count;
    rec.dtype = dtype;
    ring_.push_back(rec);
    if (ring_.size() > kRingSize) ring_.pop_front();
  }
  OnStart(seq);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = count < 0 ? InvalidArgument(StrCat("negative count ", count)) : body(seq);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : ring_)
      if (r.seq == seq) {
        r.state = st.ok() ? CollectiveRecord::State::kDone : CollectiveRecord::State::kFailed;
        r.millis = ms;
      }
    if (st.ok()) {
      const bool per_rank_blocks = op == "all_gather" || op.rfind("reduce_scatter", 0) == 0;
      totals_.ops += 1;
      totals_.bytes += static_cast<size_t>(count) * DTypeSize(dtype) *
                       static_cast<size_t>(per_rank_blocks ? size_ : 1);
      totals_.seconds += ms / 1000.0;
    }
  }
  if (st.ok()) return st;
  const std::string missing = MissingRanks(seq);
  std::string msg = StrCat("rank ", rank_, " (host ", host_, ") group '", name_, "': ", op, " #",
                           seq, " (count ", count, " ", DTypeName(dtype), ") failed after ",
                           static_cast<int64_t>(ms), " ms: ", st.message());
  if (!missing.empty()) msg += "; ranks not seen at #" + std::to_string(seq) + ": " + missing;
  std::fprintf(stderr, "%s\nrecent collectives on rank %d (group '%s'):\n%s", msg.c_str(), rank_,
               name_.c_str(), RecentCollectives().c_str());
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    // The whole first failure: a later refusal is often the line a launcher quotes.
    broken_reason_ = msg;
  }
  // A transport failure (lost peer, timeout) is what a restart of the group may cure.
  const bool caller_error =
      st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kUnimplemented;
  return Status(caller_error ? st.code() : StatusCode::kUnavailable, msg);
}

Status ProcessGroup::AllReduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                               const CollectiveOptions& opts) {
  return Run(StrCat("all_reduce(", ReduceOpName(op), ")"), count, dtype, [&](uint64_t seq) {
    if (dtype == DType::kF16) return Unimplemented("all_reduce of f16 buffers");
    return count == 0 ? Status::Ok() : DoAllReduce(buf, count, dtype, op, seq, opts.timeout);
  });
}

Status ProcessGroup::AllGather(const void* in, void* out, int64_t count, DType dtype,
                               const CollectiveOptions& opts) {
  return Run("all_gather", count, dtype, [&](uint64_t seq) {
    return count == 0 ? Status::Ok() : DoAllGather(in, out, count, dtype, seq, opts.timeout);
  });
}

Status ProcessGroup::ReduceScatter(const void* in, void* out, int64_t count, DType dtype,
                                   ReduceOp op, const CollectiveOptions& opts) {
  return Run(StrCat("reduce_scatter(", ReduceOpName(op), ")"), count, dtype, [&](uint64_t seq) {
    if (dtype != DType::kF32) return Unimplemented("reduce_scatter supports f32 buffers only");
    return count == 0 ? Status::Ok()
                      : DoReduceScatter(in, out, count, dtype, op, seq, opts.timeout);
  });
}

Status ProcessGroup::Broadcast(void* buf, int64_t count, DType dtype, int root,
                               const CollectiveOptions& opts) {
  return Run(StrCat("broadcast(root ", root, ")"), count, dtype, [&](uint64_t seq) {
    if (root < 0 || root >= size_) return InvalidArgument(StrCat("broadcast root ", root));
    return count == 0 ? Status::Ok() : DoBroadcast(buf, count, dtype, root, seq, opts.timeout);
  });
}

Status ProcessGroup::Barrier(const CollectiveOptions& opts) {
  return Run("barrier", 0, DType::kF32, [&](uint64_t seq) { return DoBarrier(seq, opts.timeout); });
}

CommThread::CommThread() : thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<Status> CommThread::Submit(std::function<Status()> task) {
  std::packaged_task<Status()> t(std::move(task));
  auto f = t.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(t));
  }
  cv_.notify_one();
  return f;
}

void CommThread::Loop() {
  for (;;) {
    std::packaged_task<Status()> t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    t();
  }
}

}  // namespace st::comm
