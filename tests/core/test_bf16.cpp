// bfloat16: conversions bit for bit against PyTorch 1.13, the CPU bf16 GEMM against a double
// reference on every path this CPU has (PHALANX_BF16_GEMM), and linear / matmul on bf16
// tensors (forward and gradients) against the float32 ops on the same values.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <phalanx/core/half.hpp>
#include <phalanx/core/kernels.hpp>
#include <phalanx/phalanx.hpp>

#include "support/bits_and_env.hpp"

using namespace phalanx;
using test::bits_of;
using test::float_of;

namespace {


Tensor bf16_tensor(const std::vector<std::uint16_t>& bits, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::BFloat16);
  REQUIRE(static_cast<std::size_t>(t.numel()) == bits.size());
  std::memcpy(t.raw_data(), bits.data(), bits.size() * 2);
  return t;
}
std::vector<std::uint16_t> bits16(const Tensor& t) {
  REQUIRE(t.dtype() == DType::BFloat16);
  std::vector<std::uint16_t> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.raw_data(), v.size() * 2);
  return v;
}
std::vector<float> as_floats(const Tensor& t) { return to_dtype(t, DType::Float32).to_vector<float>(); }

/// Random values already representable in bf16 (so float32 and bf16 products see the same inputs).
std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

/// Sets PHALANX_BF16_GEMM for the scope (restores unset).
struct GemmPath : test::ScopedEnv {
  explicit GemmPath(const char* v) : ScopedEnv("PHALANX_BF16_GEMM", v) {}
};
std::vector<const char*> paths() {
  std::vector<const char*> p = {"fallback"};
  if (cpu_has_avx512_bf16()) p.push_back("avx512bf16");
  if (cpu_has_amx_bf16()) p.push_back("amx");
  return p;
}

}  // namespace

TEST_CASE("float32 -> bfloat16 conversion is PyTorch 1.13's, bit for bit") {
  // (float32 bits, torch.from_numpy(x).bfloat16() bits), from PyTorch 1.13 on this CPU:
  // random bit patterns, then subnormals, the largest finite values (rounding to inf),
  // ties to even, negative zero's neighbourhood and NaNs (its tensor copy writes 0xFFFF).
  const std::vector<std::pair<std::uint32_t, std::uint16_t>> cases = {
      {0xf1e54a8bu, 0xf1e5}, {0xa00641a9u, 0xa006}, {0xaf266a95u, 0xaf26}, {0xe5afcdbcu, 0xe5b0},
      {0x940af962u, 0x940b}, {0xc693565fu, 0xc693}, {0xd56a2742u, 0xd56a}, {0x39a72dabu, 0x39a7},
      {0x0e375145u, 0x0e37}, {0x4cd7b299u, 0x4cd8}, {0x48fa2734u, 0x48fa}, {0xdfa132d7u, 0xdfa1},
      {0xe9a1ac70u, 0xe9a2}, {0x01591126u, 0x0159}, {0x7ff206ddu, 0xffff}, {0xd23c068fu, 0xd23c},
      {0x21a6195eu, 0x21a6}, {0xcc0cbdf9u, 0xcc0d}, {0x1e7c3921u, 0x1e7c}, {0x77ca95c7u, 0x77cb},
      {0xd103dc48u, 0xd104}, {0x4d93887au, 0x4d94}, {0x57735285u, 0x5773}, {0x4746e6a2u, 0x4747},
      {0x00000001u, 0x0000}, {0x00008000u, 0x0000}, {0x00018000u, 0x0002}, {0x007fffffu, 0x0080},
      {0x7f7fffffu, 0x7f80}, {0x7f7f8000u, 0x7f80}, {0xff7f8000u, 0xff80}, {0x3f808000u, 0x3f80},
      {0x3f818000u, 0x3f82}, {0x3f808001u, 0x3f81}, {0xbf818000u, 0xbf82}, {0x80008000u, 0x8000},
      {0x7f800001u, 0xffff}, {0xffffffffu, 0xffff}, {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
      {0x80000000u, 0x8000}, {0x7fc00000u, 0xffff}};
  // Repeated to 3 x 42 + 5 values: the vectorised body and its tail both see every case.
  std::vector<float> src;
  std::vector<std::uint16_t> want;
  for (int rep = 0; rep < 3; ++rep)
    for (const auto& [f, b] : cases) src.push_back(float_of(f)), want.push_back(b);
  for (int i = 0; i < 5; ++i) src.push_back(float_of(cases[i].first)), want.push_back(cases[i].second);
  const Tensor t = to_dtype(tensor(src, {static_cast<std::int64_t>(src.size())}), DType::BFloat16);
  const std::vector<std::uint16_t> got = bits16(t);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CAPTURE(bits_of(src[i]));
    CHECK(got[i] == want[i]);
    CHECK(float_to_bf16_convert(src[i]) == want[i]);
    // The scalar rule of PyTorch's bf16 arithmetic (c10's round_to_nearest_even) differs only on NaN.
    CHECK(float_to_bf16(src[i]) == (std::isnan(src[i]) ? 0x7fc0 : want[i]));
  }
  // And back: widening is exact.
  const std::vector<float> back = as_floats(t);
  for (std::size_t i = 0; i < back.size(); ++i)
    if (!std::isnan(src[i])) CHECK(bits_of(back[i]) == static_cast<std::uint32_t>(want[i]) << 16);
}

