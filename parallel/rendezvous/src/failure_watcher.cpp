#include "failure_watcher.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

namespace phalanx::parallel {

struct FailureWatcher::Shared {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool done = false;
};

std::chrono::milliseconds FailureWatcher::period_for(int world) {
  // 100 ms up to 16 ranks, then growing with the world so the store (one thread on rank 0
  // or the launcher) serves about 160 checks a second whatever the world; at most 1 s, so a
  // failure still arrives within the 2 s bar.
  const int scaled = 100 * std::max(1, world / 16);
  return std::chrono::milliseconds(std::min(scaled, 1000));
}

FailureWatcher::FailureWatcher(std::shared_ptr<FailureContext> ctx, std::weak_ptr<ProcessGroup> group,
                               std::chrono::milliseconds period)
    : shared_(std::make_shared<Shared>()) {
  if (period.count() <= 0) period = period_for(ctx->world);
  std::thread([sh = shared_, ctx = std::move(ctx), group = std::move(group), period] {
    // Jitter (+-20%), so the ranks' checks do not arrive at the store together.
    std::minstd_rand jitter(static_cast<unsigned>(ctx->rank) * 7919u + 17u);
    std::uniform_int_distribution<long> spread(-period.count() / 5, period.count() / 5);
    auto wait = period + std::chrono::milliseconds(spread(jitter));
    int errors = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(sh->mu);
        if (sh->cv.wait_for(lock, wait, [&] { return sh->stop; })) break;
      }
      // This rank posted its own record: it is failing already, nothing more to learn.
      if (ctx->posted) break;
      std::optional<FailureRecord> first;
      try {
        first = ctx->peer_first_failure();
        errors = 0;
        wait = period + std::chrono::milliseconds(spread(jitter));
      } catch (const std::exception& e) {
        // The store may be back soon (a busy host) or gone for good (its host exited: then
        // the collectives notice the lost peers). Retry with backoff, say so once.
        if (errors++ == 0)
          std::fprintf(stderr, "phalanx: rank %d: the failure watcher cannot read the store (%s); retrying with backoff\n",
                       ctx->rank, e.what());
        wait = std::min(period * (1 << std::min(errors, 6)), std::chrono::milliseconds(5000));
        continue;
      }
      if (!first) continue;
      ctx->peer_failed = true;
      ctx->acknowledge();
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
