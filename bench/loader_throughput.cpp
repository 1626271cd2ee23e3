// DataLoader throughput on Fashion-MNIST (shuffled DistributedSampler, batch 128) against
// the throughput of the MLP step it feeds (784-256-10 and 784-1024-1024-10), one thread.
// The loader must not be the bottleneck: its samples/s should be far above the step's.
#include <cstdio>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {
double loader_samples_per_s(const DatasetPtr& ds, int prefetch) {
  auto sampler = std::make_shared<DistributedSampler>(ds->size());
  DataLoaderOptions o{128};
  o.prefetch = prefetch;
  DataLoader loader(ds, o, sampler);
  std::int64_t samples = 0;
  const double t = bench::now_s();
  for (int epoch = 0; epoch < 3; ++epoch) {
    loader.set_epoch(epoch);
    for (Batch& b : loader) samples += b.y.numel();
  }
  return samples / (bench::now_s() - t);
}

double step_samples_per_s(const std::vector<std::int64_t>& widths, const DatasetPtr& ds) {
  manual_seed(0);
  auto model = nn::mlp(widths);
  optim::SGD opt(model->parameters(), optim::SGDOptions{0.01, 0.9});
  DataLoader loader(ds, {128});
  std::int64_t samples = 0;
  int steps = 0;
  const double t = bench::now_s();
  for (Batch& b : loader) {
    opt.zero_grad();
    cross_entropy(model->forward(b.x), b.y).backward();
    opt.step();
    samples += b.y.numel();
    if (++steps == 100) break;
  }
  return samples / (bench::now_s() - t);
}
}  // namespace

int main() {
  set_num_threads(1);
  const double t0 = bench::now_s();
  auto ds = load_mnist(kFashionMnistDir);
  std::printf("load Fashion-MNIST train (60000 x 784, gzip IDX): %.2f s\n", bench::now_s() - t0);
  const double l0 = loader_samples_per_s(ds, 0), l2 = loader_samples_per_s(ds, 2);
  const double s_small = step_samples_per_s({784, 256, 10}, ds);
  const double s_big = step_samples_per_s({784, 1024, 1024, 10}, ds);
  std::printf("%-40s %14s\n", "", "samples/s");
  std::printf("%-40s %14.0f\n", "DataLoader, batch 128, no prefetch", l0);
  std::printf("%-40s %14.0f\n", "DataLoader, batch 128, prefetch 2", l2);
  std::printf("%-40s %14.0f   (loader %.0fx faster)\n", "MLP 784-256-10 step (SGD momentum)", s_small,
              l0 / s_small);
  std::printf("%-40s %14.0f   (loader %.0fx faster)\n", "MLP 784-1024-1024-10 step", s_big, l0 / s_big);
  return 0;
}
