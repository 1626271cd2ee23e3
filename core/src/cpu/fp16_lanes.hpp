#pragma once
// 8-lane float32 <-> float16 conversions with F16C (vcvtps2ph / vcvtph2ps) that give the bits of
// phalanx/core/half.hpp's scalar rules, NaN lanes included; shared by the array conversions
// (fp16_convert.cpp) and the 16-bit sums (half_sum.cpp). Callers check has_f16c() first.
#include <algorithm>

#include "cpu/simd_level.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_FP16_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace phalanx::cpu {

#ifdef PHALANX_FP16_X86
/// Whether the CPU runs AVX2 + F16C code.
inline bool has_f16c() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  }();
  return ok;
}

__attribute__((target("avx2,f16c"))) inline __m128i floats_to_fp16_8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // abs >= 0: signed is fine
  // sign | 0x7E00 in each 32-bit lane, then both packed to 16 bits (values <= 0xFE00, masks 0/-1).
  const __m256i canon = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                                        _mm256_set1_epi32(0x7e00));
  const __m128i canon16 = _mm_packus_epi32(_mm256_castsi256_si128(canon), _mm256_extracti128_si256(canon, 1));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm_blendv_epi8(h, canon16, nan16);
}

__attribute__((target("avx2,f16c"))) inline __m256 fp16_to_floats_8(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i abs = _mm256_and_si256(w, _mm256_set1_epi32(0x7fff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7c00));
  // sign << 16 | 0x7F800000 | mant << 13: the payload kept as is (fp16_to_float's rule).
  const __m256i exact = _mm256_or_si256(
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                      _mm256_set1_epi32(0x7f800000)),
      _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), 13));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(exact), _mm256_castsi256_ps(nan));
}
#endif

/// Whether to run the F16C code now: the CPU has it and PHALANX_FP16_SIMD (scalar | avx2 |
/// avx512, read at each call) does not cap it to scalar.
inline bool use_f16c() {
#ifdef PHALANX_FP16_X86
  // Read (and validated) even on a CPU without F16C, so a typo is an error everywhere.
  const int level = std::min(simd_level("PHALANX_FP16_SIMD"), 1);
  return level >= 1 && has_f16c();
#else
  simd_level("PHALANX_FP16_SIMD");
  return false;
#endif
}

}  // namespace phalanx::cpu
