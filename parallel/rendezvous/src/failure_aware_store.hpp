#pragma once
// A Store whose blocking reads (get, wait) give up as soon as another rank posts its
// failure: rendezvous (the check-in, Gloo's connectFullMesh) then fails within a fraction
// of a second with "rank R failed: <message>" instead of waiting for the timeout.
#include <memory>

#include "phalanx/parallel/internal/failure_records.hpp"

namespace phalanx::parallel {

class FailureAwareStore : public Store {
 public:
  FailureAwareStore(StorePtr inner, std::shared_ptr<FailureContext> ctx);
  void set(const std::string& key, const Bytes& value) override { inner_->set(key, value); }
  Bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override { return inner_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  /// Polls (20 ms, growing to 100 ms) for the keys and for a peer's failure.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  using Store::set;
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  std::int64_t num_keys() override { return inner_->num_keys(); }

 private:
  StorePtr inner_;
  std::shared_ptr<FailureContext> ctx_;
};

}  // namespace phalanx::parallel
