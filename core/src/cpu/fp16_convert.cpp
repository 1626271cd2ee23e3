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

#include "cpu/fp16_lanes.hpp"
#include "phalanx/core/half.hpp"

namespace phalanx::cpu {

namespace {

#ifdef PHALANX_FP16_X86
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
