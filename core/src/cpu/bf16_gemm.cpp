#include "cpu/bf16_gemm.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PHALANX_BF16_X86 1
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the deliberately undefined vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/warning.hpp"

namespace phalanx {
DeviceKernels& cpu_kernels();  // cpu_kernels.cpp
}

namespace phalanx::cpu {

bool has_avx512_bf16() {
#ifdef PHALANX_BF16_X86
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

bool has_amx_bf16() {
#ifdef PHALANX_BF16_X86
  // AMX's tile data is off until the process asks Linux for it (arch_prctl, Linux 5.16+);
  // a refusal (older kernel, a seccomp filter) leaves the vdpbf16ps path.
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!has_avx512_bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return tile && bf16 && ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

Bf16Path bf16_gemm_path() {
  const std::string mode =
      env::choice("PHALANX_BF16_GEMM", "auto", {"auto", "amx", "avx512bf16", "fallback"});
  if (mode == "fallback") return Bf16Path::Fallback;
  if (mode == "amx") {
    if (!has_amx_bf16())
      throw ConfigError("PHALANX_BF16_GEMM=amx, but this CPU (or the kernel) gives this process no AMX-BF16 "
                        "tiles; unset it or use auto, avx512bf16 or fallback");
    return Bf16Path::Amx;
  }
  if (mode == "avx512bf16") {
    if (!has_avx512_bf16())
      throw ConfigError("PHALANX_BF16_GEMM=avx512bf16, but this CPU has no AVX512_BF16; unset it or use "
                        "auto (or fallback)");
    return Bf16Path::Avx512Bf16;
  }
  if (has_amx_bf16()) return Bf16Path::Amx;
  if (has_avx512_bf16()) return Bf16Path::Avx512Bf16;
  warn_once("bf16_gemm_fallback",
            "this CPU has no AVX512_BF16: bfloat16 matrix products convert to float32 and use the float32 "
            "GEMM (same results within bf16 rounding, slower)");
  return Bf16Path::Fallback;
}

// ---- conversions: plain loops the compiler vectorises, one clone per level ----
__attribute__((target_clones("avx512f", "avx2", "default")))
void floats_to_bf16(const float* __restrict s, std::uint16_t* __restrict d, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, s + i, 4);
    const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    d[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0xffffu : r);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void bf16_to_floats(const std::uint16_t* __restrict s, float* __restrict d, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(s[i]) << 16;
    std::memcpy(d + i, &u, 4);
  }
}

namespace {

// The fallback's store: o = round(v) or round(v + beta * o), c10's round_to_nearest_even
// (float_to_bf16: NaN as 0x7FC0), one pass the compiler vectorises (no FMA contraction in this
// build: the same bits as the scalar rule on every clone). AVX2 and baseline only: an AVX-512
// clone could not be executed where this was written, and would first run in CI.
__attribute__((target_clones("avx2", "default")))
void store_rounded(const float* __restrict v, std::uint16_t* __restrict o, std::int64_t n, float beta) {
  const auto round = [](float w) {
    std::uint32_t u;
    std::memcpy(&u, &w, 4);
    const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : r);
  };
  if (beta == 0.f) {
    for (std::int64_t j = 0; j < n; ++j) o[j] = round(v[j]);
    return;
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const std::uint32_t ob = static_cast<std::uint32_t>(o[j]) << 16;
    float of;
    std::memcpy(&of, &ob, 4);
    o[j] = round(v[j] + beta * of);
  }
}

// The fallback: the float32 GEMM on widened copies (dense, in A's and B's stored layouts).
void gemm_fallback(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta,
                   void* c, std::int64_t ldc, bool c_bf16) {
  // Scratch that only grows: resize() to a smaller then a larger size value-initialises the
  // difference on every call (a GPT step alternates shapes: memset was 3.5 % of its bf16 step).
  thread_local std::vector<float> fa_buf, fb_buf, fc_buf;
  const auto scratch = [](std::vector<float>& v, std::int64_t count) {
    if (v.size() < static_cast<std::size_t>(count)) v.resize(static_cast<std::size_t>(count));
    return v.data();
  };
  const std::int64_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
  float* fa = scratch(fa_buf, ra * ca);
  float* fb = scratch(fb_buf, rb * cb);
  for (std::int64_t r = 0; r < ra; ++r) bf16_to_floats(a + r * lda, fa + r * ca, ca);
  for (std::int64_t r = 0; r < rb; ++r) bf16_to_floats(b + r * ldb, fb + r * cb, cb);
  DeviceKernels& f32 = cpu_kernels();
  if (!c_bf16) {
    f32.gemm(ta, tb, m, n, k, alpha, fa, std::max<std::int64_t>(ca, 1), fb, std::max<std::int64_t>(cb, 1), beta,
             static_cast<float*>(c), ldc);
    return;
  }
  float* fc = scratch(fc_buf, m * n);
  f32.gemm(ta, tb, m, n, k, alpha, fa, std::max<std::int64_t>(ca, 1), fb, std::max<std::int64_t>(cb, 1), 0.f, fc,
           std::max<std::int64_t>(n, 1));
  auto* cc = static_cast<std::uint16_t*>(c);
  for (std::int64_t i = 0; i < m; ++i) store_rounded(fc + i * n, cc + i * ldc, n, beta);
}

#ifdef PHALANX_BF16_X86
constexpr std::int64_t kMR = 8;   // rows of C per register block
constexpr std::int64_t kNR = 32;  // columns per block: two zmm of 16 float32 sums

inline std::uint32_t pair(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
}

#define PHALANX_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

// C block (8 x 32) = A panel (kp pairs x 8 rows, each a packed bf16 pair) . B slab (kp pairs x
// 32 columns, each a packed pair). vdpbf16ps adds both products of a pair to a float32 lane;
// the A pair is a 32-bit broadcast (folded into the instruction's {1to16} operand).
PHALANX_BF16_TARGET void block_8x32(const std::uint32_t* __restrict ap, const std::uint16_t* __restrict bp,
                                    std::int64_t kp, __m512* out) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  for (std::int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 64);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * 64 + 32);
    const std::uint32_t* a = ap + p * kMR;
#define PHALANX_ROW(r)                                                        \
  {                                                                           \
    const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r])); \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, x, b0);                               \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, x, b1);                               \
  }
    PHALANX_ROW(0) PHALANX_ROW(1) PHALANX_ROW(2) PHALANX_ROW(3)
    PHALANX_ROW(4) PHALANX_ROW(5) PHALANX_ROW(6) PHALANX_ROW(7)
