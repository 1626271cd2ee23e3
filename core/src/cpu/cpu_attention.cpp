// Fused scaled-dot-product attention on the CPU (docs/attention.md): FlashAttention-2's
// algorithm on one core. The forward walks each head's queries in tiles of kBr rows and,
// for each, the keys in tiles of kBc columns, keeping per row the running maximum m, the
// running sum l of exp(score - m) and the unnormalised output (the online softmax); the
// backward walks key tiles outer and query tiles inner, recomputing each tile of weights
// from q, k and the saved per-row maximum and sum. Neither ever holds more than one kBr x kBc
// tile of scores: the working memory is the per-head padded copies of q, k, v (and do, dq)
// and grows linearly with L and S.
//
// The tile products are small GEMMs with the output held in registers (at AVX-512, 4 rows
// x 64 columns or 8 x 32; GCC vector types in each level's native width); on tiles the
// causal diagonal crosses they skip the masked part. The whole per-head loop is compiled
// three times, for AVX-512F+DQ, AVX2 and baseline x86-64, and the best the CPU has is
// picked at each call (PHALANX_ATTENTION_SIMD=scalar|avx2|avx512 caps it; the tests
// compare the three). exp is a vectorised Cephes polynomial (about 2 ulp), as PyTorch's own
// vectorised softmax uses Sleef's rather than libm's. A row whose every score is masked
// gives zeros (PyTorch 2.5+).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/cpu_kernels.hpp"
#include "cpu/simd_level.hpp"
#include "phalanx/core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_ATTN_X86 1
#define PHALANX_ATTN_TARGET(t) __attribute__((target(t)))
#else
#define PHALANX_ATTN_TARGET(t)
#endif

// The 64-byte vector helpers are always inlined into the per-level functions: the ABI of
// passing them by value without AVX-512 never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace phalanx {

namespace {

#define PHALANX_ATTN_INLINE inline __attribute__((always_inline))

constexpr std::int64_t kBr = 64;  // query rows per tile
constexpr std::int64_t kBc = 64;  // key columns per tile
constexpr std::int64_t kPad = 16; // head dims are padded to a multiple of this (one AVX-512 vector)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

// ---- vectors: each level computes in its native width ----
// GCC's generic vectors wider than the target's registers are lowered badly (arrays of them
// spill through integer registers), so the AVX-512 code uses 16 floats, the AVX2 code 8 and
// the baseline code 4. Loads and stores are unaligned and may alias.
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef std::int32_t i16 __attribute__((vector_size(64)));
typedef std::int32_t i8 __attribute__((vector_size(32)));
typedef std::int32_t i4 __attribute__((vector_size(16)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float v4u __attribute__((vector_size(16), aligned(4), may_alias));

template <int kLevel> struct Simd;
template <> struct Simd<2> { using V = v16; using I = i16; using U = v16u; };
template <> struct Simd<1> { using V = v8; using I = i8; using U = v8u; };
template <> struct Simd<0> { using V = v4; using I = i4; using U = v4u; };

template <int kLevel> using Vec = typename Simd<kLevel>::V;
/// Floats per native vector.
template <int kLevel> constexpr std::int64_t kVW = sizeof(Vec<kLevel>) / sizeof(float);

template <int kLevel>
PHALANX_ATTN_INLINE Vec<kLevel> load(const float* p) { return *reinterpret_cast<const typename Simd<kLevel>::U*>(p); }
template <int kLevel>
PHALANX_ATTN_INLINE void store(float* p, Vec<kLevel> v) { *reinterpret_cast<typename Simd<kLevel>::U*>(p) = v; }
template <int kLevel>
PHALANX_ATTN_INLINE Vec<kLevel> splat(float x) { return Vec<kLevel>{} + x; }

/// exp(x) for x <= 88 (scores minus their row maximum are <= 0): Cephes' expf, 2^n by
/// exponent bits. Below -87.3 (where expf underflows to denormals) and at -inf it gives 0;
/// NaN stays NaN.
template <int kLevel>
PHALANX_ATTN_INLINE Vec<kLevel> exp_v(Vec<kLevel> x) {
  using V = Vec<kLevel>;
  using I = typename Simd<kLevel>::I;
  const V lo = V{} - 87.3f, hi = V{} + 88.f, zero = V{};
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const V fx = xc * 1.44269504088896341f + 0.5f;
  V tf = __builtin_convertvector(__builtin_convertvector(fx, I), V);  // truncation toward zero
  tf = tf > fx ? tf - 1.f : tf;                                        // floor
  V r = xc - tf * 0.693359375f;
  r = r - tf * -2.12194440e-4f;
  const V r2 = r * r;
  V y = zero + 1.9875691500E-4f;
  y = y * r + 1.3981999507E-3f;
  y = y * r + 8.3334519073E-3f;
  y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f;
  y = y * r + 5.0000001201E-1f;
  y = y * r2 + r + 1.f;
  const I e = (__builtin_convertvector(tf, I) + 127) << 23;
  V out = y * (V)e;  // GCC vector cast: the same bits, reinterpreted
  out = x < lo ? zero : out;
  out = x != x ? x : out;
  return out;
}

// Horizontal max and sum by halving, not a chain of dependent scalar steps.
PHALANX_ATTN_INLINE float hmax(v4 c) {
  const float x = c[0] > c[1] ? c[0] : c[1], y = c[2] > c[3] ? c[2] : c[3];
  return x > y ? x : y;
}
PHALANX_ATTN_INLINE float hmax(v8 v) {
  const v4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3), b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return hmax(a > b ? a : b);
}
PHALANX_ATTN_INLINE float hmax(v16 v) {
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
           b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return hmax(a > b ? a : b);
}
PHALANX_ATTN_INLINE float hsum(v4 c) { return (c[0] + c[2]) + (c[1] + c[3]); }
PHALANX_ATTN_INLINE float hsum(v8 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
PHALANX_ATTN_INLINE float hsum(v16 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/// dst[c * ld + r] = src[r * src_ld + c] for r < rows, c < cols: 16 source rows at a time, so
/// the rows read stay in L1 and each destination row is written 16 floats at once.
PHALANX_ATTN_INLINE void transpose_into(const float* src, std::int64_t rows, std::int64_t cols, float* dst,
                                        std::int64_t ld, std::int64_t src_ld) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += 16) {
    const std::int64_t n = std::min<std::int64_t>(16, rows - r0);
    for (std::int64_t c = 0; c < cols; ++c) {
      float* d = dst + c * ld + r0;
      const float* s = src + r0 * src_ld + c;
      for (std::int64_t r = 0; r < n; ++r) d[r] = s[r * src_ld];
    }
  }
}

/// dst [dst_rows, ld] = src [rows, cols] (rows src_ld apart) with zeros in the padding (columns
/// >= cols, rows >= rows): one copy when nothing is padded on the right and src is dense.
PHALANX_ATTN_INLINE void copy_padded(const float* src, std::int64_t rows, std::int64_t cols, float* dst,
                                     std::int64_t ld, std::int64_t dst_rows, std::int64_t src_ld) {
  if (cols == ld && src_ld == cols) {
    std::memcpy(dst, src, sizeof(float) * rows * cols);
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * ld, src + r * src_ld, sizeof(float) * cols);
      std::fill(dst + r * ld + cols, dst + (r + 1) * ld, 0.f);
    }
  }
  std::fill(dst + rows * ld, dst + dst_rows * ld, 0.f);
}

