#pragma once
// Where a run starts: step 0, or a checkpoint (--resume-from PATH; --resume, the newest
// checkpoint that verifies; a restart by phalanx-run --max-restarts with a folder), whose
// state is loaded into the model, the optimizer and the schedule.
#include <cstdint>
#include <memory>
#include <string>

#include <phalanx/phalanx.hpp>

#include "svg_chart.hpp"
#include "training_setup.hpp"

namespace phalanx::trainer {

struct StartPoint {
  std::unique_ptr<parallel::CheckpointDir> ckdir;  ///< --checkpoint-dir (null: none)
  std::string resume_path;                         ///< the checkpoint resumed from ("" : a fresh run)
  parallel::CheckpointManifest resumed;            ///< its manifest
  std::int64_t step = 0, start_epoch = 0, skip_batches = 0;
  tools::Series train_curve{"train loss", {}, {}}, test_curve{"test loss", {}, {}};
  double elapsed_before = 0;  ///< training seconds before the resume point (metrics' clock)
  /// The checkpoint's --precision when it is not this run's ("": the same); announced.
  std::string precision_change;
};

/// Finds and loads the checkpoint to resume from, if any (one-line errors for a damaged or
/// mismatched one), into `s` (the epoch in progress's loss sums into its step plan); the
/// ranks are checked to agree on the step.
StartPoint find_start(const TrainConfig& c, TrainingSetup& s);

}  // namespace phalanx::trainer