#undef PHALANX_ROW
  }
  out[0] = c00, out[1] = c01, out[2] = c10, out[3] = c11, out[4] = c20, out[5] = c21, out[6] = c30, out[7] = c31;
  out[8] = c40, out[9] = c41, out[10] = c50, out[11] = c51, out[12] = c60, out[13] = c61, out[14] = c70,
  out[15] = c71;
}

// float32 -> bf16 as c10's round_to_nearest_even (NaN -> 0x7FC0), 16 lanes.
PHALANX_BF16_TARGET inline __m512i round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc0));
}

// Writes alpha * acc + beta * C for `cnt` (1..16) columns at dst.
PHALANX_BF16_TARGET inline void store16(__m512 acc, float alpha, float beta, void* dst, int cnt, bool c_bf16) {
  const __mmask16 mask = static_cast<__mmask16>(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u);
  __m512 v = alpha == 1.f ? acc : _mm512_mul_ps(_mm512_set1_ps(alpha), acc);
  if (c_bf16) {
    auto* d = static_cast<std::uint16_t*>(dst);
    if (beta != 0.f) {
      alignas(32) std::uint16_t tmp[16] = {};
      std::memcpy(tmp, d, static_cast<std::size_t>(cnt) * 2);
      const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tmp))), 16);
      v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_castsi512_ps(w), v);
    }
    _mm512_mask_cvtepi32_storeu_epi16(d, mask, round_bf16(v));
  } else {
    auto* d = static_cast<float*>(dst);
    if (beta != 0.f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, d), v);
    _mm512_mask_storeu_ps(d, mask, v);
  }
}