/// dst [cols, ld] = src [rows, cols] transposed, zeros in columns >= rows.
PHALANX_ATTN_INLINE void transpose_padded(const float* src, std::int64_t rows, std::int64_t cols, float* dst,
                                          std::int64_t ld, std::int64_t src_ld) {
  transpose_into(src, rows, cols, dst, ld, src_ld);
  if (rows < ld)
    for (std::int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld + rows, dst + (c + 1) * ld, 0.f);
}

// ---- tile products ----

/// C[R x NV vectors] (+)= op(A) B for one register block: op(A)(r, p) is a[r * lda + p], or
/// a[p * lda + r] when kTA; B is row-major with ldb and NV vectors of columns readable.
template <int kLevel, int R, int NV, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void block(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t k,
                               float* c, std::int64_t ldc) {
  using V = Vec<kLevel>;
  constexpr std::int64_t W = kVW<kLevel>;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAcc ? load<kLevel>(c + r * ldc + v * W) : V{};
  for (std::int64_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load<kLevel>(b + p * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const float ar = kTA ? a[p * lda + r] : a[r * lda + p];
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store<kLevel>(c + r * ldc + v * W, acc[r][v]);
}

/// Rows of a register block for NV column vectors: enough independent accumulators to
/// cover the FMA latency without spilling (AVX-512: 32 registers; AVX2 and SSE: 16).
template <int kLevel, int NV>
constexpr int block_rows() {
  return kLevel == 2 ? (NV >= 3 ? 4 : NV == 2 ? 8 : 12) : kLevel == 1 ? 6 : 4;
}
/// Column vectors per block: AVX-512 up to 4 (64 columns); AVX2 and SSE 2.
template <int kLevel>
constexpr int max_nv() {
  return kLevel == 2 ? 4 : 2;
}

template <int kLevel, int R, int NV, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void rows_tail(std::int64_t rows, const float* a, std::int64_t lda, const float* b,
                                   std::int64_t ldb, std::int64_t k, float* c, std::int64_t ldc) {
  if constexpr (R > 1) {
    if (rows == R - 1) {
      block<kLevel, R - 1, NV, kTA, kAcc>(a, lda, b, ldb, k, c, ldc);
      return;
    }
    rows_tail<kLevel, R - 1, NV, kTA, kAcc>(rows, a, lda, b, ldb, k, c, ldc);
  }
}

template <int kLevel, int NV, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void rows_block(std::int64_t m, const float* a, std::int64_t lda, const float* b,
                                    std::int64_t ldb, std::int64_t k, float* c, std::int64_t ldc) {
  constexpr int R = block_rows<kLevel, NV>();
  std::int64_t i = 0;
  for (; i + R <= m; i += R)
    block<kLevel, R, NV, kTA, kAcc>(kTA ? a + i : a + i * lda, lda, b, ldb, k, c + i * ldc, ldc);
  if (i < m) rows_tail<kLevel, R, NV, kTA, kAcc>(m - i, kTA ? a + i : a + i * lda, lda, b, ldb, k, c + i * ldc, ldc);
}

/// C[m x n] (+)= op(A)[m x k] B[k x n], n a multiple of kPad (the padded widths), row-major.
template <int kLevel, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                              const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  constexpr int kNV = max_nv<kLevel>();
  constexpr std::int64_t W = kVW<kLevel>;
  std::int64_t j = 0;
  for (; j + kNV * W <= n; j += kNV * W) rows_block<kLevel, kNV, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc);
  switch ((n - j) / W) {  // n is a multiple of 16 floats: whole vectors remain
    case 3: rows_block<kLevel, 3, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    case 2: rows_block<kLevel, 2, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    case 1: rows_block<kLevel, 1, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    default: break;
  }
}

