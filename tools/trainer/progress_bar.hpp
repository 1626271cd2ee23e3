#pragma once
// Rank 0's progress line: epoch, bar, step, loss, throughput and ETA, redrawn in place.
#include <chrono>
#include <cstdint>

namespace phalanx::trainer {

class ProgressBar {
 public:
  /// Draws only when `enabled` (rank 0 on a terminal).
  ProgressBar(bool enabled, int epochs, std::int64_t steps_per_epoch, std::int64_t global_batch);
  bool enabled() const { return enabled_; }
  /// A new epoch starts; `skipped` of its steps were done before a resume.
  void start_epoch(std::int64_t epoch, std::int64_t skipped);
  /// Step `done` (1-based, within the epoch) finished with this loss.
  void update(std::int64_t done, double loss);
  /// Ends the line (before the epoch's summary is printed).
  void end_epoch();

 private:
  bool enabled_;
  int epochs_;
  std::int64_t steps_, global_batch_, epoch_ = 0, skipped_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
};

}  // namespace phalanx::trainer
