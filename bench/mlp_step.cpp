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
//   bench_mlp_step [--device cpu|cuda|cuda:N] [--precision fp32|bf16|both] [--no-peer]
//
// --precision (CPU): fp32 (the default) as before; both adds a bf16 row for 784-1024-1024-10
// beside its float32 one: the forward and the loss under autocast(bf16) on both sides (torch.autocast("cpu",
// dtype=torch.bfloat16) in the peer), the four runs taking turns, and issue 30's bars: bf16 >=
// 1.6x our float32 step and >= 1.3x PyTorch's bf16 step. bf16: that case only (fp32 and bf16).
//
// The peer is peers/torch_mlp_step.py beside this program or one folder up ($PHALANX_PEERS_DIR
// overrides), run by $PHALANX_PYTHON or the python3 that imports torch.
#include <algorithm>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <phalanx/core/autocast.hpp>
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
  Ours(const std::vector<std::int64_t>& widths, std::int64_t batch, int iters, Device dev, bool bf16 = false)
      : model_((manual_seed(0), nn::mlp(widths))), bf16_(bf16) {
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
      Tensor loss = forward_loss();
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
    forward_loss().backward();
    opt_->step();
  }
  /// The forward and the loss, under autocast(bf16) for the bf16 side (backward and step outside
  /// it, as torch.autocast's recipe).
  Tensor forward_loss() {
    if (!bf16_) return cross_entropy(model_->forward(x_), y_);
    autocast guard(DType::BFloat16);
    return cross_entropy(model_->forward(x_), y_);
  }
  void sync() { params_.front().to(Device::cpu()); }  // waits for the device's queue (free on the CPU)
  nn::ModulePtr model_;
  bool bf16_;
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
  std::string precision = "fp32";  // the bf16 rows only when asked: PyTorch's bf16 step can take ~1 s (scripts/bench.sh's time limit)
  const char* usage = "usage: bench_mlp_step [--device cpu|cuda|cuda:N] [--precision fp32|bf16|both] [--no-peer]";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--device" && i + 1 < argc) dev = Device::parse(argv[++i]);
    else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
    else {
      std::fprintf(stderr, "bench_mlp_step: unknown argument %s (%s)\n", a.c_str(), usage);
      return 2;
    }
  }
  if (precision != "fp32" && precision != "bf16" && precision != "both") {
    std::fprintf(stderr, "bench_mlp_step: --precision must be fp32, bf16 or both, got %s (%s)\n", precision.c_str(), usage);
    return 2;
  }
  const bool cuda = !dev.is_cpu();
  if (cuda && precision != "fp32") {
    if (precision == "bf16") {
      std::fprintf(stderr, "bench_mlp_step: bf16 products run on the CPU only (docs/mixed_precision.md); use --device cpu\n");
      return 2;
    }
    precision = "fp32";  // "both" on CUDA: the float32 rows only (no bf16 products there yet)
  }
  const bool with_bf16 = precision != "fp32";
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
  if (with_bf16) std::printf("# phalanx: bf16 GEMM %s\n", bf16_gemm_info().c_str());
  std::printf("device: %s; medians of 5 runs per side, [fastest, slowest] run; ratio of the medians; the sides "
              "(and precisions) take turns run by run\n",
              dev.str().c_str());
  std::printf("%-22s %-5s %6s %12s %12s %10s   %-24s %-24s %s\n", "model", "prec", "batch", "phalanx_us", "torch_us",
              "phx/torch", "phalanx [min, max]", "torch [min, max]", "bar (phx/torch)");
  for (std::size_t k = 0; k < 2; ++k) {
    const Case& c = cases[k];
    // The precisions of this case: float32, and bf16 autocast for the large MLP (issue 30's bar).
    std::vector<bool> precs;
    if (precision != "bf16" || k == 0) precs.push_back(false);
    if (with_bf16 && k == 0) precs.push_back(true);
    if (precs.empty()) continue;
    // The sides take turns, one run each (the peer started once per run, as bench_conv_step
    // does), so load from other processes falls on both alike.
    std::vector<std::unique_ptr<Ours>> sides;
    for (bool bf : precs) sides.push_back(std::make_unique<Ours>(c.widths, c.batch, c.iters, dev, bf));
    const std::size_t ns = precs.size();
    std::vector<std::vector<double>> our_runs(ns), peer_runs(ns);
    std::vector<std::vector<Breakdown>> our_parts(ns), peer_parts(ns);
    std::vector<bool> peer_ok(ns, !skip_peer);
    // The peer's steps per run: c.iters, fewer where its step is slow (PyTorch 1.13's bf16
    // product without AVX512 is a plain loop, about 1 s a step): runs of about 2 s then.
    std::vector<int> peer_iters(ns, c.iters);
    for (int run = 0; run < 5; ++run) {
      for (std::size_t s = 0; s < ns; ++s) {
        our_runs[s].push_back(sides[s]->run_us(c.iters));
        our_parts[s].push_back(sides[s]->breakdown(c.iters));
        if (!peer_ok[s]) continue;
        const std::string cmd = "OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " " + widths_str(c.widths) + " " +
                                std::to_string(c.batch) + " " + std::to_string(peer_iters[s]) + " " + dev.str() + " 1 " +
                                (precs[s] ? "bf16" : "fp32");
        const std::string out = bench::capture(cmd);
        if (run == 0 && s == 0) bench::relay_peer_environment(out);
        peer_runs[s].push_back(bench::find_value(out, "step_us"));
        peer_parts[s].push_back({bench::find_value(out, "zero_us"), bench::find_value(out, "forward_us"),
                                 bench::find_value(out, "backward_us"), bench::find_value(out, "optimizer_us")});
        if (peer_runs[s].back() > 0)
          peer_iters[s] = std::max(2, std::min(c.iters, static_cast<int>(2e6 / peer_runs[s].back())));
        if (peer_runs[s].back() < 0) {
          std::fprintf(stderr, "peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
          peer_ok[s] = false;
          peer_runs[s].clear();
          peer_parts[s].clear();
        }
      }
    }
    std::vector<bench::Summary> ours(ns), theirs(ns);
    for (std::size_t s = 0; s < ns; ++s) {
      ours[s] = bench::summarise(our_runs[s]);
      theirs[s] = bench::summarise(peer_runs[s]);
      const Breakdown our_phases = median_phases(our_parts[s]), their_phases = median_phases(peer_parts[s]);
      const double r = theirs[s].ok() ? ours[s].median / theirs[s].median : 0.0;
      const char* prec = precs[s] ? "bf16" : "fp32";
      const char* bar_text = precs[s] ? "(see the bf16 bars)" : c.bar;
      std::printf("%-22s %-5s %6lld %12.1f %12.1f %10.2f   %-24s %-24s %s\n", widths_str(c.widths).c_str(), prec,
                  static_cast<long long>(c.batch), ours[s].median, theirs[s].median, r, bench::show(ours[s], "").c_str(),
                  bench::show(theirs[s], "").c_str(), bar_text);
      const auto phase = [](const char* name, double a, double b) {
        std::printf("    %-10s phalanx %9.1f us   torch %9.1f us   %5.2fx\n", name, a, b, b > 0 ? a / b : 0.0);
      };
      std::printf("  breakdown, %s (medians of 5 runs of the mean per step, timed phase by phase after each side's "
                  "step run; forward includes the loss):\n",
                  prec);
      phase("zero_grad", our_phases.zero, their_phases.zero);
      phase("forward", our_phases.forward, their_phases.forward);
      phase("backward", our_phases.backward, their_phases.backward);
      phase("optimizer", our_phases.optimizer, their_phases.optimizer);
      std::string bar = precs[s] ? "bf16 autocast (no fp32 bar)" : c.bar;
      if (!precs[s] && limits[k] > 0 && r > 0) bar += r <= limits[k] ? ": met" : ": NOT met";
      bench::result_row("bench_mlp_step", "MLP " + widths_str(c.widths) + " step, batch " + std::to_string(c.batch) +
                            (precs[s] ? ", bf16 autocast" : "") + (cuda ? " (" + dev.str() + ")" : ", 1 thread"),
                        ours[s], "PyTorch", theirs[s], "us", 1, bar);
    }
    if (ns == 2) {  // issue 30's bars: bf16 >= 1.6x our float32 step, >= 1.3x PyTorch's bf16 autocast step
      const double vs_fp32 = ours[0].median / ours[1].median;
      const double vs_torch = theirs[1].ok() ? theirs[1].median / ours[1].median : 0.0;
      const double torch_gain = theirs[0].ok() && theirs[1].ok() ? theirs[0].median / theirs[1].median : 0.0;
      std::printf("bf16 bars (ratios of the medians, the bf16 step's time in the denominator: > 1 means that "
                  "bf16 step is faster):\n");
      std::printf("    phalanx fp32 / phalanx bf16   %5.2fx   bar >= 1.6: %s   (runs: fp32 %s, bf16 %s)\n", vs_fp32,
                  vs_fp32 >= 1.6 ? "met" : "NOT met", bench::show(ours[0], "us").c_str(), bench::show(ours[1], "us").c_str());
      if (vs_torch > 0)
        std::printf("    torch bf16 / phalanx bf16     %5.2fx   bar >= 1.3: %s\n", vs_torch, vs_torch >= 1.3 ? "met" : "NOT met");
      else
        std::printf("    torch bf16 / phalanx bf16       n/a   (no peer)\n");
      if (torch_gain > 0) std::printf("    (torch fp32 / torch bf16      %5.2fx: PyTorch's own autocast gain)\n", torch_gain);
    }
  }
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_mlp_step", argc, argv, run);
}