/// What a causal tile can skip. On a tile the diagonal crosses (diag = i0 - j0: tile row r
/// sees tile columns c <= r + diag), a product whose output rows are query rows needs only
/// the columns (kCols: the scores, dP) or the depth (kDepth: weights times v, dS times k)
/// up to r + diag; one whose output rows are keys (kTA: dV, dK) only the query rows from
/// c - diag on. Skipped outputs are masked (their scores become -inf) and skipped terms are
/// zero weights, so results are unchanged; about 3/8 of a diagonal tile's work is saved.
enum class Skip { kCols, kDepth };
template <int kLevel, Skip kSkip, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void tile_gemm(bool diagonal, std::int64_t diag, std::int64_t m, std::int64_t n, std::int64_t k,
                                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc) {
  if (!diagonal) {
    gemm<kLevel, kTA, kAcc>(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  constexpr std::int64_t kRows = block_rows<kLevel, max_nv<kLevel>()>();
  constexpr std::int64_t W = kVW<kLevel>;
  for (std::int64_t i = 0; i < m; i += kRows) {
    const std::int64_t rows = std::min(kRows, m - i);
    if constexpr (kTA) {
      static_assert(kAcc, "key-row products accumulate");
      const std::int64_t p0 = std::clamp<std::int64_t>(i - diag, 0, k);
      if (p0 < k) gemm<kLevel, true, true>(rows, n, k - p0, a + p0 * lda + i, lda, b + p0 * ldb, ldb, c + i * ldc, ldc);
    } else if constexpr (kSkip == Skip::kCols) {
      const std::int64_t need = std::min(n, round_up(std::max<std::int64_t>(0, i + rows + diag), W));
      if (need > 0) gemm<kLevel, false, kAcc>(rows, need, k, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
    } else {
      static_assert(kAcc, "depth-limited products accumulate");
      const std::int64_t depth = std::clamp<std::int64_t>(i + rows + diag, 0, k);
      if (depth > 0) gemm<kLevel, false, true>(rows, n, depth, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
    }
  }
}

// ---- dropout stream ----

/// SplitMix64's output function applied after one gamma step: split_mix(seed + n * gamma)
/// is output n (from 0) of SplitMix64 seeded with `seed`.
PHALANX_ATTN_INLINE std::uint64_t split_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The dropout multiplier of weight (head, i, j): 1 / (1 - p) when kept, 0 when dropped.
/// Kept when the top 24 bits of output (head * L + i) * S + j of SplitMix64 seeded with the
/// call's seed, as a float in [0, 1), are >= p (nn::functional::dropout's test).
struct Dropout {
  bool on;
  float p, keep_scale;
  std::uint64_t seed;
  std::int64_t l, s;
  PHALANX_ATTN_INLINE float factor_at(std::uint64_t n) const {
    const float u = static_cast<float>(split_mix(seed + n * 0x9e3779b97f4a7c15ULL) >> 40) * 0x1p-24f;
    return u >= p ? keep_scale : 0.f;
  }
  /// z[c] = the factor of weight (head, i, j0 + c) for c < nc; 8 at a time with AVX-512
  /// (64-bit lanes, AVX-512DQ's multiply), 4 with AVX2.
  template <int kLevel>
  PHALANX_ATTN_INLINE void factors(std::int64_t head, std::int64_t i, std::int64_t j0, std::int64_t nc, float* z) const {
    const auto n0 = static_cast<std::uint64_t>((head * l + i) * s + j0);
    std::int64_t c = 0;
    if constexpr (kLevel == 2) {
      typedef std::uint64_t u64x8 __attribute__((vector_size(64)));
      const u64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
      for (; c + 8 <= nc; c += 8) {
        u64x8 x = seed + (n0 + static_cast<std::uint64_t>(c) + lane) * 0x9e3779b97f4a7c15ULL;
        x += 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        x ^= x >> 31;
        const v8 u = __builtin_convertvector(__builtin_convertvector(x >> 40, i8), v8) * 0x1p-24f;
        const v8 f = u >= p ? v8{} + keep_scale : v8{};
        *reinterpret_cast<v8u*>(z + c) = f;
      }
    } else if constexpr (kLevel == 1) {  // 4 lanes; GCC builds the 64-bit multiplies from vpmuludq
      typedef std::uint64_t u64x4 __attribute__((vector_size(32)));
      const u64x4 lane = {0, 1, 2, 3};
      for (; c + 4 <= nc; c += 4) {
        u64x4 x = seed + (n0 + static_cast<std::uint64_t>(c) + lane) * 0x9e3779b97f4a7c15ULL;
        x += 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        x ^= x >> 31;
        const v4 u = __builtin_convertvector(__builtin_convertvector(x >> 40, i4), v4) * 0x1p-24f;
        const v4 f = u >= p ? v4{} + keep_scale : v4{};
        *reinterpret_cast<v4u*>(z + c) = f;
      }
    }
    for (; c < nc; ++c) z[c] = factor_at(n0 + static_cast<std::uint64_t>(c));
  }
};

Dropout make_dropout(const AttentionParams& p) {
  return {p.dropout_p > 0.f, p.dropout_p, p.dropout_p < 1.f ? 1.f / (1.f - p.dropout_p) : 0.f, p.dropout_seed,
          p.l, p.s};
}

// ---- masks ----

std::int64_t mask_offset(const AttentionParams& p, std::int64_t head) {
  std::int64_t off = 0;
  for (int d = p.lead - 1; d >= 0; --d) {
    off += (head % p.lead_sizes[d]) * p.mask_lead_strides[d];
    head /= p.lead_sizes[d];
  }
  return off;
}

/// Scales a tile of raw products and applies the mask, the causal limit and the tile's
/// edge: st[r, c] = st[r, c] * scale + mask (Float), or -inf where the Bool mask is false,
/// j > i (causal) or c >= nc. Rows r < nr, rows at i0, columns at j0.
struct TileMasker {
  const AttentionParams& p;
  const float* fmask;
  const unsigned char* bmask;
  template <int kLevel>
  PHALANX_ATTN_INLINE void apply(float* st, std::int64_t nr, std::int64_t nc, std::int64_t i0, std::int64_t j0) const {
    constexpr std::int64_t W = kVW<kLevel>;
    const Vec<kLevel> sc = splat<kLevel>(p.scale);
    for (std::int64_t r = 0; r < nr; ++r) {
      float* row = st + r * kBc;
      for (std::int64_t c = 0; c < kBc; c += W) store<kLevel>(row + c, load<kLevel>(row + c) * sc);
      const std::int64_t i = i0 + r;
      if (p.mask_kind == AttentionMask::Float) {
        const float* m = fmask + i * p.mask_row_stride + j0 * p.mask_col_stride;
        if (p.mask_col_stride == 1)
          for (std::int64_t c = 0; c < nc; ++c) row[c] += m[c];
        else
          for (std::int64_t c = 0; c < nc; ++c) row[c] += m[0];
      } else if (p.mask_kind == AttentionMask::Bool) {
        const unsigned char* m = bmask + i * p.mask_row_stride + j0 * p.mask_col_stride;
        for (std::int64_t c = 0; c < nc; ++c)
          if (!m[c * p.mask_col_stride]) row[c] = kNegInf;
      }
      std::int64_t end = nc;
      if (p.causal) end = std::min(end, std::max<std::int64_t>(i - j0 + 1, 0));
      for (std::int64_t c = end; c < kBc; ++c) row[c] = kNegInf;
    }
  }
};

// ---- forward ----

struct ForwardScratch {
  float* kt;    // [e, s_pad]: k transposed, zero-padded
  float* vp;    // [s_pad, ev_pad]: v, zero-padded
  float* st;    // [kBr, kBc]: one tile of scores, then weights
  float* acc;   // [kBr, ev_pad]: the unnormalised output of a query tile
  float* mrow;  // [kBr]: running maxima
  float* lrow;  // [kBr]: running sums
  float* mnew;  // [kBr]: the maxima after this tile
  float* alpha; // [kBr]: exp(old maximum - new maximum)
};

/// The distance between rows of q, k or v: the view's when the op passed strided operands.
inline std::int64_t row_stride(const AttentionParams& p, std::int64_t strided, std::int64_t dense) {
  return p.qkv_strided ? strided : dense;
}

template <int kLevel>
PHALANX_ATTN_INLINE void forward_head(const AttentionParams& p, std::int64_t head, const float* q, const float* k,
                                      const float* v, const float* fmask, const unsigned char* bmask, float* out,
                                      float* stats, const ForwardScratch& w) {
  const std::int64_t L = p.l, S = p.s, E = p.e, Ev = p.ev;
  const std::int64_t s_pad = round_up(S, kBc), ev_pad = round_up(Ev, kPad);
  using V = Vec<kLevel>;
  constexpr std::int64_t W = kVW<kLevel>;
  const std::int64_t qr = row_stride(p, p.q_row_stride, E);
  transpose_padded(k, S, E, w.kt, s_pad, row_stride(p, p.k_row_stride, E));
  copy_padded(v, S, Ev, w.vp, ev_pad, s_pad, row_stride(p, p.v_row_stride, Ev));
  const TileMasker masker{p, fmask, bmask};
  const Dropout drop = make_dropout(p);

  for (std::int64_t i0 = 0; i0 < L; i0 += kBr) {
    const std::int64_t nr = std::min(kBr, L - i0);
    std::fill(w.mrow, w.mrow + kBr, kNegInf);
    std::fill(w.mnew, w.mnew + kBr, kNegInf);
    std::fill(w.lrow, w.lrow + nr, 0.f);
    std::fill(w.acc, w.acc + nr * ev_pad, 0.f);
    // Causal: key tiles wholly right of the tile's last row take no part.
    const std::int64_t j_end = p.causal ? std::min(S, i0 + nr) : S;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += kBc) {
      const std::int64_t nc = std::min(kBc, S - j0);
      const bool diagonal = p.causal && i0 - j0 < kBc - 1;  // the tile has masked entries
      tile_gemm<kLevel, Skip::kCols, false, false>(diagonal, i0 - j0, nr, kBc, E, q + i0 * qr, qr, w.kt + j0, s_pad, w.st, kBc);
      masker.template apply<kLevel>(w.st, nr, nc, i0, j0);
      // Each row's new running maximum ...
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* row = w.st + r * kBc;
        V mx = load<kLevel>(row);
        for (std::int64_t c = W; c < kBc; c += W) {
          const V x = load<kLevel>(row + c);
          mx = x > mx ? x : mx;
        }
        w.mnew[r] = std::max(w.mrow[r], hmax(mx));
      }
      // ... the rescaling of what was summed before, exp(m_old - m_new), 16 rows at a time
      // (1 where every score so far is masked: nothing was summed) ...
      for (std::int64_t r = 0; r < nr; r += W) {
        const V mn = load<kLevel>(w.mnew + r);
        const V a = exp_v<kLevel>(load<kLevel>(w.mrow + r) - mn);
        store<kLevel>(w.alpha + r, mn == kNegInf ? splat<kLevel>(1.f) : a);
      }
      // ... and the weights exp(s - m_new), their sum, the output rescaled.
      for (std::int64_t r = 0; r < nr; ++r) {
        float* row = w.st + r * kBc;
        const float m_new = w.mnew[r];
        if (m_new == kNegInf) {  // every score so far masked: nothing to add yet
          std::fill(row, row + kBc, 0.f);
          continue;
        }
        const float alpha = w.alpha[r];
        V sum{};
        const V mv = splat<kLevel>(m_new);
        for (std::int64_t c = 0; c < kBc; c += W) {
          const V e = exp_v<kLevel>(load<kLevel>(row + c) - mv);
          sum += e;
          store<kLevel>(row + c, e);
        }
        w.lrow[r] = w.lrow[r] * alpha + hsum(sum);
        w.mrow[r] = m_new;
        if (drop.on) {
          float z[kBc];
          drop.template factors<kLevel>(head, i0 + r, j0, nc, z);
          for (std::int64_t c = 0; c < nc; ++c) row[c] *= z[c];
        }
        if (alpha != 1.f) {
          float* acc = w.acc + r * ev_pad;
          const V av = splat<kLevel>(alpha);
          for (std::int64_t c = 0; c < ev_pad; c += W) store<kLevel>(acc + c, load<kLevel>(acc + c) * av);
        }
      }
      tile_gemm<kLevel, Skip::kDepth, false, true>(diagonal, i0 - j0, nr, ev_pad, nc, w.st, kBc, w.vp + j0 * ev_pad, ev_pad,
                                                   w.acc, ev_pad);
    }
    for (std::int64_t r = 0; r < nr; ++r) {
      // A row with every score masked (m = -inf, l = 0) gives zeros, as PyTorch 2.5+'s
      // _safe_softmax (docs/attention.md, "Masks"). m and l are saved apart: m + log l rounds
      // to m for a row of -1e9 scores, and the backward's weights would become 1.
      const float l = w.lrow[r];
      const float* a = w.acc + r * ev_pad;
      float* o = out + (i0 + r) * Ev;
      if (w.mrow[r] == kNegInf)
        std::fill(o, o + Ev, 0.f);
      else
        for (std::int64_t c = 0; c < Ev; ++c) o[c] = a[c] / l;
      stats[2 * (i0 + r)] = w.mrow[r];
      stats[2 * (i0 + r) + 1] = l;
    }
  }
}

// ---- backward ----

struct BackwardScratch {
  float* kt;    // [e, s_pad]: k transposed
  float* vt;    // [ev, s_pad]: v transposed
  float* kp;    // [s_pad, e_pad]: k padded
  float* qp;    // [l, e_pad]: q padded
  float* dop;   // [l, ev_pad]: grad_out padded
  float* dqp;   // [l, e_pad]: grad_q accumulated
  float* dsum;  // [l]: rowsum(grad_out * out)
  float* st;    // [kBr, kBc]: weights P
  float* dp;    // [kBr, kBc]: dP, then dS
  float* pz;    // [kBr, kBc]: P times the dropout factors
  float* dk;    // [kBc, e_pad]
  float* dv;    // [kBc, ev_pad]
};

template <int kLevel>
PHALANX_ATTN_INLINE void backward_head(const AttentionParams& p, std::int64_t head, const float* q, const float* k,
                                       const float* v, const float* fmask, const unsigned char* bmask,
                                       const float* out, const float* stats, const float* dout, float* dq, float* dk,
                                       float* dv, const BackwardScratch& w) {
  const std::int64_t L = p.l, S = p.s, E = p.e, Ev = p.ev;
  const std::int64_t s_pad = round_up(S, kBc), e_pad = round_up(E, kPad), ev_pad = round_up(Ev, kPad);
  using V = Vec<kLevel>;
  constexpr std::int64_t W = kVW<kLevel>;
  const std::int64_t kr = row_stride(p, p.k_row_stride, E), vr = row_stride(p, p.v_row_stride, Ev);
  transpose_padded(k, S, E, w.kt, s_pad, kr);
  transpose_padded(v, S, Ev, w.vt, s_pad, vr);
  copy_padded(k, S, E, w.kp, e_pad, s_pad, kr);
  copy_padded(q, L, E, w.qp, e_pad, L, row_stride(p, p.q_row_stride, E));
  copy_padded(dout, L, Ev, w.dop, ev_pad, L, Ev);
  for (std::int64_t i = 0; i < L; ++i) {
    float s = 0.f;
    for (std::int64_t d = 0; d < Ev; ++d) s += dout[i * Ev + d] * out[i * Ev + d];
    w.dsum[i] = s;
  }
  if (dq) std::fill(w.dqp, w.dqp + L * e_pad, 0.f);
  const TileMasker masker{p, fmask, bmask};
  const Dropout drop = make_dropout(p);
  const V scale = splat<kLevel>(p.scale);

  for (std::int64_t j0 = 0; j0 < S; j0 += kBc) {
    const std::int64_t nc = std::min(kBc, S - j0);
    if (dk) std::fill(w.dk, w.dk + kBc * e_pad, 0.f);
    if (dv) std::fill(w.dv, w.dv + kBc * ev_pad, 0.f);
    // Causal: query tiles wholly above the tile's first key take no part.
    const std::int64_t i_begin = p.causal ? j0 / kBr * kBr : 0;
    for (std::int64_t i0 = i_begin; i0 < L; i0 += kBr) {
      const std::int64_t nr = std::min(kBr, L - i0);
      const bool diagonal = p.causal && i0 - j0 < kBc - 1;  // the tile has masked entries
      const std::int64_t diag = i0 - j0;
      tile_gemm<kLevel, Skip::kCols, false, false>(diagonal, diag, nr, kBc, E, w.qp + i0 * e_pad, e_pad, w.kt + j0, s_pad,
                                                   w.st, kBc);
      masker.template apply<kLevel>(w.st, nr, nc, i0, j0);
      for (std::int64_t r = 0; r < nr; ++r) {  // P = exp(s - m) / l; 0 in a fully masked row (m = -inf)
        float* row = w.st + r * kBc;
        const float m_r = stats[2 * (i0 + r)];
        if (m_r == kNegInf) {
          std::fill(row, row + kBc, 0.f);
          continue;
        }
        const V mv = splat<kLevel>(m_r), inv_l = splat<kLevel>(1.f / stats[2 * (i0 + r) + 1]);
        for (std::int64_t c = 0; c < kBc; c += W)
          store<kLevel>(row + c, exp_v<kLevel>(load<kLevel>(row + c) - mv) * inv_l);
      }
      // dP (of the dropped weights) = dO V^T
      tile_gemm<kLevel, Skip::kCols, false, false>(diagonal, diag, nr, kBc, Ev, w.dop + i0 * ev_pad, ev_pad, w.vt + j0,
                                                   s_pad, w.dp, kBc);
      if (drop.on) {
        // dV += (P * Z)^T dO and dP *= Z, Z the dropout factor of each weight.
        for (std::int64_t r = 0; r < nr; ++r) {
          const float* prow = w.st + r * kBc;
          float* pzrow = w.pz + r * kBc;
          float* drow = w.dp + r * kBc;
          float z[kBc];
          drop.template factors<kLevel>(head, i0 + r, j0, nc, z);
          for (std::int64_t c = 0; c < nc; ++c) {
            drow[c] *= z[c];
            pzrow[c] = prow[c] * z[c];
          }
        }
        if (dv)
          tile_gemm<kLevel, Skip::kDepth, true, true>(diagonal, diag, nc, ev_pad, nr, w.pz, kBc, w.dop + i0 * ev_pad,
                                                      ev_pad, w.dv, ev_pad);
      } else if (dv) {
        tile_gemm<kLevel, Skip::kDepth, true, true>(diagonal, diag, nc, ev_pad, nr, w.st, kBc, w.dop + i0 * ev_pad, ev_pad,
                                                    w.dv, ev_pad);
      }
      // dS = P * (dP - rowsum(dO * O)) * scale (the scale of the scores folded in)
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* prow = w.st + r * kBc;
        float* drow = w.dp + r * kBc;
        const V dsv = splat<kLevel>(w.dsum[i0 + r]);
        for (std::int64_t c = 0; c < kBc; c += W) {
          const V pv = load<kLevel>(prow + c);
          V ds = pv * (load<kLevel>(drow + c) - dsv) * scale;
          ds = pv == 0.f ? splat<kLevel>(0.f) : ds;  // masked weights: no gradient, even where dP is inf
          store<kLevel>(drow + c, ds);
        }
      }
      if (dq)
        tile_gemm<kLevel, Skip::kDepth, false, true>(diagonal, diag, nr, e_pad, nc, w.dp, kBc, w.kp + j0 * e_pad, e_pad,
                                                     w.dqp + i0 * e_pad, e_pad);
      if (dk)
        tile_gemm<kLevel, Skip::kDepth, true, true>(diagonal, diag, nc, e_pad, nr, w.dp, kBc, w.qp + i0 * e_pad, e_pad,
                                                    w.dk, e_pad);
    }
    for (std::int64_t c = 0; c < nc; ++c) {
      if (dk) std::memcpy(dk + (j0 + c) * E, w.dk + c * e_pad, sizeof(float) * E);
      if (dv) std::memcpy(dv + (j0 + c) * Ev, w.dv + c * ev_pad, sizeof(float) * Ev);
    }
  }
  if (dq)
    for (std::int64_t i = 0; i < L; ++i) std::memcpy(dq + i * E, w.dqp + i * e_pad, sizeof(float) * E);
}

// ---- the three compilations and the dispatch ----

using ForwardFn = void (*)(const AttentionParams&, std::int64_t, const float*, const float*, const float*,
                           const float*, const unsigned char*, float*, float*, const ForwardScratch&);
using BackwardFn = void (*)(const AttentionParams&, std::int64_t, const float*, const float*, const float*,
                            const float*, const unsigned char*, const float*, const float*, const float*, float*,
                            float*, float*, const BackwardScratch&);

#define PHALANX_ATTN_LEVEL(suffix, target, level)                                                                    \
  target void forward_##suffix(const AttentionParams& p, std::int64_t head, const float* q, const float* k,    \
                               const float* v, const float* fm, const unsigned char* bm, float* out, float* stats, \
                               const ForwardScratch& w) {                                                     \
    forward_head<level>(p, head, q, k, v, fm, bm, out, stats, w);                                                    \
  }                                                                                                           \
  target void backward_##suffix(const AttentionParams& p, std::int64_t head, const float* q, const float* k,   \
                                const float* v, const float* fm, const unsigned char* bm, const float* out,     \
                                const float* stats, const float* dout, float* dq, float* dk, float* dv,          \
                                const BackwardScratch& w) {                                                   \
    backward_head<level>(p, head, q, k, v, fm, bm, out, stats, dout, dq, dk, dv, w);                                 \
  }
