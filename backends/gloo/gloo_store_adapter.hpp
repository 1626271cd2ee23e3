#pragma once
// Lets Gloo's rendezvous (connectFullMesh) use a Phalanx Store.
#include <gloo/rendezvous/store.h>

#include "phalanx/backends/store.hpp"

namespace phalanx::gloo_backend {

class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(StorePtr store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes b = store_->get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  StorePtr store_;
};

}  // namespace phalanx::gloo_backend
