#pragma once
#include <condition_variable>
#include <map>
#include <mutex>

#include "phalanx/backends/store.hpp"

namespace phalanx {

/// An in-process store for ranks run as threads (tests, single-process simulations).
class MemoryStore : public Store {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout = kDefaultTimeout) { timeout_ = timeout; }
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

}  // namespace phalanx