PHALANX_ATTN_LEVEL(scalar, , 0)
#ifdef PHALANX_ATTN_X86
PHALANX_ATTN_LEVEL(avx2, PHALANX_ATTN_TARGET("avx2,fma"), 1)
PHALANX_ATTN_LEVEL(avx512, PHALANX_ATTN_TARGET("avx512f,avx512dq,fma"), 2)
#endif

/// AVX-512 with DQ (the dropout hash's 64-bit multiplies), else AVX2, else baseline; both
/// vector levels are compiled with FMA, so they need it too.
int simd_level() { return cpu::simd_level("PHALANX_ATTENTION_SIMD", true, true); }

ForwardFn forward_fn(int level) {
#ifdef PHALANX_ATTN_X86
  if (level == 2) return &forward_avx512;
  if (level == 1) return &forward_avx2;
#endif
  (void)level;
  return &forward_scalar;
}
BackwardFn backward_fn(int level) {
#ifdef PHALANX_ATTN_X86
  if (level == 2) return &backward_avx512;
  if (level == 1) return &backward_avx2;
#endif
  (void)level;
  return &backward_scalar;
}

const float* fmask_of(const Tensor& mask, const AttentionParams& p) {
  return p.mask_kind == AttentionMask::Float ? static_cast<const float*>(mask.raw_data()) : nullptr;
}
const unsigned char* bmask_of(const Tensor& mask, const AttentionParams& p) {
  return p.mask_kind == AttentionMask::Bool ? static_cast<const unsigned char*>(mask.raw_data()) : nullptr;
}

