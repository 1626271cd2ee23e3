// The CPU's bf16 GEMM (DeviceKernels::gemm_bf16, core/src/cpu/bf16_gemm.cpp), one thread, at
// 1024^3 and at an MLP's shapes (784-1024-1024, batch 128): against our float32 GEMM (the path
// linear takes: OpenBLAS or our own kernel, as gemm_policy picks), against the bf16 fallback
// (PHALANX_BF16_GEMM=fallback), and against PyTorch 1.13's bf16 and float32 products
// (peers/torch_bf16_gemm.py) in the same run. The bf16 figure is also given as a share of
// this core's bf16 peak, measured here with a vdpbf16ps throughput loop.
// usage: bench_bf16_gemm [--iters N] [--no-peer]
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include <phalanx/core/half.hpp>
#include <phalanx/core/kernels.hpp>
#include <phalanx/phalanx.hpp>

#include "bench_support.hpp"

using namespace phalanx;

namespace {

// This thread's CPU time: the peaks and the products are timed in it as well as (products)
// in wall-clock time, since a shared machine's load stretches the wall clock, not this.
double thread_cpu_s() {
  timespec t;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

#ifdef BENCH_X86
// GFLOP/s of back-to-back vdpbf16ps zmm (16 lanes x 2 multiply-adds = 64 FLOP each) on 16
// independent accumulators: the core's bf16 peak, what no GEMM can beat.
__attribute__((target("avx512f,avx512bf16"))) double bf16_peak_gflops() {
  __m512 c[16];
  for (int i = 0; i < 16; ++i) c[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x30803080);
  const long iters = 20'000'000;
  const double t = thread_cpu_s();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) c[i] = _mm512_dpbf16_ps(c[i], a, b);
    asm volatile("" : "+v"(c[0]), "+v"(c[1]), "+v"(c[2]), "+v"(c[3]), "+v"(c[4]), "+v"(c[5]), "+v"(c[6]), "+v"(c[7]));
    asm volatile("" : "+v"(c[8]), "+v"(c[9]), "+v"(c[10]), "+v"(c[11]), "+v"(c[12]), "+v"(c[13]), "+v"(c[14]), "+v"(c[15]));
  }
  const double s = thread_cpu_s() - t;
  return static_cast<double>(iters) * 16 * 64 / s / 1e9;
}
// The AMX peak: back-to-back tdpbf16ps on four independent 16 x 16 accumulator tiles from
// two A and two B tiles already loaded (16 x 16 x 32 multiply-adds = 16384 FLOP each).
struct alignas(64) BenchTileConfig {
  std::uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
__attribute__((target("amx-tile,amx-bf16"))) double amx_peak_gflops() {
  BenchTileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  alignas(64) static std::uint16_t src[16 * 32];
  for (auto& x : src) x = 0x3c00;  // 2^-7: sums stay finite
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  const long iters = 2'000'000;
  const double t = thread_cpu_s();
  for (long it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const double s = thread_cpu_s() - t;
  _tile_release();
  return static_cast<double>(iters) * 4 * 16384 / s / 1e9;
}
// The same for float32 vfmadd231ps zmm (16 lanes x 1 multiply-add = 32 FLOP each).
__attribute__((target("avx512f,fma"))) double f32_peak_gflops() {
  __m512 c[16];
  for (int i = 0; i < 16; ++i) c[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(1e-7f);
  const long iters = 20'000'000;
  const double t = thread_cpu_s();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) c[i] = _mm512_fmadd_ps(a, c[i], b);
    asm volatile("" : "+v"(c[0]), "+v"(c[1]), "+v"(c[2]), "+v"(c[3]), "+v"(c[4]), "+v"(c[5]), "+v"(c[6]), "+v"(c[7]));
    asm volatile("" : "+v"(c[8]), "+v"(c[9]), "+v"(c[10]), "+v"(c[11]), "+v"(c[12]), "+v"(c[13]), "+v"(c[14]), "+v"(c[15]));
  }
  const double s = thread_cpu_s() - t;
  return static_cast<double>(iters) * 16 * 32 / s / 1e9;
}
#endif

struct Shape3 {
  const char* name;
  std::int64_t m, n, k;
  bool ta, tb;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 5;
  bool skip_peer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-peer") skip_peer = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "bench_bf16_gemm: unknown argument %s (usage: bench_bf16_gemm [--iters N] [--no-peer])\n",
                   a.c_str());
      return 2;
    }
  }
  set_num_threads(1);
  const std::string peer = skip_peer ? "" : bench::peer_script("torch_bf16_gemm.py");
  bench::print_environment("bench_bf16_gemm");
  const bool has_bf16 = cpu_has_avx512_bf16(), amx = cpu_has_amx_bf16() && bf16_gemm_info().rfind("amx", 0) == 0;
  std::printf("# bf16 GEMM: %s\n", bf16_gemm_info().c_str());
  double peak = -1, fpeak = -1, amx_peak = -1;
