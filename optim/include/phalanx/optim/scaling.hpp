#pragma once
// The linear-scaling recipe (Goyal et al. 2017, the textbook's case study): when the global
// batch grows k times, scale the learning rate k times, and warm up when early loss
// oscillates. Rule of thumb: fix the global batch first, then the learning rate, the device
// count last. Everything here depends on the global batch, never on the world size alone,
// so changing the number of workers does not change the training result.
#include <cstdint>
#include <string>
#include <vector>

namespace phalanx::optim {

enum class RemainderPolicy {
  Error,   ///< the world size must divide the global batch (default)
  Uneven,  ///< the first (global_batch % world_size) ranks take one sample more
};

struct ScalingOptions {
  double base_lr = 0.1;           ///< the rate tuned at base_batch
  std::int64_t base_batch = 64;   ///< the global batch base_lr was tuned at
  std::int64_t global_batch = 64; ///< the global batch to train with
  int world_size = 1;
  /// Warmup in epochs (Goyal et al. use 5) applied when the rate is scaled up; 0 = none.
  double warmup_epochs = 0.0;
  std::int64_t dataset_size = 0;  ///< needed to turn warmup epochs into steps
  RemainderPolicy remainder = RemainderPolicy::Error;
};

struct ScalingPlan {
  double lr;                      ///< base_lr * global_batch / base_batch
  double scale;                   ///< global_batch / base_batch
  std::int64_t per_rank_batch;    ///< global_batch / world_size (floor under Uneven)
  std::vector<std::int64_t> rank_batches;  ///< each rank's share (they sum to global_batch)
  std::int64_t steps_per_epoch;   ///< ceil(dataset_size / global_batch), 0 without a dataset size
  std::int64_t warmup_steps;      ///< 0 when not scaled up or no warmup asked for
  /// One line for logs: "global batch 256 = 4 x 64, lr 0.1 x 4 = 0.4, warmup 10 steps".
  std::string describe() const;
};

/// Computes the plan; throws ValueError with what to change for an impossible request.
ScalingPlan linear_scaling(const ScalingOptions& options);

}  // namespace phalanx::optim
