#pragma once
// When phalanx-train reports finished epochs and writes checkpoints.
#include <cstdint>

namespace phalanx::trainer {

struct Cadence {
  /// Finished epochs are reported (their losses summed over the ranks, printed, recorded) at
  /// once every kReportSteps steps at least, not one by one: with epochs of a few steps, a
  /// reduction and a console line each cost as much as a step (docs/benchmarks.md).
  static constexpr std::int64_t kReportSteps = 64;

  std::int64_t epochs = 0;
  std::int64_t checkpoint_every = 0;  ///< --checkpoint-every N steps (0: at each epoch's end)
  bool checkpoint_dir = false;        ///< --checkpoint-dir given
  bool test_set = false;              ///< a test set: evaluated after every epoch
  bool report_every_epoch = false;    ///< a progress bar on rank 0 (the ranks agree on it)

  /// After global step `step` (1-based).
  bool checkpoint_after_step(std::int64_t step) const { return checkpoint_every > 0 && step % checkpoint_every == 0; }
  /// After epoch `epoch` (0-based) ends; the last epoch's checkpoint is the final one.
  bool checkpoint_after_epoch(std::int64_t epoch) const {
    return checkpoint_dir && checkpoint_every == 0 && epoch + 1 < epochs;
  }
  /// Whether the epochs waiting are reported now that epoch `epoch` ended: an epoch of
  /// kReportSteps steps or more (with those waiting), the last epoch, an epoch with a test
  /// set or a checkpoint, and every epoch under a progress bar are reported as they end.
  bool report_after_epoch(std::int64_t epoch, std::int64_t steps_unreported, bool checkpoint_now) const {
    return report_every_epoch || checkpoint_now || test_set || epoch + 1 == epochs || steps_unreported >= kReportSteps;
  }
};

}  // namespace phalanx::trainer
