#include "evaluation.hpp"

#include <algorithm>

namespace phalanx::trainer {

using samplers::DistributedSampler;
using samplers::TensorDataset;

Tensor sum_over_ranks(const Tensor& host, ProcessGroup& pg, Device device) {
  Tensor on = host.to(device);
  pg.allreduce(on)->wait();
  return on.to(Device::cpu());
}

std::pair<double, double> evaluate(nn::Module& model, const std::shared_ptr<TensorDataset>& ds, ProcessGroup& pg) {
  NoGradGuard no_grad;
  samplers::DistributedSamplerOptions so;
  so.shuffle = false;
  so.num_replicas = pg.size();
  so.rank = pg.rank();
  // Without padding duplicates: drop_last=false pads, so count only this rank's real samples.
  DistributedSampler sampler(ds->size(), so);
  auto idx = sampler.indices();
  Tensor stats = zeros({3}, DType::Float32);
  float* s = stats.data<float>();
  const std::int64_t classes = model.parameters().back().numel();
  const std::int64_t real = std::max<std::int64_t>(0, std::min<std::int64_t>(
      static_cast<std::int64_t>(idx.size()), (ds->size() - pg.rank() + pg.size() - 1) / pg.size()));
  for (std::int64_t b = 0; b < real; b += 1024) {
    const std::int64_t n = std::min<std::int64_t>(1024, real - b);
    Shape xs = ds->feature_shape();
    xs.insert(xs.begin(), n);
    Tensor x = Tensor::empty(xs), y = Tensor::empty({n}, DType::Int64);
    ds->gather(idx.data() + b, n, x, y);
    const Device dev = model.parameters().front().device();
    Tensor logits = model.forward(x.to(dev));
    s[0] += cross_entropy(logits, y.to(dev), Reduction::Sum).item();
    logits = logits.to(Device::cpu());
    const float* l = logits.data<float>();
    const auto* t = y.data<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < classes; ++k)
        if (l[i * classes + k] > l[i * classes + best]) best = k;
      s[1] += best == t[i];
    }
    s[2] += static_cast<float>(n);
  }
  stats = sum_over_ranks(stats, pg, model.parameters().front().device());
  s = stats.data<float>();
  return {s[0] / s[2], s[1] / s[2]};
}

}  // namespace phalanx::trainer
