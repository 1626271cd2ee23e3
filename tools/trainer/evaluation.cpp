#include "evaluation.hpp"

#include <algorithm>

#include "phalanx/core/timeline.hpp"

namespace phalanx::trainer {

using samplers::DistributedSampler;
using samplers::TensorDataset;

Tensor sum_over_ranks(const Tensor& host, ProcessGroup& pg, Device device) {
  Tensor on = host.to(device);
  pg.allreduce(on)->wait();
  return on.to(Device::cpu());
}

Tensor model_loss(const Tensor& out, const Tensor& target, Reduction reduction) {
  if (out.dim() != 3) return cross_entropy(out, target, reduction);
  const std::int64_t tokens = out.shape()[0] * out.shape()[1];
  return cross_entropy(reshape(out, {tokens, out.shape()[2]}), reshape(target, {tokens}), reduction);
}

double evaluate_lm(nn::Module& model, const std::shared_ptr<samplers::TextDataset>& ds, ProcessGroup& pg) {
  timeline::Span span("validation", "eval", timeline::Arg{"samples", ds->size()});
  NoGradGuard no_grad;
  DistributedSampler sampler(
      ds->size(), samplers::DistributedSamplerOptions().shuffle(false).num_replicas(pg.size()).rank(pg.rank()));
  auto idx = sampler.indices();
  // The sampler pads the shards to one length with repeated windows: only a rank's real
  // windows count; every rank runs the same forwards (DDP may broadcast buffers in each).
  const std::int64_t real = std::max<std::int64_t>(0, std::min<std::int64_t>(
      static_cast<std::int64_t>(idx.size()), (ds->size() - pg.rank() + pg.size() - 1) / pg.size()));
  const std::int64_t padded = static_cast<std::int64_t>(idx.size()), t = ds->context();
  constexpr std::int64_t kChunk = 16;  // windows a forward: the logits are chunk x T x 256 floats
  const Device dev = model.parameters().front().device();
  Tensor stats = zeros({2}, DType::Float32);
  double loss_sum = 0;
  std::int64_t tokens = 0;
  for (std::int64_t b = 0; b < padded; b += kChunk) {
    const std::int64_t n = std::min<std::int64_t>(kChunk, padded - b);
    const std::int64_t counted = std::max<std::int64_t>(0, std::min<std::int64_t>(n, real - b));
    Tensor x = Tensor::empty({n, t}, DType::Int64), y = Tensor::empty({n, t}, DType::Int64);
    ds->gather(idx.data() + b, n, x, y);
    Tensor logits = model.forward(x.to(dev));
    if (counted == 0) continue;
    if (counted < n) {
      logits = narrow(logits, 0, 0, counted);
      y = narrow(y, 0, 0, counted);
    }
    loss_sum += model_loss(logits, y.to(dev), Reduction::Sum).item();
    tokens += counted * t;
  }
  stats.data<float>()[0] = static_cast<float>(loss_sum);
  stats.data<float>()[1] = static_cast<float>(tokens);
  stats = sum_over_ranks(stats, pg, dev);
  return static_cast<double>(stats.data<float>()[0]) / static_cast<double>(stats.data<float>()[1]);
}

std::pair<double, double> evaluate(nn::Module& model, const std::shared_ptr<TensorDataset>& ds, ProcessGroup& pg) {
  timeline::Span span("validation", "eval", timeline::Arg{"samples", ds->size()});
  NoGradGuard no_grad;
  // Without padding duplicates: drop_last=false pads, so count only this rank's real samples.
  DistributedSampler sampler(
      ds->size(), samplers::DistributedSamplerOptions().shuffle(false).num_replicas(pg.size()).rank(pg.rank()));
  auto idx = sampler.indices();
  Tensor stats = zeros({3}, DType::Float32);
  float* s = stats.data<float>();
  const std::int64_t classes = model.parameters().back().numel();
  const std::int64_t real = std::max<std::int64_t>(0, std::min<std::int64_t>(
      static_cast<std::int64_t>(idx.size()), (ds->size() - pg.rank() + pg.size() - 1) / pg.size()));
  // Every rank runs the same number of forwards (the sampler pads the shards to one length):
  // a model with buffers broadcasts them from rank 0 in each DDP forward. Only a rank's real
  // samples are counted. Chunks of 256 keep a CNN's activations small.
  const std::int64_t padded = static_cast<std::int64_t>(idx.size());
  constexpr std::int64_t kChunk = 256;
  const Device dev = model.parameters().front().device();
  for (std::int64_t b = 0; b < padded; b += kChunk) {
    const std::int64_t n = std::min<std::int64_t>(kChunk, padded - b);
    const std::int64_t counted = std::max<std::int64_t>(0, std::min<std::int64_t>(n, real - b));
    Shape xs = ds->feature_shape();
    xs.insert(xs.begin(), n);
    Tensor x = Tensor::empty(xs), y = Tensor::empty({n}, DType::Int64);
    ds->gather(idx.data() + b, n, x, y);
    Tensor logits = model.forward(x.to(dev));
    if (counted == 0) continue;
    // Under --precision bf16 the logits are bf16 (autocast's linear): read as float32, exactly.
    if (logits.dtype() != DType::Float32) logits = to_dtype(logits, DType::Float32);
    if (counted < n) {
      logits = logits.to(Device::cpu());
      logits = Tensor(logits).reshape({n, classes});
      Tensor kept = Tensor::empty({counted, classes}), ky = Tensor::empty({counted}, DType::Int64);
      std::copy_n(logits.data<float>(), counted * classes, kept.data<float>());
      std::copy_n(y.data<std::int64_t>(), counted, ky.data<std::int64_t>());
      logits = kept.to(dev);
      y = ky;
    }
    s[0] += cross_entropy(logits, y.to(dev), Reduction::Sum).item();
    logits = logits.to(Device::cpu());
    const float* l = logits.data<float>();
    const auto* t = y.data<std::int64_t>();
    for (std::int64_t i = 0; i < counted; ++i) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < classes; ++k)
        if (l[i * classes + k] > l[i * classes + best]) best = k;
      s[1] += best == t[i];
    }
    s[2] += static_cast<float>(counted);
  }
  stats = sum_over_ranks(stats, pg, model.parameters().front().device());
  s = stats.data<float>();
  return {s[0] / s[2], s[1] / s[2]};
}

}  // namespace phalanx::trainer