TEST_CASE("the vectorised conversion equals the scalar rule on random bits") {
  std::mt19937 rng(11);
  std::vector<float> src(100003);
  for (auto& f : src) f = float_of(static_cast<std::uint32_t>(rng()));
  const std::vector<std::uint16_t> got = bits16(to_dtype(tensor(src, {static_cast<std::int64_t>(src.size())}),
                                                         DType::BFloat16));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < src.size(); ++i) bad += got[i] != float_to_bf16_convert(src[i]);
  CHECK(bad == 0);
}

TEST_CASE("bf16 GEMM against a double reference: trans flags, odd sizes, alpha/beta, every path") {
  const std::vector<std::array<std::int64_t, 3>> sizes = {{1, 1, 1}, {7, 13, 5}, {8, 32, 2}, {33, 47, 65},
                                                          {9, 70, 31}, {64, 64, 64}, {100, 37, 129}, {40, 33, 600}};
  DeviceKernels& kern = kernels_for(Device::cpu());
  for (const char* path : paths()) {
    GemmPath env(path);
    const std::string path_name = path;
    CAPTURE(path_name);
    for (const auto& [m, n, k] : sizes)
      for (int flags = 0; flags < 4; ++flags)
        for (int out_bf16 = 0; out_bf16 < 2; ++out_bf16)
          for (const auto& [alpha, beta] : std::vector<std::pair<float, float>>{{1.f, 0.f}, {1.5f, 0.5f}, {-1.f, 1.f}}) {
            const bool ta = flags & 1, tb = flags & 2;
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(ta);
            CAPTURE(tb);
            CAPTURE(out_bf16);
            CAPTURE(alpha);
            CAPTURE(beta);
            std::mt19937 rng(static_cast<unsigned>(m * 1000 + n * 10 + k + flags));
            // Padded leading dimensions: the kernel must honour lda/ldb/ldc.
            const std::int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            const std::vector<std::uint16_t> a = random_bf16(static_cast<std::size_t>((ta ? k : m) * lda), rng);
            const std::vector<std::uint16_t> b = random_bf16(static_cast<std::size_t>((tb ? n : k) * ldb), rng);
            const std::vector<std::uint16_t> c0 = random_bf16(static_cast<std::size_t>(m * ldc), rng);
            std::vector<float> cf(c0.size());
            for (std::size_t i = 0; i < c0.size(); ++i) cf[i] = bf16_to_float(c0[i]);
            std::vector<std::uint16_t> cb = c0;
            if (out_bf16)
              kern.gemm_bf16(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, cb.data(), ldc, true);
            else
              kern.gemm_bf16(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, cf.data(), ldc, false);
            int bad = 0;
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                double s = 0, mag = 0;
                for (std::int64_t p = 0; p < k; ++p) {
                  const double x = bf16_to_float(ta ? a[p * lda + i] : a[i * lda + p]);
                  const double y = bf16_to_float(tb ? b[j * ldb + p] : b[p * ldb + j]);
                  s += x * y;
                  mag += std::fabs(x * y);
                }
                const double old = bf16_to_float(c0[i * ldc + j]);
                const double want = alpha * s + beta * old;
                const double scale = std::fabs(alpha) * mag + std::fabs(beta * old);
                const double got = out_bf16 ? bf16_to_float(cb[i * ldc + j]) : cf[i * ldc + j];
                // float32 sums: a few ulps of the magnitudes; bf16 store: half a bf16 ulp more.
                const double tol = 1e-5 * scale + (out_bf16 ? std::fabs(want) * (1.0 / 256) : 0.0) + 1e-30;
                bad += !(std::fabs(got - want) <= tol);
              }
            CHECK(bad == 0);
            // Padding columns of C are never written.
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = n; j < ldc; ++j) {
                if (out_bf16) CHECK(cb[i * ldc + j] == c0[i * ldc + j]);
                else CHECK(cf[i * ldc + j] == bf16_to_float(c0[i * ldc + j]));
              }
          }
  }
}

TEST_CASE("bf16 GEMM paths agree: the bf16 store rounds the same float32 sum") {
  std::mt19937 rng(5);
  const std::int64_t m = 37, n = 45, k = 64;
  // Small integers: every product and partial sum is exact in float32, so both paths agree bit for bit.
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<std::uint16_t> a(m * k), b(k * n);
  for (auto& x : a) x = float_to_bf16(static_cast<float>(d(rng)));
  for (auto& x : b) x = float_to_bf16(static_cast<float>(d(rng)));
  std::vector<std::uint16_t> c1(m * n);
  {
    GemmPath env("fallback");
    kernels_for(Device::cpu()).gemm_bf16(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c1.data(), n, true);
  }
  for (const char* path : paths()) {
    CAPTURE(std::string(path));
    std::vector<std::uint16_t> c2(m * n);
    GemmPath env(path);
    kernels_for(Device::cpu()).gemm_bf16(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c2.data(), n, true);
    CHECK(c1 == c2);
  }
}

