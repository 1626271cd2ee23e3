#pragma once
// Evaluation over a dataset sharded across the ranks, and summing counters over ranks.
#include <memory>
#include <utility>

#include <phalanx/phalanx.hpp>

namespace phalanx::trainer {

/// Sums a small host tensor of counters over the ranks. The group may be NCCL, which only
/// reduces device tensors, so the reduction happens on `device`.
Tensor sum_over_ranks(const Tensor& host, ProcessGroup& pg, Device device);

/// The loss of a step's forward: cross-entropy of logits [N, C] against targets [N], or of a
/// language model's logits [B, T, V] against targets [B, T] (the mean over the B x T tokens).
Tensor model_loss(const Tensor& out, const Tensor& target, Reduction reduction = Reduction::Mean);

/// A language model's mean loss per token over a text set (each rank its shard of the
/// windows, summed over the ranks).
double evaluate_lm(nn::Module& model, const std::shared_ptr<samplers::TextDataset>& ds, ProcessGroup& pg);

/// (mean loss, accuracy) over a dataset: each rank evaluates its shard, summed over ranks.
std::pair<double, double> evaluate(nn::Module& model, const std::shared_ptr<samplers::TensorDataset>& ds,
                                   ProcessGroup& pg);

}  // namespace phalanx::trainer
