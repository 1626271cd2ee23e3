#pragma once
// The report of finished epochs: their losses summed over the ranks, rank 0's console lines,
// the --metrics epoch records and the loss curves (--plot, checkpoints). Short epochs are
// reported in groups (the trainer decides when: docs/benchmarks.md); every rank takes part.
#include <cstdint>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "metrics_log.hpp"
#include "progress_bar.hpp"
#include "svg_chart.hpp"

namespace phalanx::trainer {

/// One finished epoch, waiting for its report.
struct PendingEpoch {
  std::int64_t epoch;
  float loss_sum = 0, steps = 0;  ///< this rank's sums (losses not agreed)
  double test_loss = 0, test_acc = -1;
  double agreed_loss = 0;  ///< losses agreed (exact mode): the epoch's loss, already over all ranks
};

class EpochReporter {
 public:
  struct Context {
    ProcessGroup* pg;
    Device device;
    bool agreed;    ///< the losses are the same on every rank (exact mode): no sum over the ranks
    bool has_test;  ///< a test set: test loss and accuracy in each report
    /// A language model's validation set (has_test too): its loss in each report as
    /// "validation loss" (val_loss in the metrics), no accuracy.
    bool validation = false;
  };
  /// `train_curve`/`test_curve`: the curves so far (a resumed run's, from its checkpoint).
  EpochReporter(Context ctx, MetricsLog& metrics, ProgressBar& progress, tools::Series train_curve,
                tools::Series test_curve);

  /// An epoch of `steps` steps finished; reported at the next report().
  void add(const PendingEpoch& done, std::int64_t steps);
  /// Steps of the epochs waiting for their report.
  std::int64_t steps_unreported() const { return steps_unreported_; }
  /// Reports the epochs waiting (none: nothing). With `summed` false (a run stopped by an
  /// error, where a collective could hang) no rank communicates: rank 0 reports its own
  /// batches' losses, marked so (and in the metrics file as `train_loss_rank0`), unless it
  /// is the only rank.
  void report(bool summed);

  /// The last epoch's loss reported (a resumed run: its checkpoint's; NaN before any).
  double last_epoch_loss() const { return last_epoch_loss_; }
  /// The last test accuracy reported (-1: none).
  double test_acc() const { return test_acc_; }
  const tools::Series& train_curve() const { return train_curve_; }
  const tools::Series& test_curve() const { return test_curve_; }

 private:
  Context ctx_;
  int world_, rank_;
  MetricsLog& metrics_;
  ProgressBar& progress_;
  tools::Series train_curve_, test_curve_;
  std::vector<PendingEpoch> pending_;
  std::int64_t steps_unreported_ = 0;
  std::string console_;  // rank 0's epoch lines of one report
  double last_epoch_loss_;
  double test_acc_ = -1;
};

}  // namespace phalanx::trainer