/// Element offset of head h's first row in q, k or v: h * dense for contiguous operands, else
/// the leading dims' strides of the view.
std::int64_t head_offset(const AttentionParams& p, std::int64_t h, const std::int64_t* lead_strides,
                         std::int64_t dense) {
  if (!p.qkv_strided) return h * dense;
  std::int64_t off = 0;
  for (int d = p.lead - 1; d >= 0; --d) {
    off += (h % p.lead_sizes[d]) * lead_strides[d];
    h /= p.lead_sizes[d];
  }
  return off;
}

/// Float32 scratch from the CPU table, so that the allocator's accounting sees it.
Tensor scratch(std::int64_t n) { return Tensor::empty({std::max<std::int64_t>(n, 1)}, DType::Float32, Device::cpu()); }

}  // namespace

void CpuKernels::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                   const AttentionParams& p, Tensor& out, Tensor& stats) {
  const std::int64_t s_pad = round_up(p.s, kBc), ev_pad = round_up(p.ev, kPad);
  Tensor buf = scratch(p.e * s_pad + s_pad * ev_pad + kBr * kBc + kBr * ev_pad + 4 * kBr);
  float* b = buf.data<float>();
  ForwardScratch w;
  w.kt = b, b += p.e * s_pad;
  w.vp = b, b += s_pad * ev_pad;
  w.st = b, b += kBr * kBc;
  w.acc = b, b += kBr * ev_pad;
  w.mrow = b, b += kBr;
  w.lrow = b, b += kBr;
  w.mnew = b, b += kBr;
  w.alpha = b;
  const ForwardFn fn = forward_fn(simd_level());
  const float* fm = fmask_of(mask, p);
  const unsigned char* bm = bmask_of(mask, p);
  const float *qd = q.data<float>(), *kd = k.data<float>(), *vd = v.data<float>();
  float *od = out.data<float>(), *ld = stats.data<float>();
  for (std::int64_t h = 0; h < p.batch; ++h) {
    const std::int64_t moff = p.mask_kind == AttentionMask::None ? 0 : mask_offset(p, h);
    fn(p, h, qd + head_offset(p, h, p.q_lead_strides, p.l * p.e), kd + head_offset(p, h, p.k_lead_strides, p.s * p.e),
       vd + head_offset(p, h, p.v_lead_strides, p.s * p.ev), fm ? fm + moff : nullptr, bm ? bm + moff : nullptr,
       od + h * p.l * p.ev, ld + 2 * h * p.l, w);
  }
}

