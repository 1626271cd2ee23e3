// The examples/gpt training step (nanoGPT's GPT, gpt:4-4-128:128, 16 x 128 byte tokens: zero_grad,
// forward with the loss, backward, AdamW with nanoGPT's two groups), Phalanx and PyTorch 1.13
// (bench/peers/torch_gpt_step.py: nanoGPT's model re-typed) in the same run, one thread a
// process. Each side: warm-up steps, then 5 runs of ITERS steps, the sides taking turns run by
// run (the peer started once per run); the median run with the fastest and slowest; tokens/s of
// the medians, their ratio (bar: Phalanx >= 1.15x PyTorch's), and each side's share of one
// core's float32 peak (the FLOPs of a token as nanoGPT's estimate_mfu counts them, 6 N + 12 L T E,
// over the clock x FLOPs a cycle: 64 with AVX-512, 32 with AVX2 + FMA, two FMA units assumed).
// Then 2 workers (DDP, each its own 16 x 128 batch, the default backend) against 1 worker
// started the same way: tokens/s of all workers (bar: >= 1.8x), runs alternating.
//
// --precision (default fp32: the above): bf16 runs the forward and the loss under
// autocast(bf16) (torch.autocast("cpu", dtype=torch.bfloat16) in the peer; zero_grad, backward
// and AdamW outside it on both sides), beside our float32 step and PyTorch's float32 and bf16
// steps, all four taking turns run by run, and prints issue 30's bars: our bf16 tokens/s >=
// 1.5x PyTorch's float32 and >= 1.3x PyTorch's bf16 autocast. both: that and the float32 bar
// and the DDP rows. PyTorch 1.13's bf16 autocast step can take seconds on a CPU without
// AVX512_BF16 (its bf16 products are plain loops there): its runs then have 1 step (after 1
// warm-up step in each start), which the output says.
//
//   bench_gpt_step [--iters N] [--precision fp32|bf16|both] [--no-peer] [--no-ddp]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <phalanx/core/autocast.hpp>
#include <phalanx/core/nn/gpt.hpp>
#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

constexpr std::int64_t kLayers = 4, kHeads = 4, kWidth = 128, kContext = 128, kBatch = 16;

nn::GPTConfig config() {
  return nn::GPTConfig().n_layer(kLayers).n_head(kHeads).n_embd(kWidth).block_size(kContext).vocab_size(256).bias(true);
}

// One process's training step on a fixed batch; `model` is the GPT or its DDP wrapper.
class Step {
 public:
  Step(std::shared_ptr<nn::GPT> gpt, nn::Module* model, bool bf16 = false)
      : gpt_(std::move(gpt)), model_(model ? model : gpt_.get()), bf16_(bf16) {
    Generator g(1);
    x_ = randint(256, {kBatch, kContext}, &g);
    y_ = randint(256, {kBatch, kContext}, &g);
    const nn::DecayGroups groups = nn::decay_groups(*gpt_);
    opt_ = std::make_unique<optim::AdamW>(groups.decay, optim::AdamWOptions(1e-3).weight_decay(0.1).betas(0.9, 0.99));
    opt_->add_param_group(groups.no_decay, {{"weight_decay", 0.0}});
  }
  void operator()() {
    opt_->zero_grad();
    forward_loss().backward();
    opt_->step();
  }
  /// The forward and the loss; under autocast(bf16) for a bf16 step (backward and AdamW
  /// outside it, as torch.autocast's recipe).
  Tensor forward_loss() {
    if (!bf16_) return loss();
    autocast guard(DType::BFloat16);
    return loss();
  }
  double run_us(int iters) {
    const double t = bench::now_s();
    for (int i = 0; i < iters; ++i) (*this)();
    return (bench::now_s() - t) / iters * 1e6;
  }

 private:
  Tensor loss() {
    const Tensor logits = model_->forward(x_);
    return cross_entropy(reshape(logits, {kBatch * kContext, 256}), reshape(y_, {kBatch * kContext}));
  }
  std::shared_ptr<nn::GPT> gpt_;
  nn::Module* model_;
  bool bf16_;
  Tensor x_, y_;
  std::unique_ptr<optim::AdamW> opt_;
};

