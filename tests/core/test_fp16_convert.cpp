// float32 <-> float16 conversion through the CPU table (cpu/fp16_convert.hpp): the F16C path and
// the scalar one give the bits of half.hpp's float_to_fp16 / fp16_to_float for every input.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <phalanx/core/half.hpp>
#include <phalanx/phalanx.hpp>

#include "support/bits_and_env.hpp"

using namespace phalanx;
using test::bits_of;
using test::float_of;

namespace {


/// Sets PHALANX_FP16_SIMD for the scope (restores unset).
struct Fp16Simd : test::ScopedEnv {
  explicit Fp16Simd(const char* v) : ScopedEnv("PHALANX_FP16_SIMD", v) {}
};
// "avx512" is a cap that runs the F16C (AVX2) code: no AVX-512 variant exists.
const char* const kLevels[] = {"scalar", "avx2", "avx512"};

std::vector<std::uint16_t> to_fp16_bits(const std::vector<std::uint32_t>& src) {
  Tensor f = Tensor::empty({static_cast<std::int64_t>(src.size())}, DType::Float32);
  if (!src.empty()) std::memcpy(f.raw_data(), src.data(), src.size() * 4);
  const Tensor h = to_dtype(f, DType::Float16);
  std::vector<std::uint16_t> v(src.size());
  if (!v.empty()) std::memcpy(v.data(), h.raw_data(), v.size() * 2);
  return v;
}
std::vector<std::uint32_t> to_float_bits(const std::vector<std::uint16_t>& src) {
  Tensor h = Tensor::empty({static_cast<std::int64_t>(src.size())}, DType::Float16);
  if (!src.empty()) std::memcpy(h.raw_data(), src.data(), src.size() * 2);
  const Tensor f = to_dtype(h, DType::Float32);
  std::vector<std::uint32_t> v(src.size());
  if (!v.empty()) std::memcpy(v.data(), f.raw_data(), v.size() * 4);
  return v;
}

/// Float patterns of every class: +-0, +-inf, NaNs (quiet, signalling, payloads, negative), the
/// half overflow edge (65504, the 65520 tie, just below it), the normal/subnormal half edges and
/// their ties, float subnormals, exact ties at every exponent, then random bits and random
/// values near the half range.
std::vector<std::uint32_t> float_patterns() {
  std::vector<std::uint32_t> v = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                                  0x7f800001, 0xff800001, 0x7fa00000, 0x7fffffff, 0xffffffff, 0x7fc02000,
                                  0x7f802000, 0x7fbfe000, 0x00000001, 0x807fffff, 0x00400000, 0x477fe000,
                                  0x477fefff, 0x477ff000, 0x477ff001, 0xc77ff000, 0x47800000, 0x7f7fffff,
                                  0x38800000, 0x387fffff, 0x387fe000, 0x387ff000, 0x33000000, 0x33000001,
                                  0x32ffffff, 0x33800000, 0x33c00000, 0xb3000000, 0xb3400000};
  // every exponent, mantissa patterns around the rounding point (ties with even/odd kept bit)
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t m : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fe000u, 0x7ff000u,
                            0x7fffffu, 0x400000u, 0x401000u, 0x403000u, 0x555555u})
      for (std::uint32_t s : {0u, 0x80000000u}) v.push_back(s | e << 23 | m);
  std::mt19937 rng(20261206);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<std::uint32_t> exp_near(100, 145);  // 2^-27 .. 2^18: subnormal..overflow
  for (int i = 0; i < 400000; ++i) v.push_back(any(rng));
  for (int i = 0; i < 400000; ++i) v.push_back((any(rng) & 0x807fffffu) | exp_near(rng) << 23);
  return v;
}

}  // namespace