TEST_CASE("PHALANX_BF16_GEMM is read strictly") {
  std::vector<std::uint16_t> a(4, 0x3f80), c(4, 0);
  GemmPath env("fast");
  try {
    kernels_for(Device::cpu()).gemm_bf16(false, false, 2, 2, 2, 1.f, a.data(), 2, a.data(), 2, 0.f, c.data(), 2, true);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    CHECK(w.find("PHALANX_BF16_GEMM") != std::string::npos);
    CHECK(w.find("fast") != std::string::npos);
  }
  CHECK_THROWS_AS(bf16_gemm_info(), ConfigError);
}

namespace {
/// The float32 op on the same values, rounded to bf16 at the end: what a bf16 op must give
/// within one bf16 rounding (its float32 sums may be ordered differently).
void check_close_bf16(const Tensor& got_bf16, const Tensor& want_f32, double rel = 1.0 / 128) {
  REQUIRE(got_bf16.dtype() == DType::BFloat16);
  REQUIRE(got_bf16.shape() == want_f32.shape());
  const std::vector<float> g = as_floats(got_bf16), w = want_f32.to_vector<float>();
  double maxabs = 0;
  for (float x : w) maxabs = std::max(maxabs, std::fabs(static_cast<double>(x)));
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    bad += !(std::fabs(g[i] - w[i]) <= rel * std::fabs(w[i]) + 1e-3 * maxabs);
  CHECK(bad == 0);
}
Tensor rand_bf16(const Shape& s, std::mt19937& rng) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return bf16_tensor(random_bf16(static_cast<std::size_t>(n), rng), s);
}
}  // namespace

TEST_CASE("linear and matmul on bf16 tensors: bf16 results, gradients as float32's within bf16 rounding") {
  for (const char* path : paths()) {
    GemmPath env(path);
    const std::string path_name = path;
    CAPTURE(path_name);
    std::mt19937 rng(3);
    // linear with and without bias, on a 3-D input
    for (bool with_bias : {false, true}) {
      const Tensor x = rand_bf16({3, 5, 24}, rng), w = rand_bf16({17, 24}, rng), b = rand_bf16({17}, rng);
      const Tensor gy = rand_bf16({3, 5, 17}, rng);
      Tensor xb = x.clone().requires_grad_(), wb = w.clone().requires_grad_(), bb = b.clone().requires_grad_();
      Tensor xf = to_dtype(x, DType::Float32).requires_grad_(), wf = to_dtype(w, DType::Float32).requires_grad_(),
             bf = to_dtype(b, DType::Float32).requires_grad_();
      const Tensor yb = linear(xb, wb, with_bias ? bb : Tensor());
      const Tensor yf = linear(xf, wf, with_bias ? bf : Tensor());
      CHECK(yb.dtype() == DType::BFloat16);
      check_close_bf16(yb, yf);
      yb.backward(gy);
      yf.backward(to_dtype(gy, DType::Float32));
      REQUIRE(xb.grad().defined());
      CHECK(xb.grad().dtype() == DType::BFloat16);
      CHECK(wb.grad().dtype() == DType::BFloat16);
      check_close_bf16(xb.grad(), xf.grad());
      check_close_bf16(wb.grad(), wf.grad());
      if (with_bias) check_close_bf16(bb.grad(), bf.grad());
    }
    // matmul: 2-D, 1-D operands, batched with broadcast on either side, folded
    const std::vector<std::pair<Shape, Shape>> shapes = {{{6, 9}, {9, 35}}, {{9}, {9, 4}},    {{5, 9}, {9}},
                                                         {{2, 3, 6, 9}, {3, 9, 4}},      {{3, 6, 9}, {1, 9, 5}},
                                                         {{4, 6, 9}, {9, 7}},             {{6, 9}, {2, 9, 3}}};
    for (const auto& [sa, sb] : shapes) {
      CAPTURE(shape_str(sa));
      CAPTURE(shape_str(sb));
      const Tensor a = rand_bf16(sa, rng), b = rand_bf16(sb, rng);
      Tensor ab = a.clone().requires_grad_(), bb = b.clone().requires_grad_();
      Tensor af = to_dtype(a, DType::Float32).requires_grad_(), bf = to_dtype(b, DType::Float32).requires_grad_();
      const Tensor yb = matmul(ab, bb), yf = matmul(af, bf);
      check_close_bf16(yb, yf);
      const Tensor gy = rand_bf16(yf.shape(), rng);
      yb.backward(gy);
      yf.backward(to_dtype(gy, DType::Float32));
      check_close_bf16(ab.grad(), af.grad());
      check_close_bf16(bb.grad(), bf.grad());
    }
  }
}

TEST_CASE("bf16 linear: a gradient summed from two uses stays bf16") {
  std::mt19937 rng(9);
  const Tensor x = rand_bf16({4, 8}, rng), w = rand_bf16({8, 8}, rng);
  Tensor wb = w.clone().requires_grad_();
  Tensor wf = to_dtype(w, DType::Float32).requires_grad_();
  const Tensor yb = linear(linear(x, wb, Tensor()), wb, Tensor());
  const Tensor yf = linear(linear(to_dtype(x, DType::Float32), wf, Tensor()), wf, Tensor());
  const Tensor gy = rand_bf16({4, 8}, rng);
  yb.backward(gy);
  yf.backward(to_dtype(gy, DType::Float32));
  check_close_bf16(wb.grad(), wf.grad(), 1.0 / 64);
}

