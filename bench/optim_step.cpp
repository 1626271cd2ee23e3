// The optimizer step alone: optim::SGD / Adam / AdamW's step and zero_grad over the
// parameters of the MLP 784-1024-1024-10 (1.86 M parameters in 6 tensors), Phalanx and
// PyTorch 1.13's torch.optim (its 1.13 default, the single-tensor for-loop code) in the same
// run, one thread each, gradients set once. The limit beside them: the bytes each update
// moves (every array read once, the updated ones written once) at this machine's measured
// memcpy rate (bytes read + written per second, arrays of one parameter set's size).
// Bars: SGD, SGD with momentum and AdamW each <= 1.2x PyTorch's time.
// Each side: 5 runs of ITERS steps per case (each after warm-up steps), the sides taking turns
// round by round (the peer started once per round); the median run with the fastest and
// slowest; the ratio of the medians.
//
//   bench_optim_step [--iters N] [--no-peer]
//
// PHALANX_OPTIM_SIMD=scalar|avx2 caps the kernels' instruction set (docs/optim.md) to see
// what the vector code buys.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

const std::vector<std::int64_t> kWidths = {784, 1024, 1024, 10};

struct Case {
  const char* name;       // also the peer's case name
  const char* what;       // for the row
  int arrays;             // float arrays of the parameters' size each update reads + writes
  const char* bar;        // "<= 1.2" or "-"
};

const Case kCases[] = {
    {"sgd", "SGD lr 0.01", 3, "<= 1.2"},                             // read p, g; write p
    {"sgd_momentum", "SGD momentum 0.9", 5, "<= 1.2"},                // read p, g, buf; write p, buf
    {"sgd_nesterov_wd", "SGD momentum 0.9, Nesterov, weight decay 1e-4", 5, "-"},
    {"adam", "Adam lr 1e-3", 7, "-"},                                 // read p, g, m, v; write p, m, v
    {"adamw", "AdamW lr 1e-3, weight decay 1e-2", 7, "<= 1.2"},
    {"adamw_amsgrad", "AdamW amsgrad", 9, "-"},                        // + read/write max_exp_avg_sq
    {"zero_grad", "zero_grad(set_to_none=false) (PyTorch 1.13's default zero_grad())", 1, "<= 1.0"},
};

std::unique_ptr<optim::Optimizer> make(const std::string& c, const std::vector<Tensor>& ps) {
  if (c == "sgd" || c == "zero_grad") return std::make_unique<optim::SGD>(ps, optim::SGDOptions{0.01});
  if (c == "sgd_momentum") return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.01).momentum(0.9));
  if (c == "sgd_nesterov_wd") {
    return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4).nesterov(true));
  }
  if (c == "adam") return std::make_unique<optim::Adam>(ps, optim::AdamOptions(1e-3));
  if (c == "adamw") return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(1e-3).weight_decay(1e-2));
  return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(1e-3).weight_decay(1e-2).amsgrad(true));
}

