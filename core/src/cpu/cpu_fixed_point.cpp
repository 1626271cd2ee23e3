// Exact mode's kernels (docs/exact.md): per-parameter maxima and fixed-point sums in int64.
// Integer addition is associative, so a sum of fixed-point values is the same bits in any
// order and on any number of workers; only the float -> fixed conversion rounds, and it
// rounds each value by itself (to nearest, ties to even: llrint in the default rounding
// mode). On x86-64 the conversions run 8 at a time with AVX-512DQ, else 4 with AVX2; the
// scalar loops define the result and the vector ones give the same bits
// (tests/parallel/test_exact.cpp runs all three: PHALANX_FIXED_POINT_SIMD=scalar, avx2 or
// avx512 caps the choice).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cpu/cpu_kernels.hpp"
#include "cpu/simd_level.hpp"
#include "phalanx/core/finite.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PHALANX_FIXED_POINT_AVX2 1
#endif

namespace phalanx {

namespace {

/// llrint(v) without a libm call, for v = (a float) * (a power of two): below 2^51 in
/// magnitude, adding and subtracting 1.5 * 2^52 rounds to an integer (to nearest, ties to
/// even); from 2^51 on such a product is an integer (a float's 24-bit significand times a
/// power of two >= 2^28), so the cast is exact. (Any other double in [2^51, 2^52) may end
/// in .5, which the cast would truncate: fixed_point_accumulate takes this path, and the
/// vector ones, only for power-of-two scales.)
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
/// by its reciprocal when both are normal doubles (the reducer's scales are). kDiv false:
/// count is a power of two too, folded into inv_scale by the caller (count == 1 here): the
/// two exact scalings are one, the same double, hence the same float.
template <bool kDiv>
void to_float_scalar(const std::int64_t* __restrict a, double inv_scale, double scale, double count,
                     float* __restrict o, std::int64_t n) {
  if (!kDiv)
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(static_cast<double>(a[i]) * inv_scale);
  else if (inv_scale != 0)
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>((static_cast<double>(a[i]) * inv_scale) / count);
  else
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>((static_cast<double>(a[i]) / scale) / count);
}

#ifdef PHALANX_FIXED_POINT_AVX2
/// 2: AVX-512 (F and DQ), 1: AVX2, 0: scalar, capped by PHALANX_FIXED_POINT_SIMD.
int simd_level() { return cpu::simd_level("PHALANX_FIXED_POINT_SIMD", true); }

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized inside its own conversion intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// Eight at a time with AVX-512DQ's double <-> int64 conversions (rounding to nearest even,
/// as llrint; int64 -> double correctly rounded, as the cast).
__attribute__((target("avx512f,avx512dq"))) void accumulate_avx512(const float* __restrict v, double scale,
                                                                   std::int64_t* __restrict a, std::int64_t n) {
  const __m512d s = _mm512_set1_pd(scale);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(v + i)), s);
    const __m512i r = _mm512_cvt_roundpd_epi64(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_si512(a + i, _mm512_add_epi64(_mm512_loadu_si512(a + i), r));
  }
  accumulate_scalar(v + i, scale, a + i, n - i);
}

template <bool kDiv>
__attribute__((target("avx512f,avx512dq"))) void to_float_avx512(const std::int64_t* __restrict a, double inv_scale,
                                                                 double count, float* __restrict o, std::int64_t n) {
  const __m512d inv = _mm512_set1_pd(inv_scale), cnt = _mm512_set1_pd(count);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_cvt_roundepi64_pd(_mm512_loadu_si512(a + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512d q = kDiv ? _mm512_div_pd(_mm512_mul_pd(d, inv), cnt) : _mm512_mul_pd(d, inv);
    _mm256_storeu_ps(o + i, _mm512_cvtpd_ps(q));
  }
  to_float_scalar<kDiv>(a + i, inv_scale, 0, count, o + i, n - i);
}
#pragma GCC diagnostic pop

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
template <bool kDiv>
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
    const __m256d y = _mm256_mul_pd(_mm256_add_pd(hi, lo), inv);
    _mm_storeu_ps(o + i, _mm256_cvtpd_ps(kDiv ? _mm256_div_pd(y, cnt) : y));
  }
  to_float_scalar<kDiv>(a + i, inv_scale, 0, count, o + i, n - i);
}
#endif

}  // namespace

void CpuKernels::abs_max_into(const Tensor& x, Tensor& out, std::int64_t index) {
  const float* v = x.data<float>();
  float* slot = out.data<float>() + index;
  const std::int64_t n = x.numel();
  const std::uint32_t bits = max_abs_bits(v, n);  // finite.hpp: an integer max, vectorised
  float m;
  std::memcpy(&m, &bits, sizeof m);
  // bits above +Inf's are a NaN's; a NaN already in the slot stays.
  *slot = std::isnan(m) || std::isnan(*slot) ? std::nanf("") : (m > *slot ? m : *slot);
}

void CpuKernels::fixed_point_accumulate(const Tensor& x, double scale, Tensor& acc) {
  const float* v = x.data<float>();
  std::int64_t* a = acc.data<std::int64_t>();
  const std::int64_t n = x.numel();
  int e = 0;
  if (std::frexp(scale, &e) != 0.5) {  // not a power of two (the reducer's scales are): llrint itself
    for (std::int64_t i = 0; i < n; ++i) a[i] += std::llrint(static_cast<double>(v[i]) * scale);
    return;
  }
#ifdef PHALANX_FIXED_POINT_AVX2
  // The vector path needs |x * scale| < 2^62 (the caller's contract: sums stay in int64).
  const int level = simd_level();
  if (level == 2) return accumulate_avx512(v, scale, a, n);
  if (level == 1) return accumulate_avx2(v, scale, a, n);
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
  // A power-of-two count (K = 2^j micro-batches) folds into the reciprocal: for every int64
  // x, x * 2^(1-e) and then / 2^j are exact (no overflow or subnormal with |e| < 900 and
  // j <= 62), so x * 2^(1-e-j) is the same double, one multiplication and no division.
  int j = 0;
  const bool fold = power_of_two && e > -900 && e < 900 && std::frexp(count, &j) == 0.5 && j >= 1 && j <= 63;
  const double inv_count = fold ? std::ldexp(1.0, 1 - e - (j - 1)) : 0.0;
#ifdef PHALANX_FIXED_POINT_AVX2
  const int level = power_of_two ? simd_level() : 0;
  if (level == 2) return fold ? to_float_avx512<false>(a, inv_count, 1, o, n) : to_float_avx512<true>(a, inv, count, o, n);
  if (level == 1) return fold ? to_float_avx2<false>(a, inv_count, 1, o, n) : to_float_avx2<true>(a, inv, count, o, n);
#endif
  if (fold) return to_float_scalar<false>(a, inv_count, 0, 1, o, n);
  to_float_scalar<true>(a, inv, scale, count, o, n);
}

}  // namespace phalanx