PHALANX_BF16_TARGET void gemm_avx512(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                     float alpha, const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
                                     std::int64_t ldb, float beta, void* c, std::int64_t ldc, bool c_bf16) {
  // Pairs along k (an odd k ends with a pair whose upper half is 0), 8-row panels of op(A)
  // packed once, 32-column slabs of op(B) packed one at a time: every block reads both
  // contiguously, whatever the trans flags.
  const std::int64_t kp = (k + 1) / 2;
  const std::int64_t m8 = (m + kMR - 1) / kMR * kMR;
  thread_local std::vector<std::uint32_t> apack;
  thread_local std::vector<std::uint16_t> slab;
  apack.assign(static_cast<std::size_t>(m8 * kp), 0u);
  slab.resize(static_cast<std::size_t>(kp * 2 * kNR));
  const bool odd = (k & 1) != 0;
  for (std::int64_t i = 0; i < m; ++i) {
    std::uint32_t* panel = apack.data() + (i / kMR) * kMR * kp + (i % kMR);
    if (!ta) {
      const std::uint16_t* row = a + i * lda;
      const std::int64_t full = k / 2;
      for (std::int64_t p = 0; p < full; ++p) {
        std::uint32_t v;
        std::memcpy(&v, row + 2 * p, 4);
        panel[p * kMR] = v;
      }
      if (odd) panel[full * kMR] = row[k - 1];
    } else {
      for (std::int64_t p = 0; p < kp; ++p) {
        const std::uint16_t lo = a[2 * p * lda + i];
        const std::uint16_t hi = 2 * p + 1 < k ? a[(2 * p + 1) * lda + i] : std::uint16_t{0};
        panel[p * kMR] = pair(lo, hi);
      }
    }
  }
  __m512 acc[16];
  for (std::int64_t j = 0; j < n; j += kNR) {
    const std::int64_t cols = std::min<std::int64_t>(kNR, n - j);
    // slab[p * 64 + v * 32 + 2 * q + t] = op(B)(2p + t, j + 16v + q), zero outside.
    auto* s32 = reinterpret_cast<std::uint32_t*>(slab.data());
    if (tb) {  // op(B)(kk, col) = b[col * ldb + kk]: a pair is 32 contiguous bits of B's row col
      for (std::int64_t p = 0; p < kp; ++p) {
        std::uint32_t* dst = s32 + p * kNR;
        for (std::int64_t q = 0; q < kNR; ++q) {
          std::uint32_t v = 0;
          if (q < cols) {
            const std::uint16_t* src = b + (j + q) * ldb + 2 * p;
            if (2 * p + 1 < k) std::memcpy(&v, src, 4);
            else v = src[0];
          }
          dst[(q / 16) * 16 + q % 16] = v;
        }
      }
    } else {  // op(B)(kk, col) = b[kk * ldb + col]: interleave rows 2p and 2p + 1
      for (std::int64_t p = 0; p < kp; ++p) {
        std::uint16_t* dst = slab.data() + p * 2 * kNR;
        const std::uint16_t* r0 = b + 2 * p * ldb + j;
        const bool has1 = 2 * p + 1 < k;
        const std::uint16_t* r1 = has1 ? r0 + ldb : nullptr;
        if (has1 && cols == kNR) {
          for (int q = 0; q < kNR; q += 8) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + q));
            const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + q));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * q), _mm_unpacklo_epi16(x, y));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * q + 8), _mm_unpackhi_epi16(x, y));
          }
        } else {
          for (std::int64_t q = 0; q < kNR; ++q) {
            dst[2 * q] = q < cols ? r0[q] : std::uint16_t{0};
            dst[2 * q + 1] = q < cols && has1 ? r1[q] : std::uint16_t{0};
          }
        }
      }
    }
    for (std::int64_t i = 0; i < m; i += kMR) {
      const std::int64_t rows = std::min<std::int64_t>(kMR, m - i);
      block_8x32(apack.data() + i * kp, slab.data(), kp, acc);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t off = (i + r) * ldc + j;
        void* d0 = c_bf16 ? static_cast<void*>(static_cast<std::uint16_t*>(c) + off)
                          : static_cast<void*>(static_cast<float*>(c) + off);
        store16(acc[2 * r], alpha, beta, d0, static_cast<int>(std::min<std::int64_t>(cols, 16)), c_bf16);
        if (cols > 16) {
          void* d1 = c_bf16 ? static_cast<void*>(static_cast<std::uint16_t*>(c) + off + 16)
                            : static_cast<void*>(static_cast<float*>(c) + off + 16);
          store16(acc[2 * r + 1], alpha, beta, d1, static_cast<int>(cols - 16), c_bf16);
        }
      }
    }
  }
}