TEST_CASE("a float32 / bfloat16 pair is a one-line TypeError that says to cast") {
  const Tensor a = ones({2, 3}), b = to_dtype(ones({3, 2}), DType::BFloat16);
  for (int which = 0; which < 3; ++which) {
    try {
      if (which == 0) matmul(a, b);
      else if (which == 1) linear(to_dtype(ones({2, 2}), DType::BFloat16), ones({3, 2}), Tensor());
      else linear(to_dtype(ones({2, 2}), DType::BFloat16), to_dtype(ones({3, 2}), DType::BFloat16), ones({3}));
      FAIL("expected a TypeError");
    } catch (const TypeError& e) {
      const std::string w = e.what();
      CAPTURE(w);
      CHECK(w.find("to_dtype") != std::string::npos);
      CHECK(w.find("bfloat16") != std::string::npos);
      CHECK(w.find('\n') == std::string::npos);
    }
  }
  CHECK_THROWS_AS(matmul(to_dtype(ones({2, 3}), DType::Float16), to_dtype(ones({3, 2}), DType::Float16)), TypeError);
}

namespace {
Tensor fixture_bf16(const TensorMap& f, const std::string& key) {
  const Tensor& t = f.at(key);  // bf16 bit patterns stored as int32 (read as int64)
  const std::vector<std::int64_t> v = t.to_vector<std::int64_t>();
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = static_cast<std::uint16_t>(v[i]);
  return bf16_tensor(b, t.shape());
}
/// (bit-equal elements, elements, largest difference in bf16 ulps of the wanted value).
struct Compare {
  std::size_t equal = 0, total = 0;
  double max_ulps = 0;
};
Compare compare(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<std::uint16_t> g = bits16(got), w = bits16(want);
  Compare c;
  for (std::size_t i = 0; i < g.size(); ++i) {
    ++c.total;
    c.equal += g[i] == w[i];
    const double wf = bf16_to_float(w[i]), gf = bf16_to_float(g[i]);
    int e = 0;
    std::frexp(wf, &e);
    const double ulp = std::ldexp(1.0, e - 8);  // bf16: 8 significant bits
    c.max_ulps = std::max(c.max_ulps, std::fabs(gf - wf) / ulp);
  }
  return c;
}
}  // namespace

TEST_CASE("bf16 mm and linear against PyTorch 1.13 (fixtures/bf16_matmul_parity.npz)") {
  const TensorMap f = load_npz(std::string(PHALANX_FIXTURES) + "/bf16_matmul_parity.npz");
  for (const char* path : paths()) {
    GemmPath env(path);
    const std::string path_name = path;
    std::string report;  // per output: "=" when bit-equal to PyTorch, else equal/total and the largest gap
    for (const char* name : {"mm_small", "mm", "mm_odd", "mm_exact", "linear", "linear_bias", "linear_bias_exact"}) {
      const std::string n = name;
      CAPTURE(path_name);
      CAPTURE(n);
      const bool is_mm = n.rfind("mm", 0) == 0, exact = n.find("exact") != std::string::npos;
      Tensor a = fixture_bf16(f, n + ".a").requires_grad_(), b = fixture_bf16(f, n + ".b").requires_grad_();
      Tensor bias = f.contains(n + ".bias") ? fixture_bf16(f, n + ".bias").requires_grad_() : Tensor();
      const Tensor y = is_mm ? matmul(a, b) : linear(a, b, bias);
      y.backward(fixture_bf16(f, n + ".gout"));
      std::vector<std::pair<Tensor, std::string>> outs = {{y, ".out"}, {a.grad(), ".ga"}, {b.grad(), ".gb"}};
      if (bias.defined()) outs.push_back({bias.grad(), ".gbias"});
      const bool onednn = f.at(n + ".onednn").item_int() != 0;
      // What float32 sums rounded once give (our own float32 ops on the same values): the
      // reference where PyTorch used its plain loop, which rounds every product and every
      // partial sum to bf16 (scripts/fixtures/bf16_matmul.py's cases show it; docs/mixed_precision.md).
      Tensor af = to_dtype(a.detach(), DType::Float32), bf = to_dtype(b.detach(), DType::Float32);
      const Tensor gout = to_dtype(fixture_bf16(f, n + ".gout"), DType::Float32);
      std::map<std::string, Tensor> f32 = {
          {".out", is_mm ? matmul(af, bf) : linear(af, bf, bias.defined() ? to_dtype(bias.detach(), DType::Float32) : Tensor())},
          {".ga", is_mm ? matmul(gout, transpose(bf, 0, 1)) : matmul(gout, bf)},
          {".gb", is_mm ? matmul(transpose(af, 0, 1), gout) : matmul(transpose(gout, 0, 1), af)}};
      for (const auto& [got, key] : outs) {
        CAPTURE(key);
        const Compare c = compare(got, fixture_bf16(f, n + key));
        report += " " + n + key + (c.equal == c.total ? " =" : " " + std::to_string(c.equal) + "/" +
                                   std::to_string(c.total) + " (max " + std::to_string(c.max_ulps) + " ulp" +
                                   (onednn ? "" : ", PyTorch's plain loop") + ")");
        if (exact) {  // exact sums: one rounding on both sides, so every bit agrees
          CHECK(c.equal == c.total);
        } else if (onednn) {  // float32 sums in another order may move a rounding by one ulp
          CHECK(c.max_ulps <= 1.0);
        } else if (f32.count(key)) {
          const Compare r = compare(got, to_dtype(f32.at(key), DType::BFloat16));
          CHECK(r.max_ulps <= 1.0);
        }
      }
    }
    MESSAGE(path_name << " vs PyTorch 1.13:" << report);
  }
}

