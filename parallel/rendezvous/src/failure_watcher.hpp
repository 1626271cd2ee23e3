#pragma once
// The failure watcher: a light background thread that polls the store for another rank's
// failure record (`failure/first`) and aborts the group with it, so every pending or next
// collective fails with "rank R failed: <message>" instead of waiting for the timeout. It
// stops once this rank posted its own record; a store error is retried with backoff.
#include <chrono>
#include <memory>

#include "phalanx/parallel/internal/failure_records.hpp"

namespace phalanx::parallel {

class FailureWatcher {
 public:
  /// `period` 0: period_for(ctx->world).
  FailureWatcher(std::shared_ptr<FailureContext> ctx, std::weak_ptr<ProcessGroup> group,
                 std::chrono::milliseconds period = std::chrono::milliseconds(0));
  /// Stops the thread; waits at most about a second for a store request in flight, then
  /// leaves the (detached) thread to end on its own: it never keeps the process alive.
  ~FailureWatcher();
  FailureWatcher(const FailureWatcher&) = delete;
  /// The check period: 100 ms up to 16 ranks, growing with the world, at most 1 s (each
  /// check then gets +-20% jitter); errors back off up to 5 s.
  static std::chrono::milliseconds period_for(int world);
  FailureWatcher& operator=(const FailureWatcher&) = delete;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace phalanx::parallel
