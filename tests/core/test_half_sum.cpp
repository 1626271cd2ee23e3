// Sums of 16-bit float arrays (phalanx/core/half_sum.hpp), the collectives' float16 / bfloat16
// reductions: the AVX2 path and the scalar one (PHALANX_FP16_SIMD / PHALANX_BF16_SIMD=scalar)
// give, bit for bit, what the plugins' scalar loops gave before them (the reference below:
// widen, add in source order in float32, round once), for NaN, inf, -0, subnormals, float16
// overflow, any number of sources and lengths that are not a multiple of the 8 lanes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <phalanx/core/error.hpp>
#include <phalanx/core/half.hpp>
#include <phalanx/core/half_sum.hpp>

#include "support/bits_and_env.hpp"

using namespace phalanx;

namespace {

using Sum = void (*)(void*, void*, const void* const*, int, std::size_t);
using Bits = std::vector<std::uint16_t>;

struct Kind {
  const char* name;
  const char* env;  // the knob that forces the scalar code
  Sum sum;
  float (*load)(std::uint16_t);
  std::uint16_t (*store)(float);
  Bits specials;
};

const Kind kKinds[] = {
    {"float16", "PHALANX_FP16_SIMD", &fp16_sum, &fp16_to_float, &float_to_fp16,
     // +-0, +-inf, quiet / signalling NaNs of both signs, smallest / largest subnormal, smallest
     // normal, 65504 (sums of two overflow), 1, values whose sums are ties, their negatives.
     {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfc01, 0x7fff, 0xffff, 0x7d00, 0x0001, 0x8001,
      0x03ff, 0x83ff, 0x0400, 0x8400, 0x7bff, 0xfbff, 0x7800, 0x3c00, 0xbc00, 0x3c01, 0x1001, 0x0002, 0x5bff}},
    {"bfloat16", "PHALANX_BF16_SIMD", &bf16_sum, &bf16_to_float, &float_to_bf16,
     {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff, 0xffff, 0x0001, 0x8001, 0x007f,
      0x807f, 0x0080, 0x8080, 0x7f7f, 0xff7f, 0x7f00, 0x3f80, 0xbf80, 0x3f81, 0x3b81, 0x0002, 0x4b7f}},
};

/// What shm_reduce.cpp, the Gloo plugin and the MPI plugin computed before half_sum.hpp: as
/// compiled (GCC 12, -O3), a NaN source replaced the sum, so of two NaNs the later source's
/// won (Gloo: b's; MPI: inout's). Checked against main's built plugins before the change: all
/// 2^32 ordered pairs of each format through Gloo's and MPI's sum16, 3 and 4 NaN-rich sources
/// through shm's, identical bits. Written out here, since which NaN a plain `+` returns is up
/// to the compiler's operand order (half_sum.cpp's first draft got the other).
Bits reference(const Kind& k, const std::vector<Bits>& src, std::size_t n) {
  Bits out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = k.load(src[0][i]);
    for (std::size_t q = 1; q < src.size(); ++q) {
      const float x = k.load(src[q][i]);
      acc = std::isnan(x) ? x : acc + x;
    }
    out[i] = k.store(acc);
  }
  return out;
}

/// The sum under `level` (scalar | avx2), into dst and dst2.
Bits run(const Kind& k, const char* level, const std::vector<Bits>& src, std::size_t n) {
  test::ScopedEnv env(k.env, level);
  std::vector<const void*> p;
  for (const Bits& s : src) p.push_back(s.data());
  Bits dst(n + 1, 0x1234), dst2(n + 1, 0x4321);  // one guard element each
  k.sum(dst.data(), dst2.data(), p.data(), static_cast<int>(p.size()), n);
  CHECK(dst[n] == 0x1234);
  CHECK(dst2[n] == 0x4321);
  dst.resize(n);
  dst2.resize(n);
  CHECK(dst == dst2);
  return dst;
}

/// Sources mixing special values, random patterns and random values of one magnitude.
std::vector<Bits> sources(const Kind& k, int w, std::size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<std::uint32_t> any(0, 0xffff);
  std::vector<Bits> src(static_cast<std::size_t>(w), Bits(n));
  for (Bits& s : src)
    for (std::uint16_t& v : s) {
      const std::uint32_t r = any(rng);
      if (r % 4 == 0) v = k.specials[r / 4 % k.specials.size()];
      else if (r % 4 == 1) v = static_cast<std::uint16_t>(any(rng));
      else v = static_cast<std::uint16_t>((any(rng) & 0x80ffu) | (k.specials[r / 4 % k.specials.size()] & 0x7f00u));
    }
  return src;
}

/// How many elements differ; the first one is logged.
std::size_t mismatches(const Bits& got, const Bits& want, const std::vector<Bits>& src) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) {
      std::string in;
      for (const Bits& s : src) in += " " + std::to_string(s[i]);
      MESSAGE("element " << i << ": got " << got[i] << ", want " << want[i] << "; sources" << in);
    }
  return bad;
}

}  // namespace

TEST_CASE("16-bit sums: both paths give the old scalar loops' bits, W = 1..4 sources, any length") {
  std::mt19937 rng(30);
  for (const Kind& k : kKinds)
    for (int w = 1; w <= 4; ++w)
      for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 1031, 8195}) {
        const std::string kind = k.name;
        CAPTURE(kind);
        CAPTURE(w);
        CAPTURE(n);
        const std::vector<Bits> src = sources(k, w, n, rng);
        const Bits want = reference(k, src, n);
        CHECK(mismatches(run(k, "scalar", src, n), want, src) == 0);
        CHECK(mismatches(run(k, "avx2", src, n), want, src) == 0);
        CHECK(mismatches(run(k, "avx512", src, n), want, src) == 0);  // a cap: runs the AVX2 code
      }
}

