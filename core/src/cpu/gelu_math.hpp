#pragma once
// GELU's float32 arithmetic, shared by the float32 kernels (cpu_elementwise.cpp) and the bf16
// ones (bf16_elementwise.cpp), so that a bf16 GELU is the float32 one on the widened value,
// bit for bit. Branch-free (both erf ranges computed, then selected) so that each loop
// vectorises; every multiply-add is an explicit std::fma and nothing else is contractible
// (-std=c++17: no FMA contraction), so each compiled level gives the same bits (the baseline
// one through libm's fmaf: slow, use it only where the CPU has no FMA).
#include <cmath>
#include <cstdint>
#include <cstring>

namespace phalanx::cpu::gelu_math {

__attribute__((always_inline)) inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
__attribute__((always_inline)) inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// c ? a : b as bit operations: GCC does not if-convert a select between two float
/// computations (with trapping math they could trap), it branches, and then the loop does not
/// vectorise without AVX-512's masks.
__attribute__((always_inline)) inline float select_bits(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return bits_to_float((float_to_bits(a) & m) | (float_to_bits(b) & ~m));
}

/// exp(r) for r in [-87, 0] (callers clamp): 2^k exp(f), |f| <= ln2 / 2, a degree-7 polynomial;
/// within 1e-7 relative of exp. The result stays a normal float, so 2^k goes into the exponent bits.
__attribute__((always_inline)) inline float exp_nonpositive(float r) {
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = std::fma(r, 1.44269504f, magic);  // k in its low mantissa bits
  const float k = shifted - magic;
  float f = std::fma(k, -0.693145752f, r);  // ln 2 in two parts (Cody-Waite)
  f = std::fma(k, -1.42860677e-6f, f);
  float p = 1.98756912e-4f;
  p = std::fma(p, f, 1.39819994e-3f);
  p = std::fma(p, f, 8.33345205e-3f);
  p = std::fma(p, f, 4.16657962e-2f);
  p = std::fma(p, f, 1.66666657e-1f);
  p = std::fma(p, f, 5.0e-1f);
  p = std::fma(p, f * f, f) + 1.0f;
  return bits_to_float(float_to_bits(p) + ((float_to_bits(shifted) - float_to_bits(magic)) << 23));
}

/// erf(a) within 1.02 ulp of the exact value (checked against double erf over the float range):
/// a + a P(a^2) for |a| <= 0.9277, else 1 - exp(Q(|a|)) with its sign; |a| is capped at 4
/// (erf is 1 in float from 3.92) so exp's argument stays in range. NaN stays NaN.
__attribute__((always_inline)) inline float erf_float(float a) {
  const float t = std::fabs(a), s = a * a;
  float r = -5.96761703e-4f;
  r = std::fma(r, s, 4.99119423e-3f);
  r = std::fma(r, s, -2.67681349e-2f);
  r = std::fma(r, s, 1.12819925e-1f);
  r = std::fma(r, s, -3.76125336e-1f);
  r = std::fma(r, s, 1.28379166e-1f);
  const float small = std::fma(r, a, a);
  const float tc = select_bits(t < 4.0f, t, 4.0f);
  float u = std::fma(-1.72853470e-5f, tc, 3.83197126e-4f);
  const float v = std::fma(-3.88396438e-3f, tc, 2.42546219e-2f);
  u = std::fma(u, tc * tc, v);
  u = std::fma(u, tc, -1.06777877e-1f);
  u = std::fma(u, tc, -6.34846687e-1f);
  u = std::fma(u, tc, -1.28717512e-1f);
  u = std::fma(u, tc, -tc);
  const float big = std::copysign(1.0f - exp_nonpositive(u), a);
  return select_bits(t > 0.927734375f, big, small);
}

/// PyTorch's exact (erf) GELU: x/2 (1 + erf(x / sqrt 2)).
__attribute__((always_inline)) inline float gelu_one(float x) {
  return x * 0.5f * (1.0f + erf_float(x * static_cast<float>(M_SQRT1_2)));
}

/// g times d/dx = Phi(x) + x phi(x), as PyTorch's GeluBackward; phi is 0 where x^2/2 > 87 (exp
/// underflows) and for a NaN x: exp_nonpositive's integer steps on a NaN give a NaN of either
/// sign (or a number), and which NaN operand an fma passes on differs between the levels (the
/// vfmadd form the compiler picks, libm's fmaf), so a NaN x came back as +NaN on one level and
/// -NaN on another. With phi 0 every NaN in the fma is x's own: a NaN x gives x's (quieted)
/// NaN on every level. Only when both g and x are NaN may the product pass on either.
__attribute__((always_inline)) inline float gelu_backward_one(float g, float x) {
  const float kBeta = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);
  const float cdf = 0.5f * (1.0f + erf_float(x * static_cast<float>(M_SQRT1_2)));
  const float e = x * x * -0.5f;
  const bool in_range = e >= -87.0f;  // false for a NaN e (a NaN x)
  const float pdf = select_bits(in_range, kBeta * exp_nonpositive(select_bits(in_range, e, -87.0f)), 0.0f);
  return g * std::fma(x, pdf, cdf);
}

}  // namespace phalanx::cpu::gelu_math
