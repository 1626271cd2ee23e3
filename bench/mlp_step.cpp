// One training step (forward, backward, torch.optim.SGD's update) of an MLP, Phalanx and
// PyTorch in the same run, on the same device: both sides zero the gradients, run forward,
// cross-entropy and backward, and step an SGD optimizer (optim::SGD here, torch.optim.SGD
// there). Bars: on the CPU, single thread, 784-1024-1024-10 at batch 128 within 0.95x of
// PyTorch's time (an earlier bar was 1.15x) and the textbook's 64-32-10 at batch 64 at
// least 5x faster; on CUDA, 784-1024-1024-10 within 1.2x of PyTorch CUDA. Each side: warm-up steps, then 5
// runs of ITERS steps, the sides taking turns run by run (the peer started once per run); the
// median run with the fastest and slowest; the ratio of the medians. After each step run, a
// run timed phase by phase (zero_grad, forward with the loss, backward, optimizer
// step); the breakdown is the median of each phase's mean per step.
//
//   bench_mlp_step [--device cpu|cuda|cuda:N] [--no-peer]
//
// The peer is peers/torch_mlp_step.py beside this program or one folder up ($PHALANX_PEERS_DIR
// overrides), run by $PHALANX_PYTHON or the python3 that imports torch.
#include <algorithm>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

/// Mean time per step of each phase (zero_grad, forward with the loss, backward, optimizer
/// step), timed apart from the step figure (the clock is read 5 times a step there).
struct Breakdown {
  double zero = -1, forward = -1, backward = -1, optimizer = -1;
};

/// Phalanx's side of one case: the model, its data and optimizer, warmed up; each call of
/// run() times one run of `iters` steps, breakdown() one run phase by phase.
class Ours {
 public:
  Ours(const std::vector<std::int64_t>& widths, std::int64_t batch, int iters, Device dev)
      : model_((manual_seed(0), nn::mlp(widths))) {
    model_->to(dev);
    params_ = model_->parameters();
    x_ = randn({batch, widths.front()}).to(dev);
    y_ = randint(widths.back(), {batch}).to(dev);
    opt_ = std::make_unique<optim::SGD>(params_, optim::SGDOptions{0.01});
    for (int i = 0; i < std::max(5, iters / 10); ++i) step();
  }
  double run_us(int iters) {
    const double t = bench::now_s();
    for (int i = 0; i < iters; ++i) step();
    sync();
    return (bench::now_s() - t) / iters * 1e6;
  }
  Breakdown breakdown(int iters) {
    double acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < iters; ++i) {
      const double t0 = bench::now_s();
      opt_->zero_grad();
      const double t1 = bench::now_s();
      Tensor loss = cross_entropy(model_->forward(x_), y_);
      sync();
      const double t2 = bench::now_s();
      loss.backward();
      sync();
      const double t3 = bench::now_s();
      opt_->step();
      sync();
      const double t4 = bench::now_s();
      acc[0] += t1 - t0, acc[1] += t2 - t1, acc[2] += t3 - t2, acc[3] += t4 - t3;
    }
    return {acc[0] / iters * 1e6, acc[1] / iters * 1e6, acc[2] / iters * 1e6, acc[3] / iters * 1e6};
  }

 private:
  void step() {
    opt_->zero_grad();
    cross_entropy(model_->forward(x_), y_).backward();
    opt_->step();
  }
  void sync() { params_.front().to(Device::cpu()); }  // waits for the device's queue (free on the CPU)
  nn::ModulePtr model_;
  std::vector<Tensor> params_;
  Tensor x_, y_;
  std::unique_ptr<optim::SGD> opt_;
};

/// The medians of each phase over the runs.
Breakdown median_phases(const std::vector<Breakdown>& runs) {
  std::vector<double> z, f, b, o;
  for (const Breakdown& r : runs) z.push_back(r.zero), f.push_back(r.forward), b.push_back(r.backward), o.push_back(r.optimizer);
  return {bench::summarise(z).median, bench::summarise(f).median, bench::summarise(b).median, bench::summarise(o).median};
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
    // The sides take turns, one run each (the peer started once per run, as bench_conv_step
    // does), so load from other processes falls on both alike.
    Ours side(c.widths, c.batch, c.iters, dev);
    std::vector<double> our_runs, peer_runs;
    std::vector<Breakdown> our_parts, peer_parts;
    const std::string cmd = "OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " " + widths_str(c.widths) + " " +
                            std::to_string(c.batch) + " " + std::to_string(c.iters) + " " + dev.str() + " 1";
    bool peer_ok = !skip_peer;
    for (int run = 0; run < 5; ++run) {
      our_runs.push_back(side.run_us(c.iters));
      our_parts.push_back(side.breakdown(c.iters));
      if (!peer_ok) continue;
      const std::string out = bench::capture(cmd);
      bench::relay_peer_environment(out);
      peer_runs.push_back(bench::find_value(out, "step_us"));
      peer_parts.push_back({bench::find_value(out, "zero_us"), bench::find_value(out, "forward_us"),
                            bench::find_value(out, "backward_us"), bench::find_value(out, "optimizer_us")});
      if (peer_runs.back() < 0) {
        std::fprintf(stderr, "peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
        peer_ok = false;
        peer_runs.clear();
        peer_parts.clear();
      }
    }
    const bench::Summary ours = bench::summarise(our_runs), theirs = bench::summarise(peer_runs);
    const Breakdown our_phases = median_phases(our_parts), their_phases = median_phases(peer_parts);
    const double r = theirs.ok() ? ours.median / theirs.median : 0.0;
    std::printf("%-22s %6lld %12.1f %12.1f %10.2f   %-24s %-24s %s\n", widths_str(c.widths).c_str(),
                static_cast<long long>(c.batch), ours.median, theirs.median, r, bench::show(ours, "").c_str(),
                bench::show(theirs, "").c_str(), c.bar);
    const auto phase = [](const char* name, double a, double b) {
      std::printf("    %-10s phalanx %9.1f us   torch %9.1f us   %5.2fx\n", name, a, b, b > 0 ? a / b : 0.0);
    };
    std::printf("  breakdown (medians of 5 runs of the mean per step, timed phase by phase after each side's step run; "
                "forward includes the loss):\n");
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
  return phalanx::bench::guarded_main("bench_mlp_step", argc, argv, run);
}
