#pragma once
// Rank 0's progress line: epoch, bar, step, loss, throughput and ETA, redrawn in place at
// most 10 times a second (and at each epoch's last step).
#include <chrono>
#include <cstdint>

namespace phalanx::trainer {

class ProgressBar {
 public:
  /// Whether rank `rank` should draw: rank 0, when stdout is a terminal or PHALANX_PROGRESS=1
  /// (e.g. under phalanx-run, whose workers write to a pipe); PHALANX_PROGRESS=0 turns it off.
  static bool wanted(int rank);
  /// Draws only when `enabled`.
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
  std::chrono::steady_clock::time_point epoch_start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace phalanx::trainer
