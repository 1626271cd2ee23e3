// Causal attention forward + backward alone, Phalanx's fused kernel against PyTorch 1.13's
// explicit softmax(q k^T * scale + mask) v (1.13 has no fused attention on the CPU), one
// thread each, batch 4, 4 heads, head dim 32, at T = 128, 512, 2048 (docs/attention.md).
//
//   bench_attention [--runs N>=5] [--t T[,T...]] [--no-peer]
//
// Time: RUNS runs of ITERS steps per side (after warm-up steps), the sides taking turns run
// by run (the peer is started once per run), the median run per step with the fastest and
// slowest; the ratio is of the medians. Memory, per T in a fresh process for each side
// (forked for Phalanx, a new interpreter for PyTorch): the growth of the peak resident set
// (VmHWM, reset through /proc/self/clear_refs) over the first step beyond the inputs; and
// for Phalanx also its allocator's peak beyond the inputs (cpu_memory_stats), which counts
// tensors and the kernel's scratch exactly. The peer is peers/torch_attention.py.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <phalanx/core/memory_stats.hpp>
#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

constexpr std::int64_t kBatch = 4, kHeads = 4, kDim = 32;

long status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string want = std::string(key) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(want, 0) == 0) return std::atol(line.c_str() + want.size());
  return -1;
}

struct Side {
  Tensor q, k, v, g;
  explicit Side(std::int64_t t) {
    Generator gen(0);
    const Shape s{kBatch, kHeads, t, kDim};
    q = randn(s, &gen).requires_grad_(true);
    k = randn(s, &gen).requires_grad_(true);
    v = randn(s, &gen).requires_grad_(true);
    g = randn(s, &gen);
  }
  void step() {
    q.set_grad(Tensor());
    k.set_grad(Tensor());
    v.set_grad(Tensor());
    scaled_dot_product_attention(q, k, v, Tensor(), 0.f, true).backward(g);
  }
  double run_us(int iters) {
    const double t0 = bench::now_s();
    for (int i = 0; i < iters; ++i) step();
    return (bench::now_s() - t0) / iters * 1e6;
  }
};

struct Memory {
  double rss = -1, allocator = -1;  // bytes beyond the inputs
};

/// Phalanx's memory for one first step at length t, in a forked process.
Memory ours_memory(std::int64_t t) {
  const std::string out = bench::run_ranks(1, [t](int, std::FILE* f) {
    Side side(t);
    const long before = status_kb("VmRSS");
    const std::size_t alloc_before = cpu_memory_stats().allocated_bytes;
    reset_cpu_peak_memory();
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
    side.step();
    const long hwm = status_kb("VmHWM");
    std::fprintf(f, "rss=%ld alloc=%zu\n", (hwm - before) * 1024,
                 cpu_memory_stats().peak_allocated_bytes - alloc_before);
  });
  return {bench::find_value(out, "rss"), bench::find_value(out, "alloc")};
}

std::string mb(double bytes) {
  if (bytes < 0) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, bytes >= 100e6 ? "%.0f MB" : bytes >= 10e6 ? "%.1f MB" : "%.2f MB", bytes / 1e6);
  return b;
}

}  // namespace

