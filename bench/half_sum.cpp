// The collectives' 16-bit sums alone (phalanx/core/half_sum.hpp, what the shm, Gloo and MPI
// plugins run on float16 / bfloat16 buckets): the AVX2 path against the scalar path (the
// plugins' old per-element loops, same rules; PHALANX_FP16_SIMD / PHALANX_BF16_SIMD=scalar) in
// the same run, and memcpy of the output as the memory limit. Default: a 3.7 MB 16-bit bucket
// (1.85 M elements) per source, W = 2 and 4 sources, one thread; the two paths take turns,
// run by run (5 runs each).
// usage: bench_half_sum [--elements N] [--iters N]
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <phalanx/core/half_sum.hpp>

#include "bench_support.hpp"

using namespace phalanx;

int main(int argc, char** argv) {
  std::size_t n = 1850000;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--elements" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_half_sum: unknown argument '%s'; usage: bench_half_sum [--elements N] [--iters N]\n",
                   a.c_str());
      return 2;
    }
  }
  if (n == 0 || iters < 1) {
    std::fprintf(stderr, "bench_half_sum: --elements and --iters must be positive\n");
    return 2;
  }
  bench::print_environment("bench_half_sum");
  std::printf("# %zu 16-bit elements per source (%.1f MB), %d calls per run, median [fastest, slowest] of 5 runs\n", n,
              2.0 * n / 1e6, iters);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.f, 1e-3f);
  std::vector<std::vector<std::uint16_t>> src(4, std::vector<std::uint16_t>(n));
  for (auto& s : src)
    for (auto& v : s) {  // gradients' magnitudes: well inside both formats' normal range
      const float f = g(rng);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      v = static_cast<std::uint16_t>(u >> 16);  // bf16 by truncation; for float16 the same bits are plain values
    }
  std::vector<std::uint16_t> dst(n), dst2(n);
  const bench::Summary limit = bench::memcpy_us(2 * n, iters);
  std::printf("memcpy of one output (%.1f MB): %s\n", 2.0 * n / 1e6, bench::show(limit, "us").c_str());
  struct Kind {
    const char* name;
    const char* env;
    void (*sum)(void*, void*, const void* const*, int, std::size_t);
  };
  for (const Kind& k : {Kind{"fp16", "PHALANX_FP16_SIMD", &fp16_sum}, Kind{"bf16", "PHALANX_BF16_SIMD", &bf16_sum}})
    for (int w : {2, 4}) {
      const void* p[4] = {src[0].data(), src[1].data(), src[2].data(), src[3].data()};
      auto call = [&] {
        k.sum(dst.data(), dst2.data(), p, w, n);
        asm volatile("" ::"r"(dst.data()) : "memory");
      };
      // One run of `iters` calls at a level (mean us a call).
      auto run = [&](const char* level, int calls) {
        ::setenv(k.env, level, 1);
        const double t = bench::now_s();
        for (int i = 0; i < calls; ++i) call();
        ::unsetenv(k.env);
        return (bench::now_s() - t) / calls * 1e6;
      };
      for (const char* level : {"scalar", "avx2"}) run(level, std::max(5, iters / 10));  // warm-up
      // The two levels take turns run by run, so a drift of the machine's load hits both.
      std::vector<double> scalar_us, simd_us;
      for (int r = 0; r < 5; ++r) {
        scalar_us.push_back(run("scalar", iters));
        simd_us.push_back(run("avx2", iters));
      }
      const bench::Summary scalar = bench::summarise(scalar_us), simd = bench::summarise(simd_us);
      bench::result_row("bench_half_sum", std::string(k.name) + " sum, W=" + std::to_string(w) + ", dst+dst2",
                        simd, "scalar path", scalar, "us", 1, "-");
    }
  bench::print_load_at_end();
  return 0;
}