void CpuKernels::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                                    const AttentionParams& p, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v) {
  const std::int64_t s_pad = round_up(p.s, kBc), e_pad = round_up(p.e, kPad), ev_pad = round_up(p.ev, kPad);
  Tensor buf = scratch(p.e * s_pad + p.ev * s_pad + s_pad * e_pad + p.l * e_pad + p.l * ev_pad +
                       (grad_q.defined() ? p.l * e_pad : 0) + p.l + 3 * kBr * kBc + kBc * e_pad + kBc * ev_pad);
  float* b = buf.data<float>();
  BackwardScratch w;
  w.kt = b, b += p.e * s_pad;
  w.vt = b, b += p.ev * s_pad;
  w.kp = b, b += s_pad * e_pad;
  w.qp = b, b += p.l * e_pad;
  w.dop = b, b += p.l * ev_pad;
  w.dqp = b, b += grad_q.defined() ? p.l * e_pad : 0;
  w.dsum = b, b += p.l;
  w.st = b, b += kBr * kBc;
  w.dp = b, b += kBr * kBc;
  w.pz = b, b += kBr * kBc;
  w.dk = b, b += kBc * e_pad;
  w.dv = b;
  const BackwardFn fn = backward_fn(simd_level());
  const float* fm = fmask_of(mask, p);
  const unsigned char* bm = bmask_of(mask, p);
  const float *qd = q.data<float>(), *kd = k.data<float>(), *vd = v.data<float>(), *od = out.data<float>(),
              *ld = stats.data<float>(), *gd = grad_out.data<float>();
  float* dq = grad_q.defined() ? grad_q.data<float>() : nullptr;
  float* dk = grad_k.defined() ? grad_k.data<float>() : nullptr;
  float* dv = grad_v.defined() ? grad_v.data<float>() : nullptr;
  for (std::int64_t h = 0; h < p.batch; ++h) {
    const std::int64_t moff = p.mask_kind == AttentionMask::None ? 0 : mask_offset(p, h);
    fn(p, h, qd + head_offset(p, h, p.q_lead_strides, p.l * p.e), kd + head_offset(p, h, p.k_lead_strides, p.s * p.e),
       vd + head_offset(p, h, p.v_lead_strides, p.s * p.ev), fm ? fm + moff : nullptr, bm ? bm + moff : nullptr,
       od + h * p.l * p.ev, ld + 2 * h * p.l, gd + h * p.l * p.ev,
       dq ? dq + h * p.l * p.e : nullptr, dk ? dk + h * p.s * p.e : nullptr, dv ? dv + h * p.s * p.ev : nullptr, w);
  }
}

}  // namespace phalanx
