#pragma once
// How one optimizer step runs, so that the training loop never asks which mode it is in.
// Normal mode: one forward/backward pass of this rank's shard of the global batch
// (DistributedSampler), whose backward all-reduces; the loss logged is this rank's, summed
// over the ranks at each epoch's report. Exact mode (docs/exact.md): this rank's
// micro-batches of the global batch (MicroBatchSampler), whose last backward leaves the
// step's gradients; the loss logged is the mean over the global batch's micro-batches, the
// same on every rank and world size. The plan owns the sampler's split, the passes of a
// step, the step's loss and the epoch's loss sums, and how these go into a checkpoint and
// come back.
#include <cstdint>
#include <memory>
#include <string>

#include <phalanx/phalanx.hpp>

#include "epoch_report.hpp"
#include "train_config.hpp"

namespace phalanx::trainer {

/// Where a step is, for its error messages.
struct StepWhere {
  std::int64_t step, epoch, batch_index, steps_per_epoch;  ///< step and epoch 0-based, batch_index the steps done
};

class StepPlan {
 public:
  virtual ~StepPlan() = default;

  // Set-up (training_setup.cpp).
  /// DDP's options for the model.
  virtual parallel::DDPOptions ddp_options() const = 0;
  /// The sampler of the `n` training samples: this rank's part of every step.
  virtual samplers::SamplerPtr make_sampler(std::int64_t n) = 0;
  /// The loader's options: batches of pass_batch() samples.
  virtual samplers::DataLoaderOptions loader_options() const = 0;
  /// Steps per epoch, given the loader over make_sampler()'s sampler.
  virtual std::int64_t steps_per_epoch(const samplers::DataLoader& loader) const = 0;
  /// Samples per forward/backward pass on this rank (a checkpoint's micro_batch).
  virtual std::int64_t pass_batch() const = 0;
  /// Whether a checkpoint is written in exact mode (its manifest says so; docs/checkpoints.md).
  virtual bool exact() const = 0;
  /// Whether the losses logged are the same on every rank already (no sum over the ranks).
  virtual bool losses_agreed() const = 0;
  /// Rank 0's line at the start of the run about how steps run ("": none).
  virtual std::string describe() const = 0;

  // The loop (trainer.cpp).
  /// Forward/backward passes per step on this rank.
  virtual std::int64_t passes() const = 0;
  /// A step starts (its passes follow).
  virtual void begin_step() = 0;
  /// Pass `micro` in a message about it: "" or ", micro-batch J".
  virtual std::string pass_label(std::int64_t micro) const = 0;
  /// The backward of pass `micro`, whose loss is `loss` (its value `value`).
  virtual void backward(Tensor& loss, float value, std::int64_t micro, const StepWhere& where) = 0;
  /// The loss the step logs, its last pass's loss being `last` (exact mode: collective).
  virtual double step_loss(float last, ProcessGroup& pg, Device device) = 0;
  /// The step was taken: its losses join the epoch's sums.
  virtual void add_step(float last, double step_loss) = 0;
  /// The epoch ended: its sums into `done`, then zeroed for the next.
  virtual void end_epoch(PendingEpoch& done) = 0;

  // Checkpoints (trainer.cpp, resume.cpp).
  /// The epoch in progress's sums into `state`; every rank calls it (normal mode gathers
  /// every rank's sums to all).
  virtual void save_epoch_sums(parallel::CheckpointState& state, ProcessGroup& pg, Device device) const = 0;
  /// Back from checkpoint `path` (IoError for a damaged one).
  virtual void restore_epoch_sums(const parallel::CheckpointState& state, int world, int rank,
                                  const std::string& path) = 0;
};

/// The plan of `c` on `world` ranks. Throws ConfigError (one line) when exact mode's batch
/// sizes do not fit the world size; called before the linear scaling's own check.
std::unique_ptr<StepPlan> make_step_plan(const TrainConfig& c, int world);

}  // namespace phalanx::trainer