// ---- the native bf16 kernels (cpu/bf16_elementwise.hpp) against the float32 path ----

namespace {

/// Sets PHALANX_BF16_SIMD for the scope (restores unset).
struct Bf16Simd : test::ScopedEnv {
  explicit Bf16Simd(const char* v) : ScopedEnv("PHALANX_BF16_SIMD", v) {}
};
// No AVX-512 variant of these kernels (bf16_elementwise.cpp): "avx512" is accepted as a cap and
// runs the AVX2 code, so it is one more spelling of the AVX2 row here, not a third path.
const char* const kSimdLevels[] = {"scalar", "avx2", "avx512"};

/// Random bf16 patterns with the special ones mixed in: +-0, +-inf, NaNs (quiet, signalling,
/// negative), subnormals, the largest finite values.
std::vector<std::uint16_t> random_bits16(std::size_t n, std::mt19937& rng) {
  static const std::uint16_t special[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF,
                                          0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80};
  std::uniform_int_distribution<int> any(0, 0xFFFF), pick(0, 14), coin(0, 3);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = static_cast<std::uint16_t>(coin(rng) == 0 ? special[pick(rng)] : any(rng));
  return v;
}

/// relu through the float32 kernel: widen, relu, round once (the in_float32 path).
Tensor relu_via_float32(const Tensor& x_bf16) { return to_dtype(relu(to_dtype(x_bf16, DType::Float32)), DType::BFloat16); }

/// A float32 gradient handed to op's bf16 output: the same bits as the float32 backward
/// (`via_float32`: widen, the float32 op, round) rounded once.
void check_float32_grad_into_bf16(Tensor (*via_float32)(const Tensor&), Tensor (*op)(const Tensor&),
                                  const std::vector<std::uint16_t>& x, std::int64_t n) {
  const Tensor g32 = randn({n});
  Tensor a = bf16_tensor(x, {n}), b = bf16_tensor(x, {n});
  a.requires_grad_();
  b.requires_grad_();
  via_float32(a).backward(g32);
  op(b).backward(g32);
  CHECK(bits16(b.grad()) == bits16(a.grad()));
}

/// One autograd node on the bf16 values, not the op between two float32 casts.
void check_one_bf16_node(Tensor (*op)(const Tensor&)) {
  Tensor x = to_dtype(randn({8}), DType::BFloat16);
  x.requires_grad_();
  const Tensor y = op(x);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name()) == "UnaryBackward");
}

}  // namespace

TEST_CASE("bf16 relu forward: the float32 kernel's bits rounded once, every SIMD level, odd sizes") {
  std::mt19937 rng(11);
  for (std::int64_t n : {1, 7, 15, 16, 17, 31, 33, 64, 1000, 4099}) {
    const std::vector<std::uint16_t> x = random_bits16(static_cast<std::size_t>(n), rng);
    const Tensor xt = bf16_tensor(x, {n});
    const std::vector<std::uint16_t> want = bits16(relu_via_float32(xt));
    for (const char* level : kSimdLevels) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      const Tensor y = relu(xt);
      CHECK(y.dtype() == DType::BFloat16);
      CHECK(bits16(y) == want);
    }
  }
  // The rules spelled out: +0 for x <= 0 (-0 too), x for x > 0 (inf, subnormals), 0xFFFF for any NaN.
  const Tensor y = relu(bf16_tensor({0x8000, 0x0000, 0xBF80, 0x3F80, 0x0001, 0x7F80, 0xFF80, 0x7FC1, 0xFFC0}, {9}));
  CHECK(bits16(y) == std::vector<std::uint16_t>{0, 0, 0, 0x3F80, 0x0001, 0x7F80, 0, 0xFFFF, 0xFFFF});
}

TEST_CASE("bf16 relu backward: the float32 backward's bits, bf16 and float32 incoming gradients") {
  std::mt19937 rng(12);
  for (std::int64_t n : {1, 5, 16, 33, 257, 3001}) {
    const std::vector<std::uint16_t> x = random_bits16(static_cast<std::size_t>(n), rng),
                                     g = random_bits16(static_cast<std::size_t>(n), rng);
    const Tensor gt = bf16_tensor(g, {n});
    // The float32 path: the casts are differentiable, so the gradient is relu's float32 backward
    // between two conversions.
    Tensor x_ref = bf16_tensor(x, {n});
    x_ref.requires_grad_();
    relu_via_float32(x_ref).backward(gt);
    const std::vector<std::uint16_t> want = bits16(x_ref.grad());
    for (const char* level : kSimdLevels) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      Tensor xn = bf16_tensor(x, {n});
      xn.requires_grad_();
      relu(xn).backward(gt);
      CHECK(bits16(xn.grad()) == want);
    }
    check_float32_grad_into_bf16(relu_via_float32, relu, x, n);
  }
  check_one_bf16_node(relu);
}

