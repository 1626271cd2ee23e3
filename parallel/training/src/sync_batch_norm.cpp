#include "phalanx/parallel/sync_batch_norm.hpp"

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/nn/sequential.hpp"
#include "phalanx/core/ops.hpp"
#include "phalanx/parallel/init.hpp"

namespace phalanx::parallel {

namespace {

/// Elements [offset, offset + n) of a contiguous 1-D float tensor, sharing its storage.
Tensor slice(const Tensor& t, std::int64_t offset, std::int64_t n) {
  return Tensor(std::make_shared<TensorImpl>(t.impl()->storage(),
                                             t.impl()->byte_offset() + static_cast<std::size_t>(offset) * 4, Shape{n},
                                             DType::Float32));
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(std::int64_t num_features_, double eps_, std::optional<double> momentum_, bool affine_,
                             bool track, ProcessGroupPtr pg)
    : nn::BatchNorm(num_features_, eps_, momentum_, affine_, track), pg_(std::move(pg)) {}

ProcessGroupPtr SyncBatchNorm::process_group() const { return pg_ ? pg_ : default_process_group(); }

bool SyncBatchNorm::has_forward_collectives() const {
  return is_training() && process_group()->size() > 1;
}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  if (x.dim() < 2)
    throw ShapeError(detail::concat("SyncBatchNorm: expected at least 2D input [N, C, *] (got ", x.dim(), "D input ",
                                    shape_str(x.shape()), ")"));
  if (x.shape()[1] != num_features)
    throw ShapeError(detail::concat("SyncBatchNorm(", num_features, "): input ", shape_str(x.shape()), " has ",
                                    x.shape()[1], " channels (dim 1), expected ", num_features));
  const ProcessGroupPtr pg = process_group();
  // PyTorch: no synchronisation in eval mode, nor in a group of one.
  if (!is_training() || pg->size() == 1) return nn::BatchNorm::forward(x);
  // A 16-bit input (autocast's bf16 activations): statistics and normalisation in float32 on
  // the input's values, the output rounded back to its dtype, as BatchNorm's bf16 path
  // (phalanx-train --precision bf16 --sync-bn). The casts are differentiable.
  if (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16)
    return to_dtype(forward(to_dtype(x, DType::Float32)), x.dtype());
  const std::int64_t C = num_features, W = pg->size();
  std::int64_t local = x.shape()[0];
  for (std::int64_t i = 2; i < x.dim(); ++i) local *= x.shape()[i];
  const Device dev = x.device();
  DeviceKernels& k = kernels_for(dev);

  // [mean (C), biased var (C), count (1)] of this rank, gathered from every rank.
  Tensor mine = Tensor::empty({2 * C + 1}, DType::Float32, dev);
  if (local > 0) {
    const BatchNormStats st = batch_norm_stats(x);
    slice(mine, 0, C).copy_(st.mean);
    slice(mine, C, C).copy_(st.var);
  } else {  // an empty batch (a joined rank shadowing the others): zero weight in the sums
    slice(mine, 0, 2 * C).zero_();
  }
  slice(mine, 2 * C, 1).fill_(static_cast<double>(local));
  Tensor all = Tensor::empty({W * (2 * C + 1)}, DType::Float32, dev);
  std::vector<Tensor> parts;
  for (std::int64_t r = 0; r < W; ++r) parts.push_back(slice(all, r * (2 * C + 1), 2 * C + 1));
  pg->allgather(parts, mine)->wait();

  // The global statistics (Chan's combination): mean = sum_r n_r mean_r / N,
  // var = sum_r n_r (var_r + (mean_r - mean)^2) / N. The host reads the W counts, in one
  // transfer of the gathered buffer (W reads of one float each would be W device syncs).
  const Tensor host = all.to(Device::cpu());
  const float* h = host.data<float>();
  std::vector<double> counts(W);
  double total = 0;
  for (std::int64_t r = 0; r < W; ++r) total += counts[r] = h[r * (2 * C + 1) + 2 * C];
  if (total <= 1)
    throw ValueError(detail::concat("SyncBatchNorm: expected more than 1 value per channel across the group when "
                                    "training, got ", total, " (use larger batches, or eval mode)"));
  Tensor mean = zeros({C}, DType::Float32, dev), var = zeros({C}, DType::Float32, dev);
  Tensor d = Tensor::empty({C}, DType::Float32, dev);
  for (std::int64_t r = 0; r < W; ++r)
    if (counts[r] > 0) k.axpy(static_cast<float>(counts[r] / total), slice(parts[r], 0, C), mean);
  for (std::int64_t r = 0; r < W; ++r) {
    if (counts[r] <= 0) continue;
    k.binary(BinaryOp::Sub, slice(parts[r], 0, C), mean, d);
    k.binary(BinaryOp::Mul, d, d, d);
    k.axpy(1.f, slice(parts[r], C, C), d);
    k.axpy(static_cast<float>(counts[r] / total), d, var);
  }
  const std::int64_t N = static_cast<std::int64_t>(total);
  const double factor = next_average_factor();
  if (track_running_stats) update_running_stats(mean, var, N, factor);
  const Tensor invstd = batch_norm_invstd(var, eps);
  // Backward: sum_dy and sum_dy_xmu over the whole group, in one allreduce.
  auto reduce = [pg, C](Tensor& sum_dy, Tensor& sum_dy_xmu) {
    Tensor both = Tensor::empty({2 * C}, DType::Float32, sum_dy.device());
    slice(both, 0, C).copy_(sum_dy);
    slice(both, C, C).copy_(sum_dy_xmu);
    pg->allreduce(both, ReduceOp::Sum)->wait();
    sum_dy.copy_(slice(both, 0, C));
    sum_dy_xmu.copy_(slice(both, C, C));
  };
  return batch_norm_elemt(x, mean, invstd, weight, bias, true, total, reduce);
}

namespace {

bool contains_batch_norm(const nn::Module& m) {
  if (dynamic_cast<const nn::BatchNorm*>(&m)) return true;
  for (const auto& [n, c] : m.named_children())
    if (contains_batch_norm(*c)) return true;
  return false;
}

}  // namespace

nn::ModulePtr convert_sync_batchnorm(const nn::ModulePtr& module, ProcessGroupPtr pg) {
  if (!module) throw ValueError("convert_sync_batchnorm: the module is null");
  if (auto* bn = dynamic_cast<nn::BatchNorm*>(module.get())) {
    if (dynamic_cast<SyncBatchNorm*>(bn)) return module;
    auto sync = std::make_shared<SyncBatchNorm>(bn->num_features, bn->eps, bn->momentum, bn->affine,
                                                bn->track_running_stats, pg);
    const Device dev = bn->running_mean.defined() ? bn->running_mean.device()
                                                  : bn->weight.defined() ? bn->weight.device() : Device::cpu();
    if (dev != Device::cpu()) sync->to(dev);
    NoGradGuard no_grad;
    if (bn->affine) {
      sync->weight.copy_(bn->weight);
      sync->bias.copy_(bn->bias);
      sync->weight.requires_grad_(bn->weight.requires_grad());
      sync->bias.requires_grad_(bn->bias.requires_grad());
    }
    if (bn->track_running_stats) {
      sync->running_mean.copy_(bn->running_mean);
      sync->running_var.copy_(bn->running_var);
      sync->num_batches_tracked.copy_(bn->num_batches_tracked);
    }
    sync->train(bn->is_training());
    return sync;
  }
  if (!contains_batch_norm(*module)) return module;
  auto* seq = dynamic_cast<nn::Sequential*>(module.get());
  if (!seq)
    throw ConfigError("convert_sync_batchnorm: " + module->describe() +
                      " holds a BatchNorm but is not an nn::Sequential, so its children cannot be swapped; build "
                      "it with parallel::SyncBatchNorm in place of nn::BatchNorm*d");
  auto out = std::make_shared<nn::Sequential>();
  for (std::size_t i = 0; i < seq->size(); ++i) out->push_back(convert_sync_batchnorm((*seq)[i], pg));
  out->train(module->is_training());
  return out;
}

}  // namespace phalanx::parallel