TEST_CASE("float16 -> float32: every one of the 65536 patterns, every level, the scalar rule's bits") {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  for (const char* level : kLevels) {
    Fp16Simd env(level);
    const std::vector<std::uint32_t> got = to_float_bits(all);
    std::size_t bad = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) bad += got[i] != bits_of(fp16_to_float(all[i]));
    const std::string lv = level;
    CAPTURE(lv);
    CHECK(bad == 0);
  }
  // widening is exact, NaN payloads kept as they are (not quieted)
  CHECK(bits_of(fp16_to_float(0x7c01)) == 0x7f802000u);
  CHECK(bits_of(fp16_to_float(0xfe00)) == 0xffc00000u);
  CHECK(bits_of(fp16_to_float(0x0001)) == 0x33800000u);  // smallest subnormal 2^-24
  CHECK(bits_of(fp16_to_float(0x8000)) == 0x80000000u);
}

TEST_CASE("float32 -> float16: special classes, ties, subnormals, random bits, every level agree") {
  const std::vector<std::uint32_t> src = float_patterns();
  std::vector<std::uint16_t> want(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) want[i] = float_to_fp16(float_of(src[i]));
  for (const char* level : kLevels) {
    Fp16Simd env(level);
    const std::vector<std::uint16_t> got = to_fp16_bits(src);
    std::size_t bad = 0, first = src.size();
    for (std::size_t i = 0; i < src.size(); ++i)
      if (got[i] != want[i]) {
        ++bad;
        if (first == src.size()) first = i;
      }
    const std::string lv = level;
    CAPTURE(lv);
    CAPTURE(first < src.size() ? src[first] : 0u);
    CHECK(bad == 0);
  }
  // the scalar rule itself (c10::Half's): RNE, overflow at the 65520 tie, NaN -> sign | 0x7E00
  CHECK(float_to_fp16(65504.f) == 0x7bff);
  CHECK(float_to_fp16(float_of(0x477fefff)) == 0x7bff);
  CHECK(float_to_fp16(65520.f) == 0x7c00);
  CHECK(float_to_fp16(float_of(0x33000000)) == 0x0000);  // 2^-25: tie to even 0
  CHECK(float_to_fp16(float_of(0x33000001)) == 0x0001);
  CHECK(float_to_fp16(float_of(0x33c00000)) == 0x0002);  // 1.5 * 2^-24: tie to even 2
  CHECK(float_to_fp16(float_of(0x7fa00000)) == 0x7e00);  // signalling NaN with payload
  CHECK(float_to_fp16(float_of(0xffc02000)) == 0xfe00);
  CHECK(float_to_fp16(-0.f) == 0x8000);
}

TEST_CASE("fp16 conversions: every length 0..67 and unaligned starts, F16C tail == scalar") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (const char* level : {"avx2", "scalar"}) {
    Fp16Simd env(level);
    for (std::size_t n = 0; n <= 67; ++n) {
      std::vector<std::uint32_t> f(n);
      std::vector<std::uint16_t> h(n);
      for (auto& x : f) x = any(rng);
      for (auto& x : h) x = static_cast<std::uint16_t>(any(rng));
      if (n > 3) f[n - 1] = 0x7f800001u, h[n - 1] = 0x7c01;  // a NaN in the tail
      const std::vector<std::uint16_t> gh = to_fp16_bits(f);
      const std::vector<std::uint32_t> gf = to_float_bits(h);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        bad += (gh[i] != float_to_fp16(float_of(f[i]))) + (gf[i] != bits_of(fp16_to_float(h[i])));
      const std::string lv = level;
    CAPTURE(lv);
      CAPTURE(n);
      CHECK(bad == 0);
    }
    // a view starting one element in (unaligned data pointer) reads as its values
    Tensor big = Tensor::empty({35}, DType::Float32);
    for (std::int64_t i = 0; i < 35; ++i) big.data<float>()[i] = float_of(any(rng));
    const Tensor view = big.narrow_rows(1, 35);
    const Tensor h16 = to_dtype(view, DType::Float16);
    const auto* hb = static_cast<const std::uint16_t*>(h16.raw_data());
    std::size_t bad = 0;
    for (std::int64_t i = 0; i < 34; ++i) bad += hb[i] != float_to_fp16(big.data<float>()[i + 1]);
    CHECK(bad == 0);
  }
}

TEST_CASE("PHALANX_FP16_SIMD is read strictly") {
  Fp16Simd env("avx1024");
  CHECK_THROWS_AS(to_dtype(ones({4}), DType::Float16), ConfigError);
}