TEST_CASE("bf16 relu: gradient by finite differences") {
  std::mt19937 rng(13);
  // Values at least 2^-3 from 0 with a step of 2^-6: x +- h is exact in float32 and keeps x's side.
  std::vector<std::uint16_t> xs = random_bf16(61, rng);
  for (auto& u : xs)
    if (std::fabs(bf16_to_float(u)) < 0.125f) u = float_to_bf16(bf16_to_float(u) < 0 ? -0.5f : 0.5f);
  Tensor x = bf16_tensor(xs, {61});
  x.requires_grad_();
  const std::vector<std::uint16_t> ws = random_bf16(61, rng);
  const Tensor w = bf16_tensor(ws, {61});
  sum(mul(relu(x), w)).backward();  // d/dx sum(w * relu(x)) = w where x > 0
  const std::vector<float> grad = as_floats(x.grad());
  const double h = 1.0 / 64;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    auto f = [&](double xi) {  // sum(w * relu(x)) in double with element i moved
      double s = 0;
      for (std::size_t j = 0; j < xs.size(); ++j) {
        const double v = j == i ? xi : bf16_to_float(xs[j]);
        s += static_cast<double>(bf16_to_float(ws[j])) * (v > 0 ? v : 0);
      }
      return s;
    };
    const double x0 = bf16_to_float(xs[i]);
    const double fd = (f(x0 + h) - f(x0 - h)) / (2 * h);
    CAPTURE(i);
    CHECK(grad[i] == doctest::Approx(fd).epsilon(1e-6));
  }
  // and the op itself evaluated in bf16 at x +- h: its difference quotient agrees with the gradient
  Bf16Simd env("avx2");
  for (std::size_t i = 0; i < xs.size(); i += 7) {
    std::vector<std::uint16_t> p = xs, m = xs;
    p[i] = float_to_bf16(bf16_to_float(xs[i]) + 0.0625f);
    m[i] = float_to_bf16(bf16_to_float(xs[i]) - 0.0625f);
    if (p[i] == m[i]) continue;
    const double dp = as_floats(relu(bf16_tensor(p, {61})))[i], dm = as_floats(relu(bf16_tensor(m, {61})))[i];
    const double fd = (dp - dm) / (bf16_to_float(p[i]) - bf16_to_float(m[i]));
    CAPTURE(i);
    CHECK(fd == doctest::Approx(bf16_to_float(xs[i]) > 0 ? 1.0 : 0.0));
  }
}

namespace {
/// gelu through the float32 kernel: widen, gelu, round once (the in_float32 path).
Tensor gelu_via_float32(const Tensor& x_bf16) { return to_dtype(gelu(to_dtype(x_bf16, DType::Float32)), DType::BFloat16); }
}  // namespace

TEST_CASE("bf16 gelu forward: the float32 kernel's bits rounded once, every SIMD level, odd sizes") {
  std::mt19937 rng(21);
  for (std::int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1000, 4099}) {
    std::vector<std::uint16_t> x = random_bits16(static_cast<std::size_t>(n), rng);
    // and values where GELU is not flat (|x| < 6, both erf ranges, exp near its underflow)
    const std::vector<std::uint16_t> mid = random_bf16(static_cast<std::size_t>(n), rng, 3.f);
    for (std::size_t i = 0; i < x.size(); i += 2) x[i] = mid[i];
    const Tensor xt = bf16_tensor(x, {n});
    const std::vector<std::uint16_t> want = bits16(gelu_via_float32(xt));
    for (const char* level : kSimdLevels) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      const Tensor y = gelu(xt);
      CHECK(y.dtype() == DType::BFloat16);
      CHECK(bits16(y) == want);
      Tensor in_place = bf16_tensor(x, {n});  // the kernel with o == x
      kernels_for(Device::cpu()).unary(UnaryOp::Gelu, in_place, in_place);
      CHECK(bits16(in_place) == want);
    }
  }
  // NaN written 0xFFFF, +inf -> +inf, +-0 -> +-0; -inf and the subnormals: whatever the
  // float32 kernel gives, rounded once.
  const Tensor sp = bf16_tensor({0x7FC1, 0xFFC0, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8001}, {8});
  const std::vector<std::uint16_t> got = bits16(gelu(sp));
  CHECK(got == bits16(gelu_via_float32(sp)));
  CHECK(got[0] == 0xFFFF);
  CHECK(got[1] == 0xFFFF);
  CHECK(got[2] == 0x7F80);
  CHECK(got[4] == 0x0000);
  CHECK(got[5] == 0x8000);
}

TEST_CASE("bf16 gelu backward: the float32 backward's bits, bf16 and float32 incoming gradients") {
  std::mt19937 rng(22);
  for (std::int64_t n : {1, 5, 8, 16, 33, 257, 3001}) {
    std::vector<std::uint16_t> x = random_bits16(static_cast<std::size_t>(n), rng),
                               g = random_bits16(static_cast<std::size_t>(n), rng);
    const std::vector<std::uint16_t> mx = random_bf16(static_cast<std::size_t>(n), rng, 3.f),
                                     mg = random_bf16(static_cast<std::size_t>(n), rng);
    for (std::size_t i = 0; i < x.size(); i += 2) x[i] = mx[i], g[i] = mg[i];
    const Tensor gt = bf16_tensor(g, {n});
    Tensor x_ref = bf16_tensor(x, {n});
    x_ref.requires_grad_();
    gelu_via_float32(x_ref).backward(gt);
    const std::vector<std::uint16_t> want = bits16(x_ref.grad());
    for (const char* level : kSimdLevels) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      Tensor xn = bf16_tensor(x, {n});
      xn.requires_grad_();
      gelu(xn).backward(gt);
      REQUIRE(xn.grad().dtype() == DType::BFloat16);
      CHECK(bits16(xn.grad()) == want);
    }
    check_float32_grad_into_bf16(gelu_via_float32, gelu, x, n);
  }
  check_one_bf16_node(gelu);
}