/// memcpy of `bytes` between two buffers: bytes read + written per second (median of 5 runs).
bench::Summary memcpy_rate_gbs(std::size_t bytes, int iters) {
  const bench::Summary us = bench::memcpy_us(bytes, iters);
  const auto rate = [&](double t_us) { return bench::copy_gbs(bytes, t_us); };
  return {rate(us.median), rate(us.hi), rate(us.lo), us.n};  // slowest run = lowest rate
}

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  bool skip_peer = false;
  int iters = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_optim_step: unknown argument %s (usage: bench_optim_step [--iters N] [--no-peer])\n",
                   a.c_str());
      return 2;
    }
  }
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_optim_step.py");
  bench::print_environment("bench_optim_step");
  const char* simd = std::getenv("PHALANX_OPTIM_SIMD");
  std::printf("# kernels: PHALANX_OPTIM_SIMD=%s\n", simd ? simd : "unset (the best this CPU has)");

  manual_seed(0);
  auto model = nn::mlp(kWidths);
  auto params = model->parameters();
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  std::vector<Tensor> grads;
  for (const auto& p : params) grads.push_back(randn(p.shape()) * 1e-3f);
  const double array_bytes = 4.0 * numel;

  const bench::Summary copy = memcpy_rate_gbs(static_cast<std::size_t>(array_bytes), iters);
  std::printf("# limit: memcpy of %.2f MB (one parameter set) moves %s (read + written), median of 5 runs "
              "[slowest, fastest]\n", array_bytes / 1e6, bench::show(copy, "GB/s").c_str());

  // The sides take turns: a round is one run of every case on our side, then one start of the
  // peer running every case once (one torch import), so load from other processes falls on
  // both alike. Each optimizer keeps its state across rounds; each run warms up first.
  const std::size_t n_cases = sizeof kCases / sizeof kCases[0];
  std::vector<std::unique_ptr<optim::Optimizer>> opts;
  for (const Case& c : kCases) opts.push_back(make(c.name, params));
  std::vector<std::vector<double>> ours_runs(n_cases), peer_runs(n_cases);
  std::string cmd = "OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " 784-1024-1024-10 " + std::to_string(iters) + " 1";
  for (const Case& c : kCases) cmd += std::string(" ") + c.name;
  bool peer_ok = !skip_peer;
  for (int round = 0; round < 5; ++round) {
    for (std::size_t k = 0; k < n_cases; ++k) {
      for (std::size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i].clone());
      optim::Optimizer& opt = *opts[k];
      const auto fn = std::string(kCases[k].name) == "zero_grad" ? std::function<void()>([&] { opt.zero_grad(false); })
                                                                  : std::function<void()>([&] { opt.step(); });
      for (int i = 0; i < std::max(5, iters / 10); ++i) fn();
      const double t = bench::now_s();
      for (int i = 0; i < iters; ++i) fn();
      ours_runs[k].push_back((bench::now_s() - t) / iters * 1e6);
    }
    if (!peer_ok) continue;
    int rc = 0;
    const std::string out = bench::capture(cmd, &rc);
    bench::relay_peer_environment(out);
    for (std::size_t k = 0; k < n_cases; ++k) peer_runs[k].push_back(bench::find_value(out, std::string(kCases[k].name) + ".step_us"));
    if (rc != 0 || *std::min_element(peer_runs.back().begin(), peer_runs.back().end()) < 0) {
      std::fprintf(stderr, "peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
      peer_ok = false;
      for (auto& v : peer_runs) v.clear();
    }
  }
  std::printf("%lld parameters in %zu tensors; medians of 5 runs of %d steps, [fastest, slowest] run\n",
              static_cast<long long>(numel), params.size(), iters);
  std::printf("%-16s %12s %12s %9s %10s %9s\n", "case", "phalanx_us", "torch_us", "phx/torch", "limit_us", "phx/limit");
  for (std::size_t k = 0; k < n_cases; ++k) {
    const Case& c = kCases[k];
    const std::string name = c.name;
    const bench::Summary ours = bench::summarise(ours_runs[k]), theirs = bench::summarise(peer_runs[k]);
    const double limit_us = copy.ok() ? c.arrays * array_bytes / (copy.median * 1e9) * 1e6 : -1;
    const double r = theirs.ok() ? ours.median / theirs.median : -1;
    std::printf("%-16s %12.1f %12.1f %9.2f %10.1f %9.2f   %s  torch %s\n", c.name, ours.median, theirs.median, r,
                limit_us, limit_us > 0 ? ours.median / limit_us : -1, bench::show(ours, "us").c_str(),
                bench::show(theirs, "us").c_str());
    std::string bar = c.bar;
    if (bar != "-" && r > 0) bar += r <= std::atof(c.bar + 3) ? ": met" : ": NOT met";
    char what[200];
    std::snprintf(what, sizeof what, "%s step, MLP 784-1024-1024-10's %.2f M parameters, 1 thread (limit: %.0f us = %d arrays at memcpy's %.1f GB/s)",
                  c.what, numel / 1e6, limit_us, c.arrays, copy.median);
    bench::result_row("bench_optim_step", name == "zero_grad" ? std::string(c.what) + ", same parameters, 1 thread" : what,
                      ours, "PyTorch", theirs, "us", 1, bar);
  }
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_optim_step", argc, argv, run);
}
