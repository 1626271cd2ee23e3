#include "failure_aware_store.hpp"

#include <thread>

namespace phalanx::parallel {

FailureAwareStore::FailureAwareStore(StorePtr inner, std::shared_ptr<FailureContext> ctx)
    : inner_(std::move(inner)), ctx_(std::move(ctx)) {
  timeout_ = inner_->timeout();
}

Bytes FailureAwareStore::get(const std::string& key) {
  wait({key}, timeout());
  return inner_->get(key);
}

void FailureAwareStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    if (inner_->check(keys)) return;
    if (auto first = ctx_->peer_first_failure()) {
      ctx_->peer_failed = true;
      ctx_->acknowledge();
      std::rethrow_exception(peer_failed_error(*first, detail::concat("rank ", ctx_->rank, " was in rendezvous")));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!inner_->check({k})) missing.push_back(k);
      throw_store_timeout(missing, timeout, "rendezvous store");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace phalanx::parallel