// nanoGPT's estimate_mfu: 6 N + 12 L T E FLOPs a token (N without the position table).
double flops_per_token(const nn::GPT& gpt) {
  return 6.0 * static_cast<double>(gpt.num_params(true)) + 12.0 * kLayers * kContext * kWidth;
}

// One core's float32 peak in FLOP/s: the clock (cpu MHz) x FLOPs a cycle; 0 when unknown.
double core_peak(std::string& how) {
  std::ifstream f("/proc/cpuinfo");
  double mhz = 0;
  bool avx512 = false, avx2 = false, fma = false;
  for (std::string line; std::getline(f, line);) {
    if (mhz == 0 && line.rfind("cpu MHz", 0) == 0) mhz = std::atof(line.substr(line.find(':') + 1).c_str());
    if (line.rfind("flags", 0) == 0) {
      avx512 = avx512 || line.find(" avx512f") != std::string::npos;
      avx2 = avx2 || line.find(" avx2") != std::string::npos;
      fma = fma || line.find(" fma") != std::string::npos;
    }
  }
  const int per_cycle = avx512 ? 64 : (avx2 && fma) ? 32 : 8;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.0f MHz x %d float32 FLOPs a cycle (%s) = %.1f GFLOP/s", mhz, per_cycle,
                avx512 ? "AVX-512, 2 FMA units" : (avx2 && fma) ? "AVX2 + FMA, 2 units" : "SSE", mhz * 1e6 * per_cycle / 1e9);
  how = buf;
  return mhz * 1e6 * per_cycle;
}

void worker_env(int rank, int world, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("PHALANX_STORE_HOSTED", "1", 1);
  set_num_threads(1);
}

