#pragma once
#include "phalanx/backends/store.hpp"

namespace phalanx {

/// Puts every key under "<prefix>/" of another store (one namespace per group or restart).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, StorePtr inner);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  /// The inner store's count (all prefixes), as PyTorch's PrefixStore.
  std::int64_t num_keys() override;
  const StorePtr& inner() const { return inner_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> ks(const std::vector<std::string>& keys) const;
  std::string prefix_;
  StorePtr inner_;
};

}  // namespace phalanx
