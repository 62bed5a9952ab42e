#include "comm/store/store.h"

#include <cstdlib>

namespace st::comm {

void KvTable::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
  }
  cv_.notify_all();
}

bool KvTable::WaitFor(const std::vector<std::string>& keys,
                      std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all = [&] {
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  };
  return cv_.wait_until(lock, deadline, [&] { return stopped_ || all(); }) && !stopped_;
}

void KvTable::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

std::string KvTable::GetExisting(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_.find(key);
  return it == kv_.end() ? std::string() : it->second;
}

int64_t KvTable::Add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_.find(key);
    const int64_t old = it == kv_.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
    // Wraps around like a two's-complement counter: a client can send any delta, and signed
    // overflow would be undefined behaviour in the server.
    v = static_cast<int64_t>(static_cast<uint64_t>(old) + static_cast<uint64_t>(delta));
    kv_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

std::string KvTable::CompareSet(const std::string& key, const std::string& expected,
                                const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_.find(key);
    if ((it == kv_.end() && expected.empty()) || (it != kv_.end() && it->second == expected)) {
      kv_[key] = desired;
      result = desired;
    } else {
      result = it == kv_.end() ? std::string() : it->second;
    }
  }
  cv_.notify_all();
  return result;
}

bool KvTable::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys)
    if (!kv_.count(k)) return false;
  return true;
}

namespace {
std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}
}  // namespace

Status MemoryStore::Set(const std::string& key, const std::string& value, const StoreOptions&) {
  table_.Set(key, value);
  return Status::Ok();
}
StatusOr<std::string> MemoryStore::Get(const std::string& key, const StoreOptions& opts) {
  ST_RETURN_IF_ERROR(Wait({key}, opts));
  return table_.GetExisting(key);
}
StatusOr<int64_t> MemoryStore::Add(const std::string& key, int64_t delta, const StoreOptions&) {
  return table_.Add(key, delta);
}
StatusOr<std::string> MemoryStore::CompareSet(const std::string& key, const std::string& expected,
                                              const std::string& desired, const StoreOptions&) {
  return table_.CompareSet(key, expected, desired);
}
Status MemoryStore::Wait(const std::vector<std::string>& keys, const StoreOptions& opts) {
  if (!table_.WaitFor(keys, std::chrono::steady_clock::now() + opts.timeout))
    return Unavailable(StrCat("store wait for [", JoinKeys(keys), "] timed out after ",
                              opts.timeout.count(), " ms"));
  return Status::Ok();
}
StatusOr<bool> MemoryStore::Check(const std::vector<std::string>& keys, const StoreOptions&) {
  return table_.Check(keys);
}

std::vector<std::string> PrefixStore::Keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}
Status PrefixStore::Set(const std::string& key, const std::string& value,
                        const StoreOptions& opts) {
  return base_->Set(prefix_ + key, value, opts);
}
StatusOr<std::string> PrefixStore::Get(const std::string& key, const StoreOptions& opts) {
  return base_->Get(prefix_ + key, opts);
}
StatusOr<int64_t> PrefixStore::Add(const std::string& key, int64_t delta,
                                   const StoreOptions& opts) {
  return base_->Add(prefix_ + key, delta, opts);
}
StatusOr<std::string> PrefixStore::CompareSet(const std::string& key, const std::string& expected,
                                              const std::string& desired,
                                              const StoreOptions& opts) {
  return base_->CompareSet(prefix_ + key, expected, desired, opts);
}
Status PrefixStore::Wait(const std::vector<std::string>& keys, const StoreOptions& opts) {
  return base_->Wait(Keys(keys), opts);
}
StatusOr<bool> PrefixStore::Check(const std::vector<std::string>& keys, const StoreOptions& opts) {
  return base_->Check(Keys(keys), opts);
}

Status StoreBarrier(Store& store, const std::string& name, int world, const StoreOptions& opts) {
  ST_ASSIGN_OR_RETURN(int64_t arrived, store.Add("barrier/" + name + "/count", 1, opts));
  if (arrived == world) ST_RETURN_IF_ERROR(store.Set("barrier/" + name + "/done", "1", opts));
  return store.Wait({"barrier/" + name + "/done"}, opts)
      .WithContext(StrCat("barrier '", name, "' (", world, " participants)"));
}

}  // namespace st::comm