// Microseconds a step on `world` DDP workers (each its own batch of 16 x 128), rank 0's.
double ddp_step_us(int world, int iters, std::string& backend) {
  TcpStoreServer server(TcpStoreOptions{});
  const std::string out = bench::run_ranks(world, [&](int rank, std::FILE* f) {
    worker_env(rank, world, server.port());
    auto pg = parallel::init_process_group();
    Generator init(0);
    auto gpt = std::make_shared<nn::GPT>(config(), &init);
    auto ddp = std::make_shared<parallel::DDP>(gpt, pg);
    Step step(gpt, ddp.get());
    for (int i = 0; i < 2; ++i) step();
    pg->barrier()->wait();
    const double us = step.run_us(iters);
    if (f) std::fprintf(f, "step_us=%f backend=%s\n", us, pg->backend_name().c_str());
  });
  const auto at = out.find("backend=");
  if (at != std::string::npos) backend = out.substr(at + 8, out.find_first_of(" \n", at) - at - 8);
  return bench::find_value(out, "step_us");
}

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  bool skip_peer = false, skip_ddp = false;
  int iters = 5;
  std::string precision = "fp32";
  const char* usage = "usage: bench_gpt_step [--iters N] [--precision fp32|bf16|both] [--no-peer] [--no-ddp]";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--no-ddp") skip_ddp = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
    else {
      std::fprintf(stderr, "bench_gpt_step: unknown argument %s (%s)\n", a.c_str(), usage);
      return 2;
    }
  }
  if (precision != "fp32" && precision != "bf16" && precision != "both") {
    std::fprintf(stderr, "bench_gpt_step: --precision must be fp32, bf16 or both, got %s (%s)\n", precision.c_str(), usage);
    return 2;
  }
  const bool with_fp32_bar = precision != "bf16", with_bf16 = precision != "fp32";
  if (precision == "bf16") skip_ddp = true;  // the DDP rows are float32 steps: --precision both has them
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_gpt_step.py");
  bench::print_environment("bench_gpt_step");
  if (with_bf16) std::printf("# phalanx: bf16 GEMM %s\n", bf16_gemm_info().c_str());
  Generator init(0);
  auto gpt = std::make_shared<nn::GPT>(config(), &init);
  const double tokens = static_cast<double>(kBatch * kContext), fpt = flops_per_token(*gpt);
  std::string peak_how;
  const double peak = core_peak(peak_how);
  std::printf("GPT gpt:%lld-%lld-%lld:%lld (%lld parameters without the position table), batch %lld x %lld tokens, "
              "AdamW; 1 thread a process; medians of 5 runs of %d steps, [fastest, slowest]\n",
              static_cast<long long>(kLayers), static_cast<long long>(kHeads), static_cast<long long>(kWidth),
              static_cast<long long>(kContext), static_cast<long long>(gpt->num_params(true)),
              static_cast<long long>(kBatch), static_cast<long long>(kContext), iters);
  std::printf("FLOPs a token (nanoGPT's estimate_mfu, 6 N + 12 L T E): %.2f M; one core's peak: %s\n", fpt / 1e6,
              peak_how.c_str());

  // The sides, taking turns run by run: ours (a model each, the same initial weights) and the
  // peer (started once per run), float32 and, with --precision bf16|both, bf16 autocast.
  struct Side {
    std::string name;
    bool peer, bf16;
    int iters;
    std::unique_ptr<Step> step;
    std::vector<double> runs;
    bool ok = true;
  };
  std::vector<Side> sides;
  const auto add_ours = [&](bool bf16) {
    Generator g(0);
    auto model = bf16 || !sides.empty() ? std::make_shared<nn::GPT>(config(), &g) : gpt;
    sides.push_back({bf16 ? "phalanx bf16" : "phalanx", false, bf16, iters, std::make_unique<Step>(model, nullptr, bf16)});
    for (int i = 0; i < std::max(2, iters / 2); ++i) (*sides.back().step)();
  };
  if (precision != "bf16") add_ours(false);
  if (with_bf16) add_ours(true);
  if (!skip_peer) {
    sides.push_back({"pytorch", true, false, iters, nullptr});
    if (with_bf16) sides.push_back({"pytorch bf16", true, true, 1, nullptr});  // 1 step first: it may take seconds
  }
  for (int r = 0; r < 5; ++r) {
    for (Side& s : sides) {
      if (!s.peer) {
        s.runs.push_back(s.step->run_us(s.iters));
        continue;
      }
      if (!s.ok) continue;
      const std::string cmd = "OMP_NUM_THREADS=1 " + bench::python() + " " + peer + " " + std::to_string(kLayers) + "-" +
                              std::to_string(kHeads) + "-" + std::to_string(kWidth) + ":" + std::to_string(kContext) +
                              " " + std::to_string(kBatch) + " " + std::to_string(s.iters) + " 1" + (s.bf16 ? " bf16" : "");
      const std::string out = bench::capture(cmd);
      bench::relay_peer_environment(out);
      s.runs.push_back(bench::find_value(out, "step_us"));
      if (s.runs.back() < 0) {
        std::fprintf(stderr, "peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
        s.ok = false;
        s.runs.clear();
        continue;
      }
      // The bf16 peer (PyTorch 1.13's bf16 autocast without AVX512_BF16: seconds a step) gets
      // runs of about 2 s, at least 1 step and at most ITERS.
      if (s.bf16) s.iters = std::max(1, std::min(iters, static_cast<int>(2e6 / s.runs.back())));
    }
  }
  const auto tps = [&](double us) { return us > 0 ? tokens / (us * 1e-6) : 0.0; };
  const auto share = [&](double us) { return peak > 0 && us > 0 ? tps(us) * fpt / peak : 0.0; };
  const int w = with_bf16 ? 13 : 10;  // the name column (10 as before for --precision fp32)
  std::printf("%-*s %12s %12s %12s   %s\n", w, "side", "step_ms", "tokens/s", "peak share", "step ms [fastest, slowest]");
  const auto summary_of = [&](bool peer_side, bool bf16) {
    for (const Side& s : sides)
      if (s.peer == peer_side && s.bf16 == bf16) return bench::summarise(s.runs);
    return bench::Summary{};
  };
  for (const Side& s : sides) {
    const bench::Summary m = bench::summarise(s.runs);
    if (!m.ok()) continue;
    std::printf("%-*s %12.1f %12.0f %11.0f%%   %s", w, s.name.c_str(), m.median / 1e3, tps(m.median), 100 * share(m.median),
                bench::show(m, "ms", 1e3).c_str());
    if (s.iters < iters) std::printf("   (runs of %d step%s: a slow step)", s.iters, s.iters == 1 ? "" : "s");
    std::printf("\n");
  }
  const bench::Summary a = summary_of(false, false), b = summary_of(true, false);
  if (with_fp32_bar) {
    const double ratio = b.ok() ? tps(a.median) / tps(b.median) : 0;
    if (b.ok())
      std::printf("tokens/s phalanx / pytorch: %.2fx (bar >= 1.15x: %s)\n", ratio, ratio >= 1.15 ? "met" : "NOT met");
    bench::result_row("bench_gpt_step", "GPT gpt:4-4-128:128 step, 16 x 128 tokens, 1 thread", a, "PyTorch", b, "ms", 1e3,
                      "<= 0.87 (tokens/s >= 1.15x)" + std::string(b.ok() ? (ratio >= 1.15 ? ": met" : ": NOT met") : ""));
  }
  if (with_bf16) {
    const bench::Summary ab = summary_of(false, true), bb = summary_of(true, true);
    const auto ratio_line = [&](const char* what, const bench::Summary& num, const bench::Summary& den, double bar) {
      if (!num.ok() || !den.ok()) return std::printf("    %-36s   n/a (no run)\n", what), 0.0;
      const double r = tps(num.median) / tps(den.median);
      if (bar > 0) std::printf("    %-36s %5.2fx   bar >= %.1fx: %s\n", what, r, bar, r >= bar ? "met" : "NOT met");
      else std::printf("    %-36s %5.2fx\n", what, r);
      return r;
    };
    std::printf("bf16 autocast, tokens/s ratios of the medians (issue 30's bars; bf16 GEMM: %s):\n",
                bf16_gemm_info().c_str());
    const double vs_fp32 = ratio_line("phalanx bf16 / pytorch fp32", ab, b, 1.5);
    const double vs_bf16 = ratio_line("phalanx bf16 / pytorch bf16", ab, bb, 1.3);
    ratio_line("phalanx bf16 / phalanx fp32", ab, a, 0);
    ratio_line("pytorch bf16 / pytorch fp32", bb, b, 0);
    bench::result_row("bench_gpt_step", "GPT gpt:4-4-128:128 step, bf16 autocast, 1 thread", ab, "PyTorch fp32", b, "ms",
                      1e3, "<= 0.67 (tokens/s >= 1.5x)" + std::string(vs_fp32 > 0 ? (vs_fp32 >= 1.5 ? ": met" : ": NOT met") : ""));
    bench::result_row("bench_gpt_step", "GPT gpt:4-4-128:128 step, bf16 autocast, 1 thread", ab, "PyTorch bf16", bb, "ms",
                      1e3, "<= 0.77 (tokens/s >= 1.3x)" + std::string(vs_bf16 > 0 ? (vs_bf16 >= 1.3 ? ": met" : ": NOT met") : ""));
  }

  if (!skip_ddp) {
    std::vector<double> one, two;
    std::string backend = "?";
    for (int r = 0; r < 5; ++r) {
      one.push_back(ddp_step_us(1, iters, backend));
      two.push_back(ddp_step_us(2, iters, backend));
    }
    const bench::Summary s1 = bench::summarise(one), s2 = bench::summarise(two);
    const double t1 = tps(s1.median), t2 = 2 * tps(s2.median), scale = t1 > 0 ? t2 / t1 : 0;
    std::printf("DDP on %s, each worker 16 x 128 tokens a step: 1 worker %.0f tokens/s (%s a step), 2 workers %.0f "
                "tokens/s (%s a step): %.2fx (bar >= 1.8x: %s)\n",
                backend.c_str(), t1, bench::show(s1, "ms", 1e3).c_str(), t2, bench::show(s2, "ms", 1e3).c_str(), scale,
                scale >= 1.8 ? "met" : "NOT met");
  }
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_gpt_step", argc, argv, run);
}
