#include "phalanx/backends/memory_store.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx {

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes MemoryStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(mu_);
  return data_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    v = (it == data_.end() ? 0 : parse_store_int(it->second, key)) + delta;
    const std::string s = std::to_string(v);
    data_[key] = Bytes(s.begin(), s.end());
  }
  cv_.notify_all();
  return v;
}

Bytes MemoryStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected))
      data_[key] = desired;
    out = data_.count(key) ? data_[key] : Bytes{};
  }
  cv_.notify_all();
  return out;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all)) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!data_.count(k)) missing.push_back(k);
    throw_store_timeout(missing, timeout, "memory store");
  }
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<std::int64_t>(data_.size());
}

}  // namespace phalanx