int run(int argc, char** argv) {
  set_num_threads(1);
  bool skip_peer = false;
  int runs = 5;
  std::vector<std::int64_t> lengths = {128, 512, 2048};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") {
      skip_peer = true;
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--t" && i + 1 < argc) {
      lengths.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) lengths.push_back(std::max(1, std::atoi(x.c_str())));
    } else {
      std::fprintf(stderr, "bench_attention: unknown argument %s (usage: bench_attention [--runs N>=5] "
                           "[--t T[,T...]] [--no-peer])\n", a.c_str());
      return 2;
    }
  }
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_attention.py");
  const std::string py = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + bench::python() + " " + peer + " ";
  bench::print_environment("bench_attention");
  std::printf("causal attention forward + backward, batch %lld, %lld heads, head dim %lld, 1 thread; medians of %d "
              "runs per side, [fastest, slowest] in brackets\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads), static_cast<long long>(kDim), runs);
  std::printf("%6s %24s %24s %9s | %14s %14s %14s %9s\n", "T", "phalanx_ms", "torch_ms", "phx/torch",
              "phx_alloc_peak", "phx_rss_peak", "torch_rss_peak", "phx/torch");
  struct Row {
    std::int64_t t;
    Memory ours;
  };
  std::vector<Row> rows;
  for (const std::int64_t t : lengths) {
    const int iters = static_cast<int>(std::max<std::int64_t>(1, (512 * 512 * 4) / (t * t)));
    const std::string dims = std::to_string(t) + " " + std::to_string(kBatch) + " " + std::to_string(kHeads) + " " +
                             std::to_string(kDim);
    // Memory first, each side in a fresh process.
    const Memory mem = ours_memory(t);
    double theirs_mem = -1;
    if (!skip_peer) {
      const std::string out = bench::capture(py + "mem " + dims);
      bench::relay_peer_environment(out);
      theirs_mem = bench::find_value(out, "peak_bytes");
      if (theirs_mem < 0) std::fprintf(stderr, "peer failed (%smem %s):\n%s\n", py.c_str(), dims.c_str(), out.c_str());
    }
    Side side(t);
    for (int i = 0; i < 2; ++i) side.step();  // warm-up
    std::vector<double> ours_runs, peer_runs;
    for (int r = 0; r < runs; ++r) {
      ours_runs.push_back(side.run_us(iters));
      if (skip_peer) continue;
      const std::string out = bench::capture(py + "time " + dims + " " + std::to_string(iters) + " 1");
      bench::relay_peer_environment(out);
      peer_runs.push_back(bench::find_value(out, "step_us"));
      if (peer_runs.back() < 0) {
        std::fprintf(stderr, "peer failed (%stime %s):\n%s\n", py.c_str(), dims.c_str(), out.c_str());
        skip_peer = true;
      }
    }
    const bench::Summary o = bench::summarise(ours_runs), p = bench::summarise(peer_runs);
    const double mem_ratio = mem.rss > 0 && theirs_mem > 0 ? mem.rss / theirs_mem : -1;
    std::printf("%6lld %24s %24s %9.2f | %14s %14s %14s %9.3f\n", static_cast<long long>(t),
                bench::show(o, "ms", 1e3).c_str(), bench::show(p, "ms", 1e3).c_str(),
                o.ok() && p.ok() ? o.median / p.median : -1.0, mb(mem.allocator).c_str(), mb(mem.rss).c_str(),
                mb(theirs_mem).c_str(), mem_ratio);
    std::fflush(stdout);
    bench::result_row("bench_attention", "causal attention fwd+bwd, T " + std::to_string(t) + ", B 4, H 4, E 32, 1 thread",
                      o, "PyTorch (explicit softmax)", p, "ms", 1e3, "-");
    std::printf("ROW|bench_attention|peak memory beyond the inputs, T %lld|%s (allocator %s)|PyTorch: %s|%.3f|linear in T\n",
                static_cast<long long>(t), mb(mem.rss).c_str(), mb(mem.allocator).c_str(), mb(theirs_mem).c_str(),
                mem_ratio);
    rows.push_back({t, mem});
  }
  // Linear growth: the allocator's peak per token stays flat as T grows.
  std::printf("phalanx allocator peak per token (bytes):");
  for (const Row& r : rows) std::printf("  T %lld: %.0f", static_cast<long long>(r.t), r.ours.allocator / double(r.t));
  std::printf("\n");
  bench::print_load_at_end();
  return 0;
}

int main(int argc, char** argv) {
  return phalanx::bench::guarded_main("bench_attention", argc, argv, run, /*one_blas_thread=*/true);
}
