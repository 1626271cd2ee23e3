// Sums of 16-bit float arrays (phalanx/core/half_sum.hpp). The AVX2 code adds the widened
// sources with vaddps in the scalar code's order and rounds with the F16C lanes of
// fp16_lanes.hpp (float16) or the integer rule of float_to_bf16 (bfloat16), so every lane holds
// the scalar code's bits; 8 float16 lanes whose sum is NaN are summed again by the scalar code,
// whose add() fixes which NaN (so which sign) wins. Float16 sources are widened with a bare
// vcvtph2ps: it quiets a signalling NaN where fp16_to_float keeps it signalling, which only such
// lanes could see, and they are redone. The bfloat16 code needs no F16C but shares the template;
// every AVX2 CPU has F16C (Haswell and later, every Zen). No AVX-512 variant: none can run where
// this was written (Zen 3); an AVX-512 CPU runs the AVX2 one.
#include "phalanx/core/half_sum.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/fp16_lanes.hpp"
#include "cpu/simd_level.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/half.hpp"

#define PHX_INLINE inline __attribute__((always_inline))

namespace phalanx {

namespace {

void check_sources(const char* what, int nsrc) {
  if (nsrc < 1) throw ValueError(std::string(what) + ": " + std::to_string(nsrc) + " sources; pass at least one");
}

PHX_INLINE const std::uint16_t* at(const void* p, std::size_t i) { return static_cast<const std::uint16_t*>(p) + i; }

/// acc + x, where a NaN x is the sum (the later NaN wins): the NaN's sign is what float16 keeps,
/// and which NaN an add returns is up to the compiler's operand order (x86 returns its first
/// operand's). The plugins' old loops, as compiled, returned the later source's: this rule.
PHX_INLINE float add(float acc, float x) { return x != x ? x : acc + x; }

/// Elements [from, n) by the scalar rules of half.hpp, a block at a time: each source's loop
/// over the block is one the compiler vectorises where the rules allow it (bfloat16's). NanSign:
/// the result keeps a NaN's sign (float16), so add() picks which NaN wins.
template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float), bool NanSign>
void sum_scalar(std::uint16_t* dst, std::uint16_t* dst2, const void* const* src, int nsrc, std::size_t from,
                std::size_t n) {
  constexpr std::size_t kBlock = 2048;  // 8 KB of float32 sums: inside L1
  float acc[kBlock];
  std::uint16_t out[kBlock];
  for (std::size_t b = from; b < n; b += kBlock) {
    // Every source's part of the block is read before a destination (maybe a source) is written.
    const std::size_t m = std::min(kBlock, n - b);
    const std::uint16_t* s0 = at(src[0], b);
    for (std::size_t i = 0; i < m; ++i) acc[i] = Load(s0[i]);
    for (int q = 1; q < nsrc; ++q) {
      const std::uint16_t* s = at(src[q], b);
      if (NanSign)
        for (std::size_t i = 0; i < m; ++i) acc[i] = add(acc[i], Load(s[i]));
      else  // which NaN wins does not matter: a plain add, which the compiler vectorises
        for (std::size_t i = 0; i < m; ++i) acc[i] += Load(s[i]);
    }
    for (std::size_t i = 0; i < m; ++i) out[i] = Store(acc[i]);
    if (dst) std::memcpy(dst + b, out, m * 2);
    if (dst2) std::memcpy(dst2 + b, out, m * 2);
  }
}

#ifdef PHALANX_FP16_X86
struct Fp16Lanes {
  static constexpr bool kNanSign = true;  // float_to_fp16 keeps a NaN's sign
  static constexpr auto load = fp16_to_float;
  static constexpr auto store = float_to_fp16;
  __attribute__((target("avx2,f16c"))) static __m256 widen(__m128i h) { return _mm256_cvtph_ps(h); }
  __attribute__((target("avx2,f16c"))) static __m128i narrow(__m256 x) { return cpu::floats_to_fp16_8(x); }
};

struct Bf16Lanes {
  static constexpr bool kNanSign = false;  // float_to_bf16 writes every NaN as 0x7FC0
  static constexpr auto load = bf16_to_float;
  static constexpr auto store = float_to_bf16;
  __attribute__((target("avx2"))) static __m256 widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // float_to_bf16: u + 0x7FFF + ((u >> 16) & 1), top 16 bits; a NaN lane gives 0x7FC0.
  __attribute__((target("avx2"))) static __m128i narrow(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // abs >= 0: signed is fine
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i b = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);  // 0..0xFFFF: packus keeps it
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  }
};

template <class L>
__attribute__((target("avx2,f16c"))) void sum_avx2(std::uint16_t* dst, std::uint16_t* dst2, const void* const* src,
                                                    int nsrc, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // All sources of these 8 lanes are read before either destination is written: a
    // destination may be a source.
    __m256 acc = L::widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at(src[0], i))));
    for (int q = 1; q < nsrc; ++q)
      acc = _mm256_add_ps(acc, L::widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at(src[q], i)))));
    if (L::kNanSign && _mm256_movemask_ps(_mm256_cmp_ps(acc, acc, _CMP_UNORD_Q))) {
      // A NaN lane: its sign is add()'s rule, not vaddps's operand order. Rare: these 8 again.
      _mm256_zeroupper();  // SSE code next (see the end)
      sum_scalar<L::load, L::store, L::kNanSign>(dst, dst2, src, nsrc, i, i + 8);
      continue;
    }
    const __m128i o = L::narrow(acc);
    if (dst) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), o);
    if (dst2) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst2 + i), o);
  }
  // The upper halves of the ymm registers cleared before the SSE code of the tail and of the
  // caller: GCC 12 emits no vzeroupper before this (tail) call for the float16 instance, and
  // dirty upper halves slow every later SSE instruction on Intel until one runs (Skylake and
  // later: a merge per instruction; Haswell: a state switch). A test reads XINUSE after a sum.
  _mm256_zeroupper();
  sum_scalar<L::load, L::store, L::kNanSign>(dst, dst2, src, nsrc, i, n);
}
#endif

}  // namespace

void fp16_sum(void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n) {
  check_sources("fp16_sum", nsrc);
  auto* d = static_cast<std::uint16_t*>(dst);
  auto* d2 = static_cast<std::uint16_t*>(dst2);
#ifdef PHALANX_FP16_X86
  if (cpu::use_f16c()) return sum_avx2<Fp16Lanes>(d, d2, src, nsrc, n);
#else
  cpu::use_f16c();
#endif
  sum_scalar<fp16_to_float, float_to_fp16, true>(d, d2, src, nsrc, 0, n);
}

void bf16_sum(void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n) {
  check_sources("bf16_sum", nsrc);
  auto* d = static_cast<std::uint16_t*>(dst);
  auto* d2 = static_cast<std::uint16_t*>(dst2);
  // Read (and validated) on every CPU, so a typo is an error everywhere. "avx512" means AVX2.
  const int level = cpu::simd_level("PHALANX_BF16_SIMD");
#ifdef PHALANX_FP16_X86
  if (level >= 1 && cpu::has_f16c()) return sum_avx2<Bf16Lanes>(d, d2, src, nsrc, n);
#else
  (void)level;
#endif
  sum_scalar<bf16_to_float, float_to_bf16, false>(d, d2, src, nsrc, 0, n);
}

}  // namespace phalanx
