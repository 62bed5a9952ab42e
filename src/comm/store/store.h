// Rendezvous key-value stores (the role of PyTorch's c10d Store): ranks exchange addresses and
// small results through them. Three kinds: MemoryStore (threads-as-ranks tests), TcpStoreClient
// (served by rank 0, see tcp_store.h) and PrefixStore (a namespace for a sub-group). Not a
// database: values are small byte strings, nothing persists.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace st::comm {

struct StoreOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

class Store {
 public:
  virtual ~Store() = default;
  virtual Status Set(const std::string& key, const std::string& value,
                     const StoreOptions& opts = {}) = 0;
  // Waits until the key exists, then returns its value; a timeout names the key.
  virtual StatusOr<std::string> Get(const std::string& key, const StoreOptions& opts = {}) = 0;
  // Adds `delta` to the integer stored at key (0 when absent) and returns the new value.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta,
                                const StoreOptions& opts = {}) = 0;
  // Sets key to `desired` if its value equals `expected` (an absent key matches an empty
  // `expected`). Returns the value after the call.
  virtual StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                           const std::string& desired,
                                           const StoreOptions& opts = {}) = 0;
  // Waits until every key exists.
  virtual Status Wait(const std::vector<std::string>& keys, const StoreOptions& opts = {}) = 0;
  // True when every key exists now (does not wait).
  virtual StatusOr<bool> Check(const std::vector<std::string>& keys,
                               const StoreOptions& opts = {}) = 0;
};

// The table behind MemoryStore and the TCP store server: a map, a mutex, a condition variable.
class KvTable {
 public:
  void Set(const std::string& key, const std::string& value);
  // Waits until `keys` all exist or the deadline passes; returns false on timeout.
  bool WaitFor(const std::vector<std::string>& keys,
               std::chrono::steady_clock::time_point deadline);
  std::string GetExisting(const std::string& key);
  int64_t Add(const std::string& key, int64_t delta);
  std::string CompareSet(const std::string& key, const std::string& expected,
                         const std::string& desired);
  bool Check(const std::vector<std::string>& keys);
  // Wakes every waiter and makes later waits fail at once (server shutdown).
  void Stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  bool stopped_ = false;
};

// In-process store shared by threads acting as ranks.
class MemoryStore final : public Store {
 public:
  Status Set(const std::string& key, const std::string& value, const StoreOptions& opts) override;
  StatusOr<std::string> Get(const std::string& key, const StoreOptions& opts) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, const StoreOptions& opts) override;
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired, const StoreOptions& opts) override;
  Status Wait(const std::vector<std::string>& keys, const StoreOptions& opts) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys, const StoreOptions& opts) override;

 private:
  KvTable table_;
};

// Prepends "<prefix>/" to every key; the base store must outlive it (shared ownership).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  Status Set(const std::string& key, const std::string& value, const StoreOptions& opts) override;
  StatusOr<std::string> Get(const std::string& key, const StoreOptions& opts) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta, const StoreOptions& opts) override;
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired, const StoreOptions& opts) override;
  Status Wait(const std::vector<std::string>& keys, const StoreOptions& opts) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys, const StoreOptions& opts) override;

 private:
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// A store barrier: every one of `world` participants calls it with the same name.
Status StoreBarrier(Store& store, const std::string& name, int world,
                    const StoreOptions& opts = {});

}  // namespace st::comm
