#pragma once
// BatchNorm1d / BatchNorm2d with PyTorch 1.13's semantics, buffers and state_dict keys:
// weight, bias (affine), running_mean, running_var, num_batches_tracked (int64 []).
#include <optional>

#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// torch.nn.modules.batchnorm._BatchNorm. Training (or track_running_stats = false) normalises
/// with the batch's statistics (biased variance) and, when tracking, updates
/// running = (1 - f) * running + f * batch (unbiased variance for running_var), where f is
/// `momentum`, or 1 / num_batches_tracked when momentum is nullopt (a cumulative average).
/// Eval mode normalises with the running statistics. Training on one value per channel throws;
/// an empty batch gives an empty output and counts a step, stats unchanged (as PyTorch).
class BatchNorm : public Module {
 public:
  BatchNorm(std::int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
            bool affine = true, bool track_running_stats = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  /// Running stats to 0 / 1, num_batches_tracked to 0; weight 1, bias 0.
  void reset_parameters();
  void reset_running_stats();

  // For subclasses that gather batch statistics elsewhere (parallel::SyncBatchNorm):
  /// Whether this forward normalises with batch statistics (training, or not tracking).
  bool uses_batch_stats() const { return is_training() || !track_running_stats; }
  /// In training with running stats: increments num_batches_tracked on the device and returns
  /// the averaging factor f (reads the counter to the host only when momentum is nullopt);
  /// otherwise returns 0 and changes nothing. Call once per forward, as PyTorch does.
  double next_average_factor();
  /// running_mean/var = (1 - f) * running + f * (mean, var * count / (count - 1)); `var` is
  /// the biased variance over `count` values per channel (of the whole group for SyncBatchNorm).
  void update_running_stats(const Tensor& mean, const Tensor& var, std::int64_t count, double factor);
  /// Throws the module's one-line ShapeError unless x has the dims this class accepts.
  virtual void check_input_dim(const Tensor& x) const;

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  std::int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;
  virtual const char* kind() const { return "BatchNorm"; }

 private:
  Tensor one_;  ///< float 1 on the module's device: the increment of num_batches_tracked
};

/// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  using BatchNorm::BatchNorm;
  void check_input_dim(const Tensor& x) const override;

 protected:
  const char* kind() const override { return "BatchNorm1d"; }
};

/// Input [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  using BatchNorm::BatchNorm;
  void check_input_dim(const Tensor& x) const override;

 protected:
  const char* kind() const override { return "BatchNorm2d"; }
};

}  // namespace phalanx::nn