// AMX: C tiles of 16 x 16 float32 += A tiles (16 rows x 32 bf16 along k) . B tiles (16 pairs
// along k x 16 columns, each a bf16 pair): tdpbf16ps. Eight tile registers make a 32 x 32 C
// block (tiles 0-3) from two A tiles (4, 5) and two B tiles (6, 7) per 32 steps of k.
// A is packed to [m32][k32] (rows and k zero-padded to 32), B to 16-column slabs of k32 / 2
// pair rows (64 bytes each): every tile load is one strided read of packed memory.
struct alignas(64) TileConfig {
  std::uint8_t palette_id = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

#define PHALANX_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx2")))

PHALANX_AMX_TARGET void gemm_amx(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                 const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
                                 float beta, void* c, std::int64_t ldc, bool c_bf16) {
  const std::int64_t m32 = (m + 31) / 32 * 32, n32 = (n + 31) / 32 * 32, k32 = (k + 31) / 32 * 32;
  thread_local std::vector<std::uint16_t> ap, bp;
  ap.resize(static_cast<std::size_t>(m32 * k32));
  bp.resize(static_cast<std::size_t>(n32 * k32));
  // Only the padding is zeroed: filling the whole buffers cost 8 % of a 128 x 1024 x 1024 product.
  std::memset(ap.data() + m * k32, 0, static_cast<std::size_t>((m32 - m) * k32) * 2);
  for (std::int64_t i = 0; i < m; ++i) {
    std::uint16_t* dst = ap.data() + i * k32;
    if (!ta) std::memcpy(dst, a + i * lda, static_cast<std::size_t>(k) * 2);
    else
      for (std::int64_t p = 0; p < k; ++p) dst[p] = a[p * lda + i];
    std::memset(dst + k, 0, static_cast<std::size_t>(k32 - k) * 2);
  }
  // bp[s * k32 * 16 + p * 32 + 2q + t] = op(B)(2p + t, 16s + q)
  for (std::int64_t s = 0; s < n32 / 16; ++s) {
    std::uint16_t* slab = bp.data() + s * k32 * 16;
    const std::int64_t cols = std::max<std::int64_t>(0, std::min<std::int64_t>(16, n - s * 16));
    const std::int64_t kp = (k + 1) / 2;
    std::memset(slab + kp * 32, 0, static_cast<std::size_t>(k32 / 2 - kp) * 64);
    std::int64_t p0 = 0;
    if (tb && cols == 16) {  // 8 pairs of 16 rows of B at a time: two 8 x 8 transposes of 32-bit pairs
      const std::uint16_t* rows = b + s * 16 * ldb;
      for (; 2 * p0 + 16 <= k; p0 += 8)
        for (int h = 0; h < 2; ++h) {
          __m256i r[8];
          for (int q = 0; q < 8; ++q)
            r[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + (h * 8 + q) * ldb + 2 * p0));
          const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
          const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
          const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
          const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
          const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
          const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
          const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
          const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
          const __m256i o[8] = {_mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
                                _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
                                _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
                                _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
          for (int q = 0; q < 8; ++q)  // pair p0 + q of columns h * 8 .. h * 8 + 7
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(slab + (p0 + q) * 32 + h * 16), o[q]);
        }
    }
    for (std::int64_t p = p0; 2 * p < k; ++p) {
      std::uint16_t* dst = slab + p * 32;
      const bool has1 = 2 * p + 1 < k;
      std::memset(dst + 2 * cols, 0, static_cast<std::size_t>(16 - cols) * 4);
      if (tb) {
        {
          for (std::int64_t q = 0; q < cols; ++q) {
            const std::uint16_t* src = b + (s * 16 + q) * ldb + 2 * p;
            dst[2 * q] = src[0];
            dst[2 * q + 1] = has1 ? src[1] : std::uint16_t{0};
          }
        }
      } else {
        const std::uint16_t* r0 = b + 2 * p * ldb + s * 16;
        if (has1 && cols == 16) {
          for (int q = 0; q < 16; q += 8) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + q));
            const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + ldb + q));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * q), _mm_unpacklo_epi16(x, y));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * q + 8), _mm_unpackhi_epi16(x, y));
          }
        } else {
          for (std::int64_t q = 0; q < cols; ++q) {
            dst[2 * q] = r0[q];
            dst[2 * q + 1] = has1 ? r0[ldb + q] : std::uint16_t{0};
          }
        }
      }
    }
  }
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) float tmp[32 * 32];
  const std::int64_t astride = k32 * 2;
  // GotoBLAS's loops around the 32 x 32 tile block: k in blocks of kKc, columns in panels
  // of kNc (the panel's packed B, kKc x kNc bf16 = 256 KiB, stays in L2), then 32-row blocks of
  // A (32 x kKc bf16 = 32 KiB, in L1 while it meets every 32 columns of the panel). Between k
  // blocks the C tiles wait in cbuf (float32: exact); with a single k block they start at
  // zero and go straight to the epilogue.
  constexpr std::int64_t kKc = 512, kNc = 256;
  thread_local std::vector<float> cbuf;
  const bool blocked = k32 > kKc;
  if (blocked) cbuf.resize(static_cast<std::size_t>(m32 * n32));
  for (std::int64_t kc0 = 0; kc0 < k32; kc0 += kKc) {
    const std::int64_t kc1 = std::min(k32, kc0 + kKc);
    const bool first = kc0 == 0, last = kc1 == k32;
    for (std::int64_t j0 = 0; j0 < n; j0 += kNc) {
      const std::int64_t j1 = std::min(n, j0 + kNc);
      for (std::int64_t i = 0; i < m; i += 32) {
        const std::uint16_t* a0 = ap.data() + i * k32;
        const std::uint16_t* a1 = a0 + 16 * k32;
        for (std::int64_t j = j0; j < j1; j += 32) {
          const std::uint16_t* b0 = bp.data() + (j / 16) * k32 * 16;
          const std::uint16_t* b1 = b0 + k32 * 16;
          float* cb = blocked ? cbuf.data() + i * n32 + j : nullptr;  // rows n32 floats apart
          const std::int64_t cstride = n32 * 4;
          if (first) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
          } else {
            _tile_loadd(0, cb, cstride);
            _tile_loadd(1, cb + 16, cstride);
            _tile_loadd(2, cb + 16 * n32, cstride);
            _tile_loadd(3, cb + 16 * n32 + 16, cstride);
          }
          for (std::int64_t kk = kc0; kk < kc1; kk += 32) {
            _tile_loadd(4, a0 + kk, astride);
            _tile_loadd(5, a1 + kk, astride);
            _tile_loadd(6, b0 + kk * 16, 64);
            _tile_loadd(7, b1 + kk * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          if (!last) {
            _tile_stored(0, cb, cstride);
            _tile_stored(1, cb + 16, cstride);
            _tile_stored(2, cb + 16 * n32, cstride);
            _tile_stored(3, cb + 16 * n32 + 16, cstride);
            continue;
          }
          _tile_stored(0, tmp, 128);
          _tile_stored(1, tmp + 16, 128);
          _tile_stored(2, tmp + 16 * 32, 128);
          _tile_stored(3, tmp + 16 * 32 + 16, 128);
          const std::int64_t rows = std::min<std::int64_t>(32, m - i), cols = std::min<std::int64_t>(32, n - j);
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t off = (i + r) * ldc + j;
            void* d0 = c_bf16 ? static_cast<void*>(static_cast<std::uint16_t*>(c) + off)
                              : static_cast<void*>(static_cast<float*>(c) + off);
            store16(_mm512_load_ps(tmp + r * 32), alpha, beta, d0,
                    static_cast<int>(std::min<std::int64_t>(cols, 16)), c_bf16);
            if (cols > 16) {
              void* d1 = c_bf16 ? static_cast<void*>(static_cast<std::uint16_t*>(c) + off + 16)
                                : static_cast<void*>(static_cast<float*>(c) + off + 16);
              store16(_mm512_load_ps(tmp + r * 32 + 16), alpha, beta, d1, static_cast<int>(cols - 16), c_bf16);
            }
          }
        }
      }
    }
  }
  _tile_release();
}
#endif

}  // namespace

