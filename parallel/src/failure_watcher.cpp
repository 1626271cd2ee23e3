#include "failure_watcher.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace phalanx::parallel {

struct FailureWatcher::Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool done = false;
};

FailureWatcher::FailureWatcher(std::shared_ptr<FailureContext> ctx, std::weak_ptr<ProcessGroup> group,
                               std::chrono::milliseconds period)
    : shared_(std::make_shared<Shared>()) {
  std::thread([sh = shared_, ctx = std::move(ctx), group = std::move(group), period] {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(sh->mu);
        if (sh->cv.wait_for(lock, period, [&] { return sh->stop; })) break;
      }
      std::optional<FailureRecord> first;
      try {
        first = ctx->peer_first_failure();
      } catch (const std::exception&) {
        break;  // the store is gone (its host exited): collectives notice the lost peers
      }
      if (!first) continue;
      ctx->peer_failed = true;
      if (auto g = group.lock())
        g->abort(peer_failed_error(*first, detail::concat("seen from rank ", ctx->rank, " through the store")));
      break;
    }
    std::lock_guard<std::mutex> lock(sh->mu);
    sh->done = true;
    sh->cv.notify_all();
  }).detach();
}

FailureWatcher::~FailureWatcher() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->stop = true;
  shared_->cv.notify_all();
  shared_->cv.wait_for(lock, std::chrono::seconds(1), [&] { return shared_->done; });
}

}  // namespace phalanx::parallel