#ifdef BENCH_X86
  if (has_bf16) {
    peak = bf16_peak_gflops();
    fpeak = f32_peak_gflops();
    if (amx) amx_peak = amx_peak_gflops();
    std::printf("# core peak, 1 thread, in CPU time: bf16 %.0f GFLOP/s on AMX (tdpbf16ps loop, 4 tiles), %.0f GFLOP/s with "
                "AVX512_BF16 (vdpbf16ps zmm loop); float32 %.0f GFLOP/s (vfmadd231ps zmm loop)\n",
                amx_peak, peak, fpeak);
  }
#endif
  std::printf("ms per product, median [fastest, slowest] of 5 runs of %d products (1024^3: %d): wall clock, then "
              "this thread's CPU time (what the load of a shared machine does not inflate); GFLOP/s from the CPU "
              "time\n", iters * 4, iters);
  DeviceKernels& kern = kernels_for(Device::cpu());
  const std::vector<Shape3> shapes = {{"mm_1024", 1024, 1024, 1024, false, false},
                                      {"fwd_784", 128, 1024, 784, false, true},
                                      {"fwd_1024", 128, 1024, 1024, false, true},
                                      {"dw_784", 1024, 784, 128, true, false}};
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  for (const Shape3& s : shapes) {
    const std::int64_t ra = s.ta ? s.k : s.m, ca = s.ta ? s.m : s.k, rb = s.tb ? s.n : s.k, cb = s.tb ? s.k : s.n;
    std::vector<float> af(ra * ca), bf(rb * cb), cf(s.m * s.n);
    for (auto& x : af) x = nd(rng);
    for (auto& x : bf) x = nd(rng);
    std::vector<std::uint16_t> a16(af.size()), b16(bf.size()), c16(cf.size());
    for (std::size_t i = 0; i < af.size(); ++i) a16[i] = float_to_bf16(af[i]);
    for (std::size_t i = 0; i < bf.size(); ++i) b16[i] = float_to_bf16(bf[i]);
    const int n_iter = s.m * s.n * s.k >= (1 << 30) ? iters : iters * 4;
    const double flop = 2.0 * s.m * s.n * s.k;
    std::vector<double>* cpu_out = nullptr;  // where timed() puts the run's thread CPU time
    auto timed = [&](const std::function<void()>& fn) {  // ms per product, one run (wall clock)
      fn();
      const double c = thread_cpu_s(), t = bench::now_s();
      for (int i = 0; i < n_iter; ++i) fn();
      const double wall = (bench::now_s() - t) / n_iter * 1e3;
      if (cpu_out) cpu_out->push_back((thread_cpu_s() - c) / n_iter * 1e3);
      return wall;
    };
    auto bf16_call = [&] { kern.gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.f, a16.data(), ca, b16.data(), cb, 0.f, c16.data(), s.n, true); };
    auto f32_call = [&] { kern.gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, af.data(), ca, bf.data(), cb, 0.f, cf.data(), s.n); };
    std::vector<double> t_bf16, t_dp, t_f32, t_fb, c_bf16, c_dp, c_f32, c_fb;
    auto forced = [&](const char* path) {
      ::setenv("PHALANX_BF16_GEMM", path, 1);
      const double t = timed(bf16_call);
      ::unsetenv("PHALANX_BF16_GEMM");
      return t;
    };
    for (int r = 0; r < 5; ++r) {  // interleaved: a load that comes and goes hits every side
      cpu_out = &c_bf16;
      t_bf16.push_back(timed(bf16_call));  // auto: the best path this CPU has
      cpu_out = &c_dp;
      if (has_bf16) t_dp.push_back(forced("avx512bf16"));
      cpu_out = &c_f32;
      t_f32.push_back(timed(f32_call));
      cpu_out = &c_fb;
      t_fb.push_back(forced("fallback"));
    }
    cpu_out = nullptr;
    const bench::Summary ours = bench::summarise(t_bf16), dp = bench::summarise(t_dp), f32 = bench::summarise(t_f32),
                         fb = bench::summarise(t_fb);
    bench::Summary tb16, tf32, cb16, cf32;
    if (!skip_peer) {
      const std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + bench::python() + " " + peer + " " +
                              std::to_string(n_iter) + " " + s.name;
      auto peer_run = [&](const char* dt, bench::Summary& wall, bench::Summary& cpu) {
        int rc = 0;
        const std::string out = bench::capture(cmd + " " + dt, &rc);
        bench::relay_peer_environment(out);
        const auto v = [&](const char* key) { return bench::find_value(out, key) / 1e3; };  // us -> ms
        if (rc != 0 || v("step_us") < 0) {
          std::fprintf(stderr, "peer failed (%s %s):\n%s\n", cmd.c_str(), dt, out.c_str());
          return;
        }
        wall = {v("step_us"), v("min_us"), v("max_us"), 5};
        cpu = {v("cpu_us"), v("cpu_min_us"), v("cpu_max_us"), 5};
      };
      peer_run("bf16", tb16, cb16);
      peer_run("f32", tf32, cf32);
    }
    const bench::Summary cours = bench::summarise(c_bf16), cdp = bench::summarise(c_dp),
                         cf32_ours = bench::summarise(c_f32), cfb = bench::summarise(c_fb);
    auto gf = [&](const bench::Summary& x) { return x.ok() ? flop / (x.median * 1e-3) / 1e9 : 0.0; };
    std::printf("\n%s: C[%lld x %lld] = op(A) op(B), k = %lld%s%s\n", s.name, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), s.ta ? ", A^T" : "", s.tb ? ", B^T" : "");
    std::printf("  phalanx bf16 (%-10s)    %-26s %-26s %6.0f GFLOP/s", amx ? "amx" : has_bf16 ? "avx512bf16" : "fallback",
                bench::show(ours, "ms").c_str(), bench::show(cours, "ms").c_str(), gf(cours));
    if (amx && amx_peak > 0 && ours.ok()) std::printf("  = %.0f%% of the AMX bf16 peak", 100 * gf(cours) / amx_peak);
    else if (peak > 0 && ours.ok()) std::printf("  = %.0f%% of the vdpbf16ps peak", 100 * gf(cours) / peak);
    if (amx && has_bf16) {
      std::printf("\n  phalanx bf16 (avx512bf16)    %-26s %-26s %6.0f GFLOP/s", bench::show(dp, "ms").c_str(),
                  bench::show(cdp, "ms").c_str(), gf(cdp));
      if (peak > 0 && dp.ok()) std::printf("  = %.0f%% of the vdpbf16ps peak", 100 * gf(cdp) / peak);
    }
    std::printf("\n  phalanx bf16 fallback        %-26s %-26s %6.0f GFLOP/s\n", bench::show(fb, "ms").c_str(),
                bench::show(cfb, "ms").c_str(), gf(cfb));
    std::printf("  phalanx float32 GEMM         %-26s %-26s %6.0f GFLOP/s\n", bench::show(f32, "ms").c_str(),
                bench::show(cf32_ours, "ms").c_str(), gf(cf32_ours));
    std::printf("  torch 1.13 bf16              %-26s %-26s %6.0f GFLOP/s\n", bench::show(tb16, "ms").c_str(),
                bench::show(cb16, "ms").c_str(), gf(cb16));
    std::printf("  torch 1.13 float32           %-26s %-26s %6.0f GFLOP/s\n", bench::show(tf32, "ms").c_str(),
                bench::show(cf32, "ms").c_str(), gf(cf32));
    if (ours.ok() && f32.ok())
      std::printf("  bf16 speed-up over our float32: %.2fx wall, %.2fx CPU time%s\n", f32.median / ours.median,
                  cf32_ours.median / cours.median, std::string(s.name) == "mm_1024" ? " (bar: >= 1.7x)" : "");
    if (ours.ok() && tb16.ok())
      std::printf("  torch bf16 / phalanx bf16: %.2f wall, %.2f CPU time\n", tb16.median / ours.median,
                  cb16.median / cours.median);
    std::string bar = "-";
    if (std::string(s.name) == "mm_1024")
      bar = std::string("<= 0.59 (>= 1.7x): ") +
            (cours.ok() && cf32_ours.ok() && cours.median <= cf32_ours.median / 1.7 ? "met" : "NOT met");
    // The rows compare CPU times: on a shared machine they are what the load inflates least.
    bench::result_row("bench_bf16_gemm", std::string(s.name) + " bf16 vs our float32 GEMM, 1 thread, CPU time", cours,
                      "phalanx float32", cf32_ours, "ms", 1, bar);
    bench::result_row("bench_bf16_gemm", std::string(s.name) + " bf16 vs PyTorch bf16, 1 thread, CPU time", cours,
                      "torch 1.13 bf16", cb16, "ms", 1, "-");
    std::fflush(stdout);
  }
  bench::print_load_at_end();
  return 0;
}