void bf16_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta,
               void* c, std::int64_t ldc, bool c_bf16) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta * C (BLAS: C is not read when beta is 0)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        if (c_bf16) {
          std::uint16_t& o = static_cast<std::uint16_t*>(c)[i * ldc + j];
          o = float_to_bf16(beta == 0.f ? 0.f : beta * bf16_to_float(o));
        } else {
          float& o = static_cast<float*>(c)[i * ldc + j];
          o = beta == 0.f ? 0.f : beta * o;
        }
      }
    return;
  }
  const Bf16Path path = bf16_gemm_path();  // validates PHALANX_BF16_GEMM, notes the fallback
#ifdef PHALANX_BF16_X86
  if (path == Bf16Path::Amx) {
    gemm_amx(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, c_bf16);
    return;
  }
  if (path == Bf16Path::Avx512Bf16) {
    gemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, c_bf16);
    return;
  }
#else
  (void)path;
#endif
  gemm_fallback(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, c_bf16);
}

}  // namespace phalanx::cpu

namespace phalanx {

bool cpu_has_avx512_bf16() { return cpu::has_avx512_bf16(); }

std::string bf16_gemm_info() {
  switch (cpu::bf16_gemm_path()) {
    case cpu::Bf16Path::Amx: return "amx (tdpbf16ps tiles)";
    case cpu::Bf16Path::Avx512Bf16: return "avx512bf16 (vdpbf16ps)";
    case cpu::Bf16Path::Fallback: break;
  }
  return std::string("fallback: float32 GEMM on converted operands (") +
         (cpu::has_avx512_bf16() ? "PHALANX_BF16_GEMM=fallback" : "no AVX512_BF16 on this CPU") + ")";
}

bool cpu_has_amx_bf16() { return cpu::has_amx_bf16(); }

}  // namespace phalanx
