#pragma once
// The failure watcher: a light background thread that polls the store for another rank's
// failure record (`failure/first`) and aborts the group with it, so every pending or next
// collective fails with "rank R failed: <message>" instead of waiting for the timeout.
#include <chrono>
#include <memory>

#include "failure_records.hpp"

namespace phalanx::parallel {

class FailureWatcher {
 public:
  FailureWatcher(std::shared_ptr<FailureContext> ctx, std::weak_ptr<ProcessGroup> group,
                 std::chrono::milliseconds period = std::chrono::milliseconds(100));
  /// Stops the thread; waits at most about a second for a store request in flight, then
  /// leaves the (detached) thread to end on its own: it never keeps the process alive.
  ~FailureWatcher();
  FailureWatcher(const FailureWatcher&) = delete;
  FailureWatcher& operator=(const FailureWatcher&) = delete;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace phalanx::parallel
