#pragma once
// Evaluation over a dataset sharded across the ranks, and summing counters over ranks.
#include <memory>
#include <utility>

#include <phalanx/phalanx.hpp>

namespace phalanx::trainer {

/// Sums a small host tensor of counters over the ranks. The group may be NCCL, which only
/// reduces device tensors, so the reduction happens on `device`.
Tensor sum_over_ranks(const Tensor& host, ProcessGroup& pg, Device device);

/// (mean loss, accuracy) over a dataset: each rank evaluates its shard, summed over ranks.
std::pair<double, double> evaluate(nn::Module& model, const std::shared_ptr<samplers::TensorDataset>& ds,
                                   ProcessGroup& pg);

}  // namespace phalanx::trainer
