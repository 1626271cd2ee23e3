#pragma once
// SyncBatchNorm (PyTorch 1.13's torch.nn.SyncBatchNorm, docs/ddp.md "SyncBatchNorm"): a
// BatchNorm whose training statistics are those of the whole group's batch. Forward: each
// rank's per-channel mean, biased variance and count are all-gathered (one collective; ranks
// may hold different batch sizes, even none), combined into the global mean and variance,
// which normalise and update the running statistics (unbiased, over the global count).
// Backward: the per-channel sums of grad and grad * (x - mean) are all-reduced (one
// collective, only when the input needs a gradient, as PyTorch), then the input gradient
// is formed from the global sums; weight and bias gradients stay local (DDP sums them).
// Eval mode (running statistics) and a group of one behave exactly as nn::BatchNorm.
// Everything runs on the tensors' device through its kernel table and the group's
// collectives; the host reads only the W per-rank counts.
//
//   auto model = parallel::convert_sync_batchnorm(make_cnn());   // before DDP wraps it
//   DDP ddp(model, pg);
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/nn/batchnorm.hpp"
#include "phalanx/parallel/join.hpp"

namespace phalanx::parallel {

class SyncBatchNorm : public nn::BatchNorm, public ForwardCollectives {
 public:
  /// Input [N, C, *] (any of BatchNorm1d/2d's shapes). pg: the group the statistics span
  /// (null: the default group, looked up at each forward).
  SyncBatchNorm(std::int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                bool affine = true, bool track_running_stats = true, ProcessGroupPtr pg = nullptr);
  Tensor forward(const Tensor& x) override;
  /// Collectives in the next forward: training with batch statistics on a group of two or more.
  bool has_forward_collectives() const override;
  ProcessGroupPtr process_group() const;

 protected:
  const char* kind() const override { return "SyncBatchNorm"; }

 private:
  ProcessGroupPtr pg_;
};

/// Returns `module` with every nn::BatchNorm (1d, 2d) in its tree replaced by a SyncBatchNorm
/// over `pg` with the same options, weights, buffers, requires_grad and training mode (PyTorch's
/// convert_sync_batchnorm; use the returned pointer). Sequential containers are rebuilt around
/// their converted children (the other layers are shared, not copied); a BatchNorm inside
/// another kind of container is a ConfigError (build that module with SyncBatchNorm instead).
nn::ModulePtr convert_sync_batchnorm(const nn::ModulePtr& module, ProcessGroupPtr pg = nullptr);

}  // namespace phalanx::parallel
