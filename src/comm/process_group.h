// ProcessGroup: the narrow collective interface every parallel algorithm uses (tensor parallelism,
// FSDP). Backends (Gloo today, NCCL later) implement the protected Do* hooks; callers only see the
// public calls below. Every call is numbered (seq), recorded in a small ring buffer, bounded by a
// timeout, and on failure returns one Status naming rank, host, op, seq and the ranks that did not
// arrive, after printing the ring buffer to stderr. Contract: all ranks of a group issue the same
// collectives in the same order with the same counts (write this next to every caller).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace st::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* ReduceOpName(ReduceOp op);

struct CollectiveOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// One entry of the per-rank ring buffer of recent collectives.
struct CollectiveRecord {
  uint64_t seq = 0;
  std::string op;  // "all_reduce(sum)", "all_gather", ...
  int64_t count = 0;
  DType dtype = DType::kF32;
  enum class State { kStarted, kDone, kFailed } state = State::kStarted;
  double millis = 0;
};

// Running totals of the collectives a group has completed on this rank (observability: a caller
// takes the difference between two reads). bytes: the local buffer a collective reads or writes,
// count x dtype size, times size() for all_gather (output) and reduce_scatter (input); not bytes
// on the wire, which depend on the backend's algorithm.
struct CollectiveTotals {
  int64_t ops = 0;
  size_t bytes = 0;
  double seconds = 0;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, std::string name, std::string host);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::string& host() const { return host_; }
  // How this group's data travels: "tcp", "shm", "shm+tcp" (hierarchical).
  virtual std::string transport() const = 0;

  // buf: [count], in place. kAvg divides the sum by size(). bf16 is reduced in fp32.
  Status AllReduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                   const CollectiveOptions& opts = {});
  // in: [count] per rank; out: [size() * count], rank r's block at r * count. In place when
  // in == out + rank() * count (FSDP gathers into its flat buffer this way).
  Status AllGather(const void* in, void* out, int64_t count, DType dtype,
                   const CollectiveOptions& opts = {});
  // in: [size() * count]; out: [count] = reduction over ranks of block rank() (f32 only).
  Status ReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                       const CollectiveOptions& opts = {});
  // buf: [count]; root's values are copied to every rank.
  Status Broadcast(void* buf, int64_t count, DType dtype, int root,
                   const CollectiveOptions& opts = {});
  Status Barrier(const CollectiveOptions& opts = {});

  // Sequence number of the last collective issued on this rank (0 before the first).
  uint64_t seq() const;
  // The ring buffer, oldest first, one line per collective.
  std::string RecentCollectives() const;
  // Totals over every collective completed so far (any thread).
  CollectiveTotals totals() const;

  static constexpr int kRingSize = 32;

 protected:
  virtual Status DoAllReduce(void* buf, int64_t count, DType dtype, ReduceOp op, uint64_t seq,
                             std::chrono::milliseconds timeout) = 0;
  virtual Status DoAllGather(const void* in, void* out, int64_t count, DType dtype, uint64_t seq,
                             std::chrono::milliseconds timeout) = 0;
  virtual Status DoReduceScatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                                 uint64_t seq, std::chrono::milliseconds timeout) = 0;
  virtual Status DoBroadcast(void* buf, int64_t count, DType dtype, int root, uint64_t seq,
                             std::chrono::milliseconds timeout) = 0;
  virtual Status DoBarrier(uint64_t seq, std::chrono::milliseconds timeout) = 0;
  // Called when collective `seq` starts on this rank (a backend may publish progress).
  virtual void OnStart(uint64_t /*seq*/) {}
  // Ranks known not to have reached collective `seq` ("" when the backend cannot tell).
  virtual std::string MissingRanks(uint64_t /*seq*/) { return ""; }

 private:
  Status Run(const std::string& op, int64_t count, DType dtype,
             const std::function<Status(uint64_t)>& body);

  const int rank_;
  const int size_;
  const std::string name_;
  const std::string host_;
  mutable std::mutex mu_;
  uint64_t seq_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  std::deque<CollectiveRecord> ring_;
  CollectiveTotals totals_;
};

// Runs submitted communication tasks in order on one thread (FSDP's prefetch / overlap): the
// caller keeps computing and waits on the future when it needs the result. Move-only owner of
// its thread; the destructor drains the queue.
class CommThread {
 public:
  CommThread();
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;
  std::future<Status> Submit(std::function<Status()> task);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<Status()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace st::comm
