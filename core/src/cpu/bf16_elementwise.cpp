// bfloat16 elementwise kernels (cpu/bf16_elementwise.hpp). Plain loops on the 16-bit patterns
// that the compiler vectorises; one body, compiled twice (AVX2, baseline x86-64), picked at each
// call. Integer compares only (relu), float32 adds (column sums in a fixed order, the float32
// + bf16 add) or cpu/gelu_math.hpp's float32 GELU with explicit std::fma and one rounding
// (GELU): each gives the same bits at each level. No AVX-512 variant: none could be executed where these were written (Zen 3),
// and code must not run for the first time in CI; an AVX-512 CPU runs the AVX2 one.
#include "cpu/bf16_elementwise.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/gelu_math.hpp"
#include "cpu/simd_level.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_BF16_X86 1
#define PHALANX_TARGET(t) __attribute__((target(t)))
#else
#define PHALANX_TARGET(t)
#endif
#define PHALANX_INLINE inline __attribute__((always_inline))

namespace phalanx::cpu {

namespace {

// bf16 patterns: sign 0x8000, |x| = u & 0x7FFF; a NaN has |x| > 0x7F80 (0x7F80 is +inf).
// x > 0 exactly when u is in [0x0001, 0x7F80]: (u - 1) < 0x7F80 as unsigned 16-bit.
PHALANX_INLINE std::uint16_t relu_one(std::uint16_t u) {
  const std::uint16_t pos = static_cast<std::uint16_t>(static_cast<std::uint16_t>(u - 1u) < 0x7F80u ? 0xFFFFu : 0u);
  const std::uint16_t nan = static_cast<std::uint16_t>((u & 0x7FFFu) > 0x7F80u ? 0xFFFFu : 0u);
  return static_cast<std::uint16_t>((u & pos) | nan);
}

// o may be x (in place): element i is read before it is written, no __restrict.
PHALANX_INLINE void relu_body(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = relu_one(x[i]);
}

// Passes g where !(y <= 0): y > 0 or y NaN; a NaN g becomes 0xFFFF. o may be g or y.
PHALANX_INLINE void relu_backward_body(const std::uint16_t* g, const std::uint16_t* y, std::uint16_t* o,
                                       std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t yi = y[i], gi = g[i];
    const bool pass = static_cast<std::uint16_t>(yi - 1u) < 0x7F80u || (yi & 0x7FFFu) > 0x7F80u;
    const std::uint16_t gv = static_cast<std::uint16_t>((gi & 0x7FFFu) > 0x7F80u ? 0xFFFFu : gi);
    o[i] = static_cast<std::uint16_t>(pass ? gv : 0u);
  }
}

PHALANX_INLINE float widen(std::uint16_t u) {
  const std::uint32_t w = static_cast<std::uint32_t>(u) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

PHALANX_INLINE void column_sums_body(const std::uint16_t* __restrict x, std::int64_t rows, std::int64_t p,
                                     float* __restrict o) {
  for (std::int64_t j = 0; j < p; ++j) o[j] = 0.f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* row = x + r * p;
    for (std::int64_t j = 0; j < p; ++j) o[j] += widen(row[j]);
  }
}

/// float32 -> bf16 as the tensor conversion (to_dtype) rounds: nearest even, a NaN as 0xFFFF.
PHALANX_INLINE std::uint16_t round_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0xFFFFu : r);
}

// o may be x: element i is read before it is written.
PHALANX_INLINE void gelu_body(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = round_bf16(gelu_math::gelu_one(widen(x[i])));
}

PHALANX_INLINE void gelu_backward_body(const std::uint16_t* g, const std::uint16_t* x, std::uint16_t* o,
                                       std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = round_bf16(gelu_math::gelu_backward_one(widen(g[i]), widen(x[i])));
}

// o may be a: element i is read before it is written.
PHALANX_INLINE void add_f32_bf16_body(const float* a, const std::uint16_t* b, float* o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = a[i] + widen(b[i]);
}

#define PHALANX_BF16_LEVEL(suffix, target)                                                                      \
  target void relu_##suffix(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) { relu_body(x, o, n); } \
  target void relu_backward_##suffix(const std::uint16_t* g, const std::uint16_t* y, std::uint16_t* o,         \
                                     std::int64_t n) {                                                        \
    relu_backward_body(g, y, o, n);                                                                           \
  }                                                                                                           \
  target void column_sums_##suffix(const std::uint16_t* x, std::int64_t rows, std::int64_t p, float* o) {      \
    column_sums_body(x, rows, p, o);                                                                          \
  }                                                                                                           \
  target void gelu_##suffix(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) { gelu_body(x, o, n); } \
  target void gelu_backward_##suffix(const std::uint16_t* g, const std::uint16_t* x, std::uint16_t* o,         \
                                     std::int64_t n) {                                                        \
    gelu_backward_body(g, x, o, n);                                                                           \
  }                                                                                                           \
  target void add_f32_bf16_##suffix(const float* a, const std::uint16_t* b, float* o, std::int64_t n) {        \
    add_f32_bf16_body(a, b, o, n);                                                                            \
  }

PHALANX_BF16_LEVEL(scalar, )
#ifdef PHALANX_BF16_X86
PHALANX_BF16_LEVEL(avx2, PHALANX_TARGET("avx2,fma"))
#endif

/// 1: AVX2 with FMA (the AVX2 level is compiled with FMA: GELU's std::fma), 0: baseline;
/// capped by PHALANX_BF16_SIMD (its "avx512" means AVX2 here).
int level() { return std::min(simd_level("PHALANX_BF16_SIMD", false, true), 1); }

}  // namespace

void relu_bf16(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) {
#ifdef PHALANX_BF16_X86
  switch (level()) {
    case 1: return relu_avx2(x, o, n);
    default: break;
  }
#endif
  relu_scalar(x, o, n);
}

void relu_backward_bf16(const std::uint16_t* g, const std::uint16_t* y, std::uint16_t* o, std::int64_t n) {
#ifdef PHALANX_BF16_X86
  switch (level()) {
    case 1: return relu_backward_avx2(g, y, o, n);
    default: break;
  }
#endif
  relu_backward_scalar(g, y, o, n);
}

void column_sums_bf16(const std::uint16_t* x, std::int64_t rows, std::int64_t p, float* o) {
#ifdef PHALANX_BF16_X86
  switch (level()) {
    case 1: return column_sums_avx2(x, rows, p, o);
    default: break;
  }
#endif
  column_sums_scalar(x, rows, p, o);
}

void gelu_bf16(const std::uint16_t* x, std::uint16_t* o, std::int64_t n) {
#ifdef PHALANX_BF16_X86
  if (level() == 1) return gelu_avx2(x, o, n);
#endif
  gelu_scalar(x, o, n);
}

void gelu_backward_bf16(const std::uint16_t* g, const std::uint16_t* x, std::uint16_t* o, std::int64_t n) {
#ifdef PHALANX_BF16_X86
  if (level() == 1) return gelu_backward_avx2(g, x, o, n);
#endif
  gelu_backward_scalar(g, x, o, n);
}

void add_f32_bf16(const float* a, const std::uint16_t* b, float* o, std::int64_t n) {
#ifdef PHALANX_BF16_X86
  if (level() == 1) return add_f32_bf16_avx2(a, b, o, n);
#endif
  add_f32_bf16_scalar(a, b, o, n);
}

}  // namespace phalanx::cpu
