// float32 <-> float16 array conversions (cpu/fp16_convert.hpp). The F16C instructions round to
// nearest even (the immediate overrides MXCSR's rounding mode), handle subnormals both ways and
// overflow to inf as the scalar rules do; they differ on NaN only: vcvtps2ph keeps the top
// payload bits (quieted) where float_to_fp16 writes sign | 0x7E00 (c10::Half's rule), and
// vcvtph2ps sets the quiet bit of a signalling NaN where fp16_to_float keeps the payload as is.
// Those lanes are rewritten with integer ops. Checked against PyTorch 1.13's `.half()` /
// `.float()`: float32 -> float16 gives its bits for every input tried (NaN too); float16 ->
// float32 differs on the 1022 signalling-NaN halves only (PyTorch quiets them, 0x7C01 ->
// 0x7FC02000; fp16_to_float gives 0x7F802000), kept as the scalar rule has it. No AVX-512 variant: none can run where this was
// written (Zen 3); an AVX-512 CPU runs the AVX2 one.
#include "cpu/fp16_convert.hpp"

#include <algorithm>

#include "cpu/simd_level.hpp"
#include "phalanx/core/half.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_FP16_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace phalanx::cpu {

namespace {

#ifdef PHALANX_FP16_X86
bool has_f16c() {
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

__attribute__((target("avx2,f16c"))) void floats_to_fp16_f16c(const float* s, std::uint16_t* d, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), floats_to_fp16_8(_mm256_loadu_ps(s + i)));
  for (; i < n; ++i) d[i] = float_to_fp16(s[i]);
}

__attribute__((target("avx2,f16c"))) void fp16_to_floats_f16c(const std::uint16_t* s, float* d, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, fp16_to_floats_8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = fp16_to_float(s[i]);
}
#endif

bool use_f16c() {
#ifdef PHALANX_FP16_X86
  // Read (and validated) even on a CPU without F16C, so a typo is an error everywhere.
  const int level = std::min(simd_level("PHALANX_FP16_SIMD"), 1);
  return level >= 1 && has_f16c();
#else
  simd_level("PHALANX_FP16_SIMD");
  return false;
#endif
}

}  // namespace

void floats_to_fp16(const float* s, std::uint16_t* d, std::int64_t n) {
#ifdef PHALANX_FP16_X86
  if (use_f16c()) return floats_to_fp16_f16c(s, d, n);
#else
  use_f16c();
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_fp16(s[i]);
}

void fp16_to_floats(const std::uint16_t* s, float* d, std::int64_t n) {
#ifdef PHALANX_FP16_X86
  if (use_f16c()) return fp16_to_floats_f16c(s, d, n);
#else
  use_f16c();
#endif
  for (std::int64_t i = 0; i < n; ++i) d[i] = fp16_to_float(s[i]);
}

}  // namespace phalanx::cpu
