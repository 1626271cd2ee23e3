// Forward + backward of the example CNN's convolutions and pools, Phalanx and PyTorch 1.13 in
// the same run, one thread (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)), batch 64.
// The bar: the CNN's step <= 1.3x PyTorch's. Each side: 3 warm-up steps, then RUNS
// runs of ITERS steps, the two sides taking turns run by run (the peer is started once per
// run); the median run (and the fastest and slowest) per step; the ratio is of the medians.
//
//   bench_conv_step [--runs N] [--batch B] [--case cnn|conv2] [--no-peer]
//
// Cases: cnn = Conv(1,32,3,p1)-ReLU-MaxPool2-Conv(32,64,3,p1)-ReLU-MaxPool2-Flatten-
// Linear(3136,10) + cross-entropy on [B,1,28,28]; conv2 = Conv(32,64,3,p1) alone on
// [B,32,14,14] (loss: the sum). BatchNorm is left out: this measures the convolution and
// pooling kernels. The peer is peers/torch_conv_step.py.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

struct Timing {
  double median = -1, lo = -1, hi = -1;
};

Timing summarise(std::vector<double> samples) {
  if (samples.empty() || samples.front() < 0) return {};
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), samples.back()};
}

// The Phalanx side of one case, built once; run() times `iters` steps.
struct Ours {
  std::string which;
  std::shared_ptr<nn::Module> model;
  Tensor x, y;
  Ours(const std::string& w, std::int64_t batch) : which(w) {
    manual_seed(0);
    if (which == "cnn") {
      model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
          std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
          std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
          std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(3136, 10)});
      x = randn({batch, 1, 28, 28});
    } else {
      model = std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1);
      x = randn({batch, 32, 14, 14});
    }
    y = randint(10, {batch});
    for (int i = 0; i < 3; ++i) step();
  }
  void step() {
    model->zero_grad();
    Tensor out = model->forward(x);
    (which == "cnn" ? cross_entropy(out, y) : sum(out)).backward();
  }
  double run_us(int iters) {
    const double t = bench::now_s();
    for (int i = 0; i < iters; ++i) step();
    return (bench::now_s() - t) / iters * 1e6;
  }
};

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  bool skip_peer = false;
  int runs = 7;
  std::int64_t batch = 64;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--runs" && i + 1 < argc) runs = std::max(5, std::atoi(argv[++i]));
    else if (a == "--batch" && i + 1 < argc) batch = std::max(1, std::atoi(argv[++i]));
    else if (a == "--case" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "bench_conv_step: unknown argument %s (usage: bench_conv_step [--runs N>=5] [--batch B] [--case cnn|conv2] [--no-peer])\n",
                   a.c_str());
      return 2;
    }
  }
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_conv_step.py");
  bench::print_environment("bench_conv_step");
  std::printf("medians of %d runs per side, [fastest, slowest] run in brackets\n", runs);
  std::printf("%-6s %6s %26s %26s %10s   %s\n", "case", "batch", "phalanx_us", "torch_us", "phx/torch", "bar");
  struct Case {
    const char* name;
    int iters;
    const char* bar;
  };
  for (const Case& c : {Case{"cnn", 5, "phalanx/torch <= 1.3"}, Case{"conv2", 5, "-"}}) {
    if (!only.empty() && only != c.name) continue;
    // The sides take turns, one run each, so load from other processes falls on both alike.
    Ours ours_side(c.name, batch);
    std::vector<double> ours_runs, peer_runs;
    const std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + bench::python() + " " + peer + " " +
                            c.name + " " + std::to_string(batch) + " " + std::to_string(c.iters) + " 1";
    for (int r = 0; r < runs; ++r) {
      ours_runs.push_back(ours_side.run_us(c.iters));
      if (skip_peer) continue;
      const std::string out = bench::capture(cmd);
      bench::relay_peer_environment(out);
      peer_runs.push_back(bench::find_value(out, "step_us"));
      if (peer_runs.back() < 0) {
        std::fprintf(stderr, "peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
        skip_peer = true;
      }
    }
    const Timing ours = summarise(ours_runs), theirs = summarise(peer_runs);
    char ob[64], tb[64];
    std::snprintf(ob, sizeof ob, "%.0f [%.0f, %.0f]", ours.median, ours.lo, ours.hi);
    std::snprintf(tb, sizeof tb, "%.0f [%.0f, %.0f]", theirs.median, theirs.lo, theirs.hi);
    std::printf("%-6s %6lld %26s %26s %10.2f   %s\n", c.name, static_cast<long long>(batch), ob, tb,
                theirs.median > 0 ? ours.median / theirs.median : 0.0, c.bar);
    const bench::Summary o = bench::summarise(ours_runs), t = bench::summarise(peer_runs);
    std::string bar = std::string(c.name) == "cnn" ? "<= 1.3" : "-";
    if (bar != "-" && o.ok() && t.ok()) bar += o.median / t.median <= 1.3 ? ": met" : ": NOT met";
    bench::result_row("bench_conv_step",
                      std::string(c.name) == "cnn" ? "CNN conv/pool step, batch " + std::to_string(batch) + ", 1 thread"
                                                   : "Conv(32,64,3) alone, batch " + std::to_string(batch) + ", 1 thread",
                      o, "PyTorch", t, "ms", 1e3, bar);
  }
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_conv_step", argc, argv, run, /*one_blas_thread=*/true);
}
