// Exact mode's kernels (docs/exact.md): per-parameter maxima and fixed-point sums in int64.
// Integer addition is associative, so a sum of fixed-point values is the same bits in any
// order and on any number of workers; only the float -> fixed conversion rounds, and it
// rounds each value by itself (to nearest, ties to even: llrint in the default rounding
// mode). On x86-64 with AVX2 the conversions run four at a time; the scalar loops define
// the result and the vector ones give the same bits (tests/parallel/test_exact.cpp).
#include <cmath>
#include <cstring>

#include "cpu/cpu_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PHALANX_FIXED_POINT_AVX2 1
#endif

namespace phalanx {

namespace {

/// llrint(v) without a libm call: below 2^51 in magnitude, adding and subtracting
/// 1.5 * 2^52 rounds to an integer (to nearest, ties to even) and is exact otherwise; from
/// 2^51 on, a double has no fraction bits left, so the cast is exact.
inline std::int64_t round_to_int(double v) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  constexpr double kLimit = 2251799813685248.0;  // 2^51
  const double r = std::fabs(v) < kLimit ? (v + kMagic) - kMagic : v;
  return static_cast<std::int64_t>(r);
}

void accumulate_scalar(const float* __restrict v, double scale, std::int64_t* __restrict a, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] += round_to_int(static_cast<double>(v[i]) * scale);
}

/// (acc / scale) / count, the division by a power of two done as an exact multiplication
/// by its reciprocal when both are normal doubles (the reducer's scales are).
void to_float_scalar(const std::int64_t* __restrict a, double inv_scale, double scale, double count,
                     float* __restrict o, std::int64_t n) {
  if (inv_scale != 0)
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>((static_cast<double>(a[i]) * inv_scale) / count);
  else
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>((static_cast<double>(a[i]) / scale) / count);
}

#ifdef PHALANX_FIXED_POINT_AVX2
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

/// Four at a time: below 2^51 the magic-number rounding, read back from the sum's bits;
/// from 2^51 on (|v| < 2^62, an integer) the significand shifted by the exponent.
__attribute__((target("avx2"))) void accumulate_avx2(const float* __restrict v, double scale,
                                                     std::int64_t* __restrict a, std::int64_t n) {
  const __m256d s = _mm256_set1_pd(scale);
  const __m256d magic = _mm256_set1_pd(6755399441055744.0);
  const __m256i magic_bits = _mm256_set1_epi64x(0x4338000000000000LL);
  const __m256i abs_mask = _mm256_set1_epi64x(0x7fffffffffffffffLL);
  const __m256i below_limit = _mm256_set1_epi64x(0x4320000000000000LL - 1);  // 2^51's bits - 1
  const __m256i mant_mask = _mm256_set1_epi64x((1LL << 52) - 1);
  const __m256i implicit = _mm256_set1_epi64x(1LL << 52);
  const __m256i bias = _mm256_set1_epi64x(1074);  // exponent - 51 = shift before the final >> 1
  const __m256i low6 = _mm256_set1_epi64x(63);
  const __m256i zero = _mm256_setzero_si256();
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d d = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + i)), s);
    const __m256i bits = _mm256_castpd_si256(d);
    const __m256i small = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(d, magic)), magic_bits);
    const __m256i shift = _mm256_and_si256(_mm256_sub_epi64(_mm256_srli_epi64(bits, 52), bias), low6);
    const __m256i mant = _mm256_or_si256(_mm256_and_si256(bits, mant_mask), implicit);
    const __m256i mag = _mm256_srli_epi64(_mm256_sllv_epi64(mant, shift), 1);
    const __m256i neg = _mm256_cmpgt_epi64(zero, bits);
    const __m256i big = _mm256_sub_epi64(_mm256_xor_si256(mag, neg), neg);
    const __m256i is_big = _mm256_cmpgt_epi64(_mm256_and_si256(bits, abs_mask), below_limit);
    const __m256i r = _mm256_blendv_epi8(small, big, is_big);
    __m256i* out = reinterpret_cast<__m256i*>(a + i);
    _mm256_storeu_si256(out, _mm256_add_epi64(_mm256_loadu_si256(out), r));
  }
  accumulate_scalar(v + i, scale, a + i, n - i);
}

/// int64 -> double as hi * 2^32 + lo (both exact, one rounding: the correctly rounded
/// conversion), then the same multiplication and division as the scalar loop.
__attribute__((target("avx2"))) void to_float_avx2(const std::int64_t* __restrict a, double inv_scale,
                                                   double count, float* __restrict o, std::int64_t n) {
  const __m256d inv = _mm256_set1_pd(inv_scale), cnt = _mm256_set1_pd(count);
  const __m256d two32 = _mm256_set1_pd(4294967296.0);
  const __m256i lo_mask = _mm256_set1_epi64x(0xffffffffLL);
  const __m256i exp52 = _mm256_set1_epi64x(0x4330000000000000LL);  // 2^52's bits
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0);
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m128i hi32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(x, odd));  // signed high halves
    const __m256d hi = _mm256_mul_pd(_mm256_cvtepi32_pd(hi32), two32);
    const __m256d lo = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(x, lo_mask), exp52)), two52);
    const __m256d d = _mm256_div_pd(_mm256_mul_pd(_mm256_add_pd(hi, lo), inv), cnt);
    _mm_storeu_ps(o + i, _mm256_cvtpd_ps(d));
  }
  to_float_scalar(a + i, inv_scale, 0, count, o + i, n - i);
}
#endif

}  // namespace

void CpuKernels::abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) {
  const float* v = x.data<float>();
  float* slot = out.data<float>() + index;
  const std::int64_t n = x.numel();
  float m = *slot;
  bool nan = std::isnan(m);
  for (std::int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    m = a > m ? a : m;
    nan |= a != a;
  }
  *slot = nan ? std::nanf("") : m;
}

void CpuKernels::fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) {
  const float* v = x.data<float>();
  std::int64_t* a = acc.data<std::int64_t>();
  const std::int64_t n = x.numel();
#ifdef PHALANX_FIXED_POINT_AVX2
  // The vector path needs |x * scale| < 2^62 (the caller's contract: sums stay in int64).
  if (has_avx2()) return accumulate_avx2(v, scale, a, n);
#endif
  accumulate_scalar(v, scale, a, n);
}

void CpuKernels::fixed_point_to_float(const Tensor& acc, double scale, double count, Tensor& out) {
  const std::int64_t* a = acc.data<std::int64_t>();
  float* o = out.data<float>();
  const std::int64_t n = out.numel();
  int e = 0;
  const double mantissa = std::frexp(scale, &e);
  const bool power_of_two = mantissa == 0.5 && e > -1000 && e < 1000;
  const double inv = power_of_two ? std::ldexp(1.0, 1 - e) : 0.0;
#ifdef PHALANX_FIXED_POINT_AVX2
  if (power_of_two && has_avx2()) return to_float_avx2(a, inv, count, o, n);
#endif
  to_float_scalar(a, inv, scale, count, o, n);
}

}  // namespace phalanx
