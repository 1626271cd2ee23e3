// DataLoader throughput on Fashion-MNIST (shuffled DistributedSampler, batch 128) against
// the throughput of the MLP step it feeds (784-256-10 and 784-1024-1024-10), one thread.
// The loader must not be the bottleneck: its time per batch should be far below the step's.
// 5 runs of each, taking turns (an epoch of the loader; 20 steps of the small MLP, 5 of the
// large one); medians with the fastest and slowest run; ratios of the medians.
//   bench_loader_throughput [--runs N]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;
using namespace phalanx::samplers;

namespace {

/// Microseconds per batch of 128 over one shuffled epoch.
double loader_us(DataLoader& loader, std::int64_t epoch) {
  loader.set_epoch(epoch);
  std::int64_t batches = 0;
  const double t = bench::now_s();
  for (Batch& b : loader) batches += b.y.numel() > 0;
  return (bench::now_s() - t) / batches * 1e6;
}

/// A model fed by its own loader; step_us() times `steps` steps (loader included).
struct Fed {
  nn::ModulePtr model;
  optim::SGD opt;
  DataLoader loader;
  Batch b;
  Fed(const std::vector<std::int64_t>& widths, const DatasetPtr& ds)
      : model((manual_seed(0), nn::mlp(widths))), opt(model->parameters(), optim::SGDOptions(0.01).momentum(0.9)),
        loader(ds, {128}) {
    loader.start_epoch();
    step_us(2);  // warm-up
  }
  double step_us(int steps) {
    const double t = bench::now_s();
    for (int i = 0; i < steps; ++i) {
      if (!loader.next(b)) {
        loader.start_epoch();
        loader.next(b);
      }
      opt.zero_grad();
      cross_entropy(model->forward(b.x), b.y).backward();
      opt.step();
    }
    return (bench::now_s() - t) / steps * 1e6;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::max(5, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "bench_loader_throughput: unknown argument %s (usage: bench_loader_throughput [--runs N>=5])\n",
                   a.c_str());
      return 2;
    }
  }
  set_num_threads(1);
  bench::print_environment("bench_loader_throughput");
  const double t0 = bench::now_s();
  auto ds = load_mnist(kFashionMnistDir);
  std::printf("load Fashion-MNIST train (60000 x 784, gzip IDX): %.2f s\n", bench::now_s() - t0);
  auto sampler = std::make_shared<DistributedSampler>(ds->size());
  DataLoaderOptions o0{128}, o2{128};
  o2.prefetch(2);
  DataLoader l0(ds, o0, sampler), l2(ds, o2, sampler);
  Fed small({784, 256, 10}, ds), big({784, 1024, 1024, 10}, ds);
  std::vector<double> v0, v2, vs, vb;
  for (int r = 0; r < runs; ++r) {
    v0.push_back(loader_us(l0, r));
    v2.push_back(loader_us(l2, r));
    vs.push_back(small.step_us(20));
    vb.push_back(big.step_us(5));
  }
  const bench::Summary s0 = bench::summarise(v0), s2 = bench::summarise(v2), ss = bench::summarise(vs),
                       sb = bench::summarise(vb);
  std::printf("%d runs each, taking turns; us per batch of 128: median [fastest, slowest]; samples/s from the median\n", runs);
  const auto line = [](const char* name, const bench::Summary& s) {
    std::printf("%-40s %-30s %12.0f samples/s\n", name, bench::show(s, "us").c_str(), s.ok() ? 128 / (s.median * 1e-6) : 0.0);
  };
  line("DataLoader, batch 128, no prefetch", s0);
  line("DataLoader, batch 128, prefetch 2", s2);
  line("MLP 784-256-10 step (SGD momentum)", ss);
  line("MLP 784-1024-1024-10 step", sb);
  std::printf("loader (no prefetch) %.0fx faster than the small step, %.0fx than the large one (medians)\n",
              ss.median / s0.median, sb.median / s0.median);
  bench::result_row("bench_loader_throughput", "DataLoader batch of 128 (no prefetch) vs the MLP 784-256-10 step it feeds",
                    s0, "the step", ss, "us", 1, "loader far below the step");
  bench::result_row("bench_loader_throughput", "DataLoader batch of 128 (prefetch 2) vs the MLP 784-256-10 step", s2,
                    "the step", ss, "us", 1, "-");
  bench::print_load_at_end();
  return 0;
}
