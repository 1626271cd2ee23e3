// all_finite (phalanx/core/finite.hpp): the trainer checks every gradient each step (1.86 M
// floats for the MLP 784-1024-1024-10), so the pass runs at memory speed: the largest
// |x| as bits, an unsigned max of the bits with the sign cleared (for non-negative floats the
// order of the bits is the order of the values; every NaN's bits are above +Inf's), compiled
// for AVX-512F, AVX2 and baseline x86-64 and picked at load time, as small_gemm's blocks are.
// It was an inline loop compiled into each caller for baseline x86-64 (SSE2 has no unsigned
// 32-bit max: an OR of compares, 4 lanes): 750 us for those 1.86 M floats, 2.4x memcpy's
// time for the same bytes (bench_step_parts).
#include "phalanx/core/finite.hpp"

#include <cstring>

namespace phalanx {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
std::uint32_t max_abs_bits(const float* __restrict p, std::int64_t n) {
  std::uint32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    bits &= 0x7fffffffu;
    m = bits > m ? bits : m;
  }
  return m;
}

bool all_finite(const float* p, std::int64_t n) { return n <= 0 || max_abs_bits(p, n) < 0x7f800000u; }

namespace {
// GradScaler's unscale reads each gradient once: the max of the input's |bits| and the
// product in the same loop, so a gradient crosses memory once instead of twice (check, then
// scale).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
std::uint32_t scale_max_abs_bits(float* __restrict p, std::int64_t n, float factor) {
  std::uint32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    bits &= 0x7fffffffu;
    m = bits > m ? bits : m;
    p[i] = p[i] * factor;
  }
  return m;
}
}  // namespace

bool unscale_and_check_finite(float* p, std::int64_t n, float factor) {
  if (n <= 0) return true;
  if (factor == 1.0f) return all_finite(p, n);
  return scale_max_abs_bits(p, n, factor) < 0x7f800000u;
}

}  // namespace phalanx
