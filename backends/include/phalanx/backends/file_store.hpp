#pragma once
#include "phalanx/backends/store.hpp"

namespace phalanx {

/// A store in one file on a filesystem every rank sees (file:// init). The file is an
/// append-only log of records, each operation taking an exclusive flock; readers replay it.
/// Waiting polls. Suited to rendezvous, not to heavy traffic.
class FileStore : public Store {
 public:
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultTimeout);
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
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace phalanx
