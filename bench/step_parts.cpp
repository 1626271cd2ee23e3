// The memory-bound parts of the MLP 784-1024-1024-10 step at batch 128, each
// against this machine's measured memcpy rate at the same working-set size: the kernel's
// bytes moved (read + written, as memcpy's rate counts them) over its time, beside memcpy's
// bytes per second on a buffer of the same size. One thread; medians of 5 runs of ITERS
// calls with the fastest and slowest run. The parts, as a step calls them (the kernel table
// directly, no op-layer allocation):
//   forward:  bias rows copied into the output before GEMM accumulates (3 layers), ReLU (2)
//   backward: ReLU's backward (2), the bias gradients' column sums (3), cross-entropy and
//             its backward (logits 128 x 10)
//   DDP / trainer: the gradient finiteness check (phalanx-train, every step: all 1.86 M
//             gradients), a gradient copied into its bucket (only when a gradient was
//             created outside the bucket, e.g. the first step), zero_grad(set_to_none=false)
//   optimizer: plain SGD over the 1.86 M parameters (bench_optim_step has the rest)
//
//   bench_step_parts [--iters N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <phalanx/core/finite.hpp>
#include <phalanx/core/kernels.hpp>
#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

using bench::time_us;

/// memcpy's rate on `bytes` (read + written bytes per second, GB/s) and its time.
struct Copy {
  double gbs;
  bench::Summary us;
};
Copy memcpy_rate(std::size_t bytes, int iters) {
  const bench::Summary us = bench::memcpy_us(bytes, iters);
  return {bench::copy_gbs(bytes, us.median), us};
}

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  int iters = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_step_parts: unknown argument %s (usage: bench_step_parts [--iters N])\n", a.c_str());
      return 2;
    }
  }
  bench::print_environment("bench_step_parts");
  DeviceKernels& k = kernels_for(Device::cpu());
  const std::int64_t B = 128, H = 1024, C = 10;
  manual_seed(0);
  auto model = nn::mlp({784, H, H, C});
  auto params = model->parameters();
  std::int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const double act = 4.0 * B * H, pset = 4.0 * numel;  // bytes of one activation, one parameter set

  const Copy small = memcpy_rate(static_cast<std::size_t>(act), iters);
  const Copy large = memcpy_rate(static_cast<std::size_t>(pset), std::max(20, iters / 50));
  std::printf("# limits: memcpy %.0f KB (an activation [128, 1024]) %.1f GB/s; memcpy %.2f MB (a parameter set) %.1f GB/s "
              "(read + written bytes per second, medians of 5 runs)\n",
              act / 1e3, small.gbs, pset / 1e6, large.gbs);
  std::printf("%-44s %5s %10s %10s %8s %9s %9s\n", "part (MLP 784-1024-1024-10, batch 128)", "calls", "MB moved",
              "us/call", "GB/s", "memcpy", "x memcpy");

  Tensor x = randn({B, H}), y = Tensor::empty({B, H}), gy = randn({B, H}), gx = Tensor::empty({B, H});
  Tensor bias = randn({H}), bias10 = randn({C}), out10 = Tensor::empty({B, C}), gb = Tensor::empty({H});
  Tensor logits = randn({B, C}), probs = Tensor::empty({B, C}), loss = Tensor::empty({B});
  Tensor target = randint(C, {B}), gl = Tensor::empty({B, C}), one = ones({1});
  k.unary(UnaryOp::Relu, x, y);
  std::vector<Tensor> grads, bucket;
  for (const auto& p : params) {
    grads.push_back(randn(p.shape()) * 1e-3f);
    bucket.push_back(Tensor::empty(p.shape()));
  }

  double total_us = 0, total_limit_us = 0;
  const auto part = [&](const char* name, int calls, double bytes, bool big, const std::function<void()>& fn,
                        int n_iters) {
    const bench::Summary s = time_us(n_iters, fn);
    const double gbs = bytes / (s.median * 1e-6) / 1e9, limit = big ? large.gbs : small.gbs;
    total_us += calls * s.median;
    total_limit_us += calls * bytes / (limit * 1e9) * 1e6;
    std::printf("%-44s %5d %10.3f %10s %8.1f %9.1f %9.2f\n", name, calls, bytes / 1e6, bench::show(s, "").c_str(), gbs,
                limit, limit / gbs);
  };
  part("forward: bias rows into the output [128, 1024]", 2, act + 4.0 * H, false, [&] { k.broadcast_rows(bias, y); },
       iters);
  part("forward: bias rows into the output [128, 10]", 1, 4.0 * B * C + 4.0 * C, false,
       [&] { k.broadcast_rows(bias10, out10); }, iters);
  part("forward: ReLU [128, 1024]", 2, 2 * act, false, [&] { k.unary(UnaryOp::Relu, x, gx); }, iters);
  part("forward: cross-entropy (logits [128, 10])", 1, 4.0 * B * C * 2 + 4.0 * B + 8.0 * B, false,
       [&] { k.cross_entropy(logits, target, probs, loss); }, iters);
  part("backward: cross-entropy's backward", 1, 4.0 * B * C * 2 + 8.0 * B, false,
       [&] { k.cross_entropy_backward(probs, target, one, 1.f / B, gl); }, iters);
  part("backward: ReLU's backward [128, 1024]", 2, 3 * act, false,
       [&] { k.unary_backward(UnaryOp::Relu, gy, x, y, gx); }, iters);
  part("backward: bias gradient, column sums of [128, 1024]", 2, act + 4.0 * H, false,
       [&] { k.sum_to_period(gy, gb, 1.f); }, iters);
  const int big_iters = std::max(20, iters / 50);
  part("trainer: gradient finiteness check (1.86 M)", 1, pset, true, [&] {
    bool ok = true;
    for (const auto& g : grads) ok = all_finite(g.data<float>(), g.numel()) && ok;
    asm volatile("" ::"r"(ok));
  }, big_iters);
  part("DDP: gradients copied into buckets (1.86 M)", 0, 2 * pset, true, [&] {
    for (std::size_t i = 0; i < grads.size(); ++i) bucket[i].copy_(grads[i]);
  }, big_iters);
  part("zero_grad(set_to_none=false) (1.86 M)", 0, pset, true, [&] {
    for (auto& g : bucket) g.zero_();
  }, big_iters);
  {
    optim::SGD opt(params, optim::SGDOptions{0.01});
    for (std::size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i]);
    part("optimizer: SGD step (1.86 M)", 1, 3 * pset, true, [&] { opt.step(); }, big_iters);
  }
  std::printf("per step (the calls column; the bucket copy and zeroing counted 0: not in a steady step): %.0f us; "
              "at memcpy's rates %.0f us\n", total_us, total_limit_us);
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_step_parts", argc, argv, run);
}
