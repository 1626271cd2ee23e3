// One training step (forward, backward, torch.optim.SGD's update) of an MLP, Phalanx and
// PyTorch in the same run, on the same device: both sides zero the gradients, run forward,
// cross-entropy and backward, and step an SGD optimizer (optim::SGD here, torch.optim.SGD
// there). Bars: on the CPU, single thread (issue 2), 784-1024-1024-10 at batch 128 within
// 1.15x of PyTorch and the textbook's 64-32-10 at batch 64 at least 5x faster; on CUDA
// (issue 13), 784-1024-1024-10 within 1.2x of PyTorch CUDA. Each side: warm-up steps, then 5
// runs of ITERS steps; the median run with the fastest and slowest; the ratio of the medians.
//
//   bench_mlp_step [--device cpu|cuda|cuda:N] [--no-peer]
//
// The peer is peers/torch_mlp_step.py beside this program or one folder up ($PHALANX_PEERS_DIR
// overrides), run by $PHALANX_PYTHON or the python3 that imports torch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

bench::Summary phalanx_step_us(const std::vector<std::int64_t>& widths, std::int64_t batch, int iters, Device dev) {
  manual_seed(0);
  auto model = nn::mlp(widths);
  model->to(dev);
  auto params = model->parameters();
  Tensor x = randn({batch, widths.front()}).to(dev);
  Tensor y = randint(widths.back(), {batch}).to(dev);
  optim::SGD opt(params, optim::SGDOptions{0.01});
  auto step = [&] {
    opt.zero_grad();
    cross_entropy(model->forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < std::max(5, iters / 10); ++i) step();
  std::vector<double> samples;
  for (int r = 0; r < 5; ++r) {
    const double t = bench::now_s();
    for (int i = 0; i < iters; ++i) step();
    params.front().to(Device::cpu());  // waits for the device's queue
    samples.push_back((bench::now_s() - t) / iters * 1e6);
  }
  return bench::summarise(samples);
}

std::string widths_str(const std::vector<std::int64_t>& w) {
  std::string s;
  for (auto v : w) s += (s.empty() ? "" : "-") + std::to_string(v);
  return s;
}

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  bool skip_peer = false;
  Device dev = Device::cpu();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--device" && i + 1 < argc) dev = Device::parse(argv[++i]);
    else {
      std::fprintf(stderr, "bench_mlp_step: unknown argument %s (usage: bench_mlp_step [--device cpu|cuda|cuda:N] [--no-peer])\n",
                   a.c_str());
      return 2;
    }
  }
  const bool cuda = !dev.is_cpu();
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_mlp_step.py");  // looked up (and warned about) first
  struct Case {
    std::vector<std::int64_t> widths;
    std::int64_t batch;
    int iters;
    const char* bar;
  };
  const Case cases[] = {{{784, 1024, 1024, 10}, 128, cuda ? 400 : 40, cuda ? "<= 1.2" : "<= 1.15"},
                        {{64, 32, 10}, 64, cuda ? 1000 : 4000, cuda ? "-" : "<= 0.2"}};
  const double limits[] = {cuda ? 1.2 : 1.15, cuda ? 0.0 : 0.2};
  bench::print_environment("bench_mlp_step");
  std::printf("device: %s; medians of 5 runs per side, [fastest, slowest] run; ratio of the medians\n", dev.str().c_str());
  std::printf("%-22s %6s %12s %12s %10s   %-24s %-24s %s\n", "model", "batch", "phalanx_us", "torch_us", "phx/torch",
              "phalanx [min, max]", "torch [min, max]", "bar (phx/torch)");
  for (std::size_t k = 0; k < 2; ++k) {
    const Case& c = cases[k];
    const bench::Summary ours = phalanx_step_us(c.widths, c.batch, c.iters, dev);
    bench::Summary theirs;
    if (!skip_peer)
      theirs = bench::run_peer_summary("OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " " + widths_str(c.widths) +
                                           " " + std::to_string(c.batch) + " " + std::to_string(c.iters) + " " + dev.str(),
                                       5);
    const double r = theirs.ok() ? ours.median / theirs.median : 0.0;
    std::printf("%-22s %6lld %12.1f %12.1f %10.2f   %-24s %-24s %s\n", widths_str(c.widths).c_str(),
                static_cast<long long>(c.batch), ours.median, theirs.median, r, bench::show(ours, "").c_str(),
                bench::show(theirs, "").c_str(), c.bar);
    std::string bar = c.bar;
    if (limits[k] > 0 && r > 0) bar += r <= limits[k] ? ": met" : ": NOT met";
    bench::result_row("bench_mlp_step", "MLP " + widths_str(c.widths) + " step, batch " + std::to_string(c.batch) +
                          (cuda ? " (" + dev.str() + ")" : ", 1 thread"),
                      ours, "PyTorch", theirs, "us", 1, bar);
  }
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a clear one-line error (no CUDA plugin, no peer script, ...)
    std::fprintf(stderr, "bench_mlp_step: %s\n", e.what());
    return 1;
  }
}