TEST_CASE("bf16 gelu: gradient by finite differences") {
  std::mt19937 rng(23);
  const std::vector<std::uint16_t> xs = random_bf16(61, rng, 2.f), ws = random_bf16(61, rng);
  Tensor x = bf16_tensor(xs, {61});
  x.requires_grad_();
  const Tensor w = bf16_tensor(ws, {61});
  sum(mul(gelu(x), w)).backward();
  const std::vector<float> grad = as_floats(x.grad());
  const auto gelu_d = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
  const double h = 1e-4;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double x0 = bf16_to_float(xs[i]), wi = bf16_to_float(ws[i]);
    const double fd = wi * (gelu_d(x0 + h) - gelu_d(x0 - h)) / (2 * h);
    CAPTURE(i);
    CAPTURE(x0);
    // the product w * gelu'(x) is rounded to bf16 once (8 significant bits): 2^-8 relative
    CHECK(std::fabs(grad[i] - fd) <= std::ldexp(std::fabs(fd), -8) + 1e-6);
  }
}

TEST_CASE("float32 + bf16 add: the float32 add on the widened values, every SIMD level; b's gradient rounded once") {
  std::mt19937 rng(24);
  for (std::int64_t n : {1, 7, 8, 9, 16, 17, 33, 1000, 4099}) {
    const std::vector<std::uint16_t> b = random_bits16(static_cast<std::size_t>(n), rng);
    std::vector<float> av = randn({n}).to_vector<float>();
    av[0] = std::numeric_limits<float>::quiet_NaN();
    if (n > 2) av[1] = std::numeric_limits<float>::infinity(), av[2] = -0.f;
    const Tensor a = tensor(av, {n});
    const std::vector<float> want = add(a, to_dtype(bf16_tensor(b, {n}), DType::Float32)).to_vector<float>();
    for (const char* level : kSimdLevels) {
      CAPTURE(n);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      const Tensor y = add(a, bf16_tensor(b, {n}));
      REQUIRE(y.dtype() == DType::Float32);
      const std::vector<float> got = y.to_vector<float>();
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
  }
  // Gradients: a's is g, b's is g rounded to bf16 once (the cast's backward before), one node.
  const std::int64_t n = 257;
  const Tensor g = randn({n});
  Tensor a1 = randn({n}).requires_grad_(), a2 = a1.detach().clone().requires_grad_();
  Tensor b1 = bf16_tensor(random_bf16(n, rng), {n}).requires_grad_(), b2 = b1.detach().clone().requires_grad_();
  const Tensor y1 = add(a1, b1);
  REQUIRE(y1.grad_fn() != nullptr);
  CHECK(std::string(y1.grad_fn()->name()) == "BinaryBackward");
  y1.backward(g);
  add(a2, to_dtype(b2, DType::Float32)).backward(g);
  REQUIRE(b1.grad().dtype() == DType::BFloat16);
  CHECK(bits16(b1.grad()) == bits16(b2.grad()));
  CHECK(bits16(b1.grad()) == bits16(to_dtype(g, DType::BFloat16)));
  CHECK(a1.grad().to_vector<float>() == g.to_vector<float>());
  // The kernel table takes the bf16 b itself (no float32 copy), for a same-shape add only.
  Tensor out = Tensor::empty({n}, DType::Float32);
  kernels_for(Device::cpu()).binary(BinaryOp::Add, a1.detach(), b1.detach(), out);
  CHECK(out.to_vector<float>() == add(a1.detach(), to_dtype(b1.detach(), DType::Float32)).to_vector<float>());
  CHECK_THROWS_AS(kernels_for(Device::cpu()).binary(BinaryOp::Mul, a1.detach(), b1.detach(), out), Error);
  // bf16 + float32, and broadcast shapes, keep the promotion path (float32 results)
  CHECK(add(b1.detach(), a1.detach()).dtype() == DType::Float32);
  CHECK(add(randn({4, n}), b1.detach()).dtype() == DType::Float32);
}

TEST_CASE("bf16 linear bias gradient: column sums read bf16, the float32 sums' bits, every SIMD level") {
  std::mt19937 rng(14);
  for (auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 17}, {128, 10}, {37, 1025}}) {
    const std::vector<std::uint16_t> g = random_bf16(static_cast<std::size_t>(rows * cols), rng, 3.f);
    // float32 sums added row by row, rounded once
    std::vector<float> acc(static_cast<std::size_t>(cols), 0.f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j) acc[j] += bf16_to_float(g[r * cols + j]);
    std::vector<std::uint16_t> want(acc.size());
    for (std::size_t j = 0; j < acc.size(); ++j) want[j] = float_to_bf16(acc[j]);
    for (const char* level : kSimdLevels) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(std::string(level));
      Bf16Simd env(level);
      Tensor x = to_dtype(randn({rows, 4}), DType::BFloat16), w = to_dtype(randn({cols, 4}), DType::BFloat16),
             b = to_dtype(randn({cols}), DType::BFloat16);
      b.requires_grad_();
      linear(x, w, b).backward(bf16_tensor(g, {rows, cols}));
      CHECK(bits16(b.grad()) == want);
      // the kernel alone: the float32 column sums of the widened values
      Tensor s = Tensor::empty({cols}, DType::Float32);
      kernels_for(Device::cpu()).sum_to_period(bf16_tensor(g, {rows, cols}), s, 1.f);
      CHECK(s.to_vector<float>() == acc);
    }
  }
}