TEST_CASE("16-bit sums: every pattern plus every special value, both paths, both orders") {
  for (const Kind& k : kKinds) {
    const std::string kind = k.name;
        CAPTURE(kind);
    Bits all(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
    for (std::uint16_t s : k.specials) {
      CAPTURE(s);
      const std::vector<Bits> ab = {all, Bits(65536, s)}, ba = {Bits(65536, s), all};
      for (const std::vector<Bits>* src : {&ab, &ba}) {
        const Bits want = reference(k, *src, 65536);
        CHECK(mismatches(run(k, "scalar", *src, 65536), want, *src) == 0);
        CHECK(mismatches(run(k, "avx2", *src, 65536), want, *src) == 0);
      }
    }
  }
}

TEST_CASE("16-bit sums: the destination may be a source; dst2 and dst may be null") {
  std::mt19937 rng(31);
  for (const Kind& k : kKinds)
    for (const char* level : {"scalar", "avx2"}) {
      const std::string kind = k.name;
        CAPTURE(kind);
      const std::string lvl = level;
      CAPTURE(lvl);
      test::ScopedEnv env(k.env, level);
      const std::size_t n = 1003;
      std::vector<Bits> src = sources(k, 3, n, rng);
      const Bits want = reference(k, src, n);
      const void* p[3] = {src[0].data(), src[1].data(), src[2].data()};
      Bits other(n);
      k.sum(nullptr, other.data(), p, 3, n);  // only dst2
      CHECK(mismatches(other, want, src) == 0);
      const std::vector<Bits> before = src;
      k.sum(src[1].data(), nullptr, p, 3, n);  // in place, into the middle source
      CHECK(mismatches(src[1], want, before) == 0);
    }
}

TEST_CASE("16-bit sums: pointers at any 2-byte offset (shm slices, MPI and Gloo buffers)") {
  std::mt19937 rng(32);
  for (const Kind& k : kKinds)
    for (const char* level : {"scalar", "avx2"}) {
      const std::string kind = k.name, lvl = level;
      CAPTURE(kind);
      CAPTURE(lvl);
      test::ScopedEnv env(k.env, level);
      const std::size_t n = 77;
      const std::vector<Bits> src = sources(k, 3, n + 8, rng);
      for (std::size_t off = 0; off < 8; ++off) {
        CAPTURE(off);
        // Each source, dst and dst2 at its own offset of 0..7 elements from a 16-byte boundary.
        const std::size_t at[5] = {off, (off + 3) % 8, 7 - off, (off + 5) % 8, (off + 1) % 8};
        std::vector<Bits> moved(3);
        const void* p[3];
        for (std::size_t q = 0; q < 3; ++q) {
          moved[q].assign(src[q].begin() + static_cast<long>(at[q]), src[q].begin() + static_cast<long>(at[q] + n));
          p[q] = src[q].data() + at[q];
        }
        Bits out(n + 8, 0), out2(n + 8, 0);
        k.sum(out.data() + at[3], out2.data() + at[4], p, 3, n);
        const Bits got(out.begin() + static_cast<long>(at[3]), out.begin() + static_cast<long>(at[3] + n));
        const Bits got2(out2.begin() + static_cast<long>(at[4]), out2.begin() + static_cast<long>(at[4] + n));
        CHECK(mismatches(got, reference(k, moved, n), moved) == 0);
        CHECK(got2 == got);
      }
    }
}

TEST_CASE("16-bit sums: no source, or a bad knob, is a clear error") {
  const void* none[1] = {nullptr};
  std::uint16_t d = 0;
  CHECK_THROWS_WITH_AS(fp16_sum(&d, nullptr, none, 0, 1), "fp16_sum: 0 sources; pass at least one", ValueError);
  CHECK_THROWS_AS(bf16_sum(&d, nullptr, none, -1, 1), ValueError);
  test::ScopedEnv env("PHALANX_BF16_SIMD", "sse");
  CHECK_THROWS_AS(bf16_sum(&d, nullptr, none, 1, 0), ConfigError);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

TEST_CASE("16-bit sums: the AVX2 path returns with the ymm registers' upper halves clear") {
  // XGETBV with ECX = 1 (XINUSE), bit 2: the upper halves are not in their initial state, as
  // after AVX code without vzeroupper. The SSE code after such a call (the caller's, the scalar
  // tail's) then runs slower on Intel. This test's own code is SSE only.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__builtin_cpu_supports("avx2") || !__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || !(a & 4u)) {
    MESSAGE("skipped: no AVX2, or no XGETBV(1) on this CPU");
    return;
  }
  auto upper_in_use = [] {
    unsigned lo = 0, hi = 0;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1u));
    return (lo & 4u) != 0;
  };
  for (const Kind& k : kKinds) {
    const std::string kind = k.name;
    CAPTURE(kind);
    test::ScopedEnv env(k.env, "avx2");
    for (std::size_t n : {8, 9, 16, 23})
      for (bool nan : {false, true}) {  // a NaN lane: those 8 are redone by the scalar code
        CAPTURE(n);
        CAPTURE(nan);
        Bits x(n, k.specials[19]), y(n, k.specials[20]), out(n);
        if (nan) x[3] = k.specials[4];
        const void* p[2] = {x.data(), y.data()};
        asm volatile("vzeroupper");
        k.sum(out.data(), nullptr, p, 2, n);
        const bool dirty = upper_in_use();
        CHECK_FALSE(dirty);
      }
  }
}
#endif
