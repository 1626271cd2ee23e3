// One training step (forward, backward, torch.optim.SGD's update) of an MLP, Phalanx and
// PyTorch in the same run, on the same device: both sides zero the gradients, run forward,
// cross-entropy and backward, and step an SGD optimizer (optim::SGD here, torch.optim.SGD
// there). Bars: on the CPU, single thread, 784-1024-1024-10 at batch 128 within 0.95x of
// PyTorch's time (issue 31; issue 2's was 1.15x) and the textbook's 64-32-10 at batch 64 at
// least 5x faster; on CUDA
// (issue 13), 784-1024-1024-10 within 1.2x of PyTorch CUDA. Each side: warm-up steps, then 5
// runs of ITERS steps; the median run with the fastest and slowest; the ratio of the medians.
// Then each side's breakdown (issue 31): 5 more runs timed phase by phase (zero_grad, forward
// with the loss, backward, optimizer step), the median of each phase's mean per step.
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

/// Mean time per step of each phase (zero_grad, forward with the loss, backward, optimizer
/// step), the median over 5 runs: timed apart from the step figure (the clock is read 5 times
/// a step here).
struct Breakdown {
  double zero = -1, forward = -1, backward = -1, optimizer = -1;
};

bench::Summary phalanx_step_us(const std::vector<std::int64_t>& widths, std::int64_t batch, int iters, Device dev,
                               Breakdown* phases) {
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
  // The breakdown: a device's queue is drained after each phase (a CPU tensor's .to(cpu) is free).
  const auto sync = [&] { params.front().to(Device::cpu()); };
  std::vector<double> zero, fwd, bwd, upd;
  for (int r = 0; r < 5; ++r) {
    double acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < iters; ++i) {
      const double t0 = bench::now_s();
      opt.zero_grad();
      const double t1 = bench::now_s();
      Tensor loss = cross_entropy(model->forward(x), y);
      sync();
      const double t2 = bench::now_s();
      loss.backward();
      sync();
      const double t3 = bench::now_s();
      opt.step();
      sync();
      const double t4 = bench::now_s();
      acc[0] += t1 - t0, acc[1] += t2 - t1, acc[2] += t3 - t2, acc[3] += t4 - t3;
    }
    zero.push_back(acc[0] / iters * 1e6);
    fwd.push_back(acc[1] / iters * 1e6);
    bwd.push_back(acc[2] / iters * 1e6);
    upd.push_back(acc[3] / iters * 1e6);
  }
  *phases = {bench::summarise(zero).median, bench::summarise(fwd).median, bench::summarise(bwd).median,
             bench::summarise(upd).median};
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
  const Case cases[] = {{{784, 1024, 1024, 10}, 128, cuda ? 400 : 40, cuda ? "<= 1.2" : "<= 0.95"},
                        {{64, 32, 10}, 64, cuda ? 1000 : 4000, cuda ? "-" : "<= 0.2"}};
  const double limits[] = {cuda ? 1.2 : 0.95, cuda ? 0.0 : 0.2};
  bench::print_environment("bench_mlp_step");
  std::printf("device: %s; medians of 5 runs per side, [fastest, slowest] run; ratio of the medians\n", dev.str().c_str());
  std::printf("%-22s %6s %12s %12s %10s   %-24s %-24s %s\n", "model", "batch", "phalanx_us", "torch_us", "phx/torch",
              "phalanx [min, max]", "torch [min, max]", "bar (phx/torch)");
  for (std::size_t k = 0; k < 2; ++k) {
    const Case& c = cases[k];
    Breakdown our_phases, their_phases;
    const bench::Summary ours = phalanx_step_us(c.widths, c.batch, c.iters, dev, &our_phases);
    bench::Summary theirs;
    if (!skip_peer) {
      const std::string out = bench::capture("OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " " +
                                             widths_str(c.widths) + " " + std::to_string(c.batch) + " " +
                                             std::to_string(c.iters) + " " + dev.str());
      bench::relay_peer_environment(out);
      theirs = {bench::find_value(out, "step_us"), bench::find_value(out, "min_us"), bench::find_value(out, "max_us"), 5};
      their_phases = {bench::find_value(out, "zero_us"), bench::find_value(out, "forward_us"),
                      bench::find_value(out, "backward_us"), bench::find_value(out, "optimizer_us")};
      if (theirs.median < 0 || theirs.lo < 0 || theirs.hi < 0) {
        std::fprintf(stderr, "peer failed (%s):\n%s\n", peer.c_str(), out.c_str());
        theirs = {};
      }
    }
    const double r = theirs.ok() ? ours.median / theirs.median : 0.0;
    std::printf("%-22s %6lld %12.1f %12.1f %10.2f   %-24s %-24s %s\n", widths_str(c.widths).c_str(),
                static_cast<long long>(c.batch), ours.median, theirs.median, r, bench::show(ours, "").c_str(),
                bench::show(theirs, "").c_str(), c.bar);
    const auto phase = [](const char* name, double a, double b) {
      std::printf("    %-10s phalanx %9.1f us   torch %9.1f us   %5.2fx\n", name, a, b, b > 0 ? a / b : 0.0);
    };
    std::printf("  breakdown (medians of 5 runs of the mean per step, timed phase by phase; forward includes the loss):\n");
    phase("zero_grad", our_phases.zero, their_phases.zero);
    phase("forward", our_phases.forward, their_phases.forward);
    phase("backward", our_phases.backward, their_phases.backward);
    phase("optimizer", our_phases.optimizer, their_phases.optimizer);
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