TEST_CASE("PHALANX_BF16_SIMD is read strictly") {
  Bf16Simd env("avx1024");
  CHECK_THROWS_AS(relu(to_dtype(randn({4}), DType::BFloat16)), ConfigError);
}

TEST_CASE("bf16 GEMM fallback: the vectorised bf16 store is the scalar rounding rule, beta 0 and not") {
  std::mt19937 rng(15);
  GemmPath env("fallback");
  for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{1, 1, 1}, {3, 17, 5}, {33, 65, 31}}) {
    std::vector<std::uint16_t> a = random_bf16(static_cast<std::size_t>(m * k), rng),
                               b = random_bf16(static_cast<std::size_t>(k * n), rng),
                               c0 = random_bf16(static_cast<std::size_t>(m * n), rng);
    a[0] = 0x7FC1;  // a NaN row: C's first row is NaN, written 0x7FC0 (float_to_bf16)
    if (m * n > 4) c0[4] = 0xFF81;
    std::vector<float> sum(static_cast<std::size_t>(m * n));
    kernels_for(Device::cpu()).gemm_bf16(false, true, m, n, k, 0.75f, a.data(), k, b.data(), k, 0.f, sum.data(), n, false);
    for (float beta : {0.f, 1.f, -0.5f}) {
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(beta);
      std::vector<std::uint16_t> c = c0, want(c0.size());
      for (std::size_t i = 0; i < c.size(); ++i)
        want[i] = float_to_bf16(beta == 0.f ? sum[i] : sum[i] + beta * bf16_to_float(c0[i]));
      kernels_for(Device::cpu()).gemm_bf16(false, true, m, n, k, 0.75f, a.data(), k, b.data(), k, beta, c.data(), n, true);
      CHECK(c == want);
    }
  }
}

TEST_CASE("kernel checks: bf16 reaches the CPU table for relu and bias sums only, dtypes matched") {
  DeviceKernels& k = kernels_for(Device::cpu());
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const Tensor xb = to_dtype(randn({6}), DType::BFloat16);
  Tensor out32 = Tensor::empty({6}), outb = Tensor::empty({6}, DType::BFloat16);
  CHECK(message([&] { k.unary(UnaryOp::Relu, xb, outb); }).empty());
  CHECK(message([&] { k.unary(UnaryOp::Relu, xb, out32); }).find("'out' is float32, expected bfloat16") != std::string::npos);
  CHECK(message([&] { k.unary(UnaryOp::Exp, xb, outb); }).find("'x' is bfloat16, expected float32") != std::string::npos);
  Tensor gx = Tensor::empty({6}, DType::BFloat16);
  CHECK(message([&] { k.unary_backward(UnaryOp::Relu, xb, Tensor(), Tensor(), gx); })
            .find("needs y in bfloat16") != std::string::npos);
  Tensor sums = Tensor::empty({3}), sums_b = Tensor::empty({3}, DType::BFloat16);
  CHECK(message([&] { k.sum_to_period(xb, sums, 1.f); }).empty());
  CHECK(message([&] { k.sum_to_period(xb, sums_b, 1.f); }).find("'out' is bfloat16, expected float32") != std::string::npos);
}

TEST_CASE("bf16 relu: in place through the kernel table (o == x, o == g) gives the out-of-place bits") {
  std::mt19937 rng(16);
  DeviceKernels& k = kernels_for(Device::cpu());
  for (const char* level : {"scalar", "avx2"}) {
    CAPTURE(std::string(level));
    Bf16Simd env(level);
    const std::int64_t n = 1037;
    const std::vector<std::uint16_t> xs = random_bits16(n, rng), gs = random_bits16(n, rng);
    Tensor x = bf16_tensor(xs, {n}), y = Tensor::empty({n}, DType::BFloat16);
    k.unary(UnaryOp::Relu, x, y);
    Tensor xi = bf16_tensor(xs, {n});
    k.unary(UnaryOp::Relu, xi, xi);
    CHECK(bits16(xi) == bits16(y));
    Tensor g = bf16_tensor(gs, {n}), gx = Tensor::empty({n}, DType::BFloat16);
    k.unary_backward(UnaryOp::Relu, g, Tensor(), y, gx);
    Tensor gi = bf16_tensor(gs, {n});
    k.unary_backward(UnaryOp::Relu, gi, Tensor(), y, gi);
    CHECK(bits16(gi) == bits16(gx));
  }
}

TEST_CASE("relu of an undefined tensor names the op, float32 or not") {
  // The native bf16 branch read x.dtype() first: "dtype(): the tensor is undefined".
  CHECK_THROWS_WITH_AS(relu(Tensor()), doctest::Contains("relu: argument 'input' is undefined"), ValueError);
  CHECK_THROWS_WITH_AS(phalanx::exp(Tensor()), doctest::Contains("exp: argument 'input' is undefined"), ValueError);
}
