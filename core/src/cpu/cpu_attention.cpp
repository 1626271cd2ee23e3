// Fused scaled-dot-product attention on the CPU (docs/attention.md): FlashAttention-2's
// algorithm on one core. The forward walks each head's queries in tiles of kBr rows and,
// for each, the keys in tiles of kBc columns, keeping per row the running maximum m, the
// running sum l of exp(score - m) and the unnormalised output (the online softmax); the
// backward walks key tiles outer and query tiles inner, recomputing each tile of weights
// from q, k and the saved per-row log-sum-exp. Neither ever holds more than one kBr x kBc
// tile of scores: the working memory is the per-head padded copies of q, k, v (and do, dq)
// and grows linearly with L and S.
//
// The tile products are small GEMMs with the output held in registers (4 rows x up to 64
// columns, GCC vector types); the whole per-head loop is compiled three times, for
// AVX-512F, AVX2 and baseline x86-64, and the best the CPU has is picked at each call
// (PHALANX_ATTENTION_SIMD=scalar|avx2|avx512 caps it; the tests compare the three).
// exp is a vectorised Cephes polynomial (about 2 ulp), as PyTorch's own vectorised
// softmax uses Sleef's rather than libm's.
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
constexpr std::int64_t kBc = 64;  // key columns per tile (4 vectors of 16)
constexpr std::int64_t kW = 16;   // floats per vector
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef float v16 __attribute__((vector_size(64)));
typedef std::int32_t i16 __attribute__((vector_size(64)));

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

PHALANX_ATTN_INLINE v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
PHALANX_ATTN_INLINE void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
PHALANX_ATTN_INLINE v16 splat(float x) { return v16{} + x; }

/// exp(x) for x <= 88 (scores minus their row maximum are <= 0): Cephes' expf, 2^n by
/// exponent bits. Below -87.3 (where expf underflows to denormals) and at -inf it gives 0;
/// NaN stays NaN.
PHALANX_ATTN_INLINE v16 exp_v(v16 x) {
  const v16 lo = splat(-87.3f), hi = splat(88.f);
  v16 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  v16 fx = xc * 1.44269504088896341f + 0.5f;
  const i16 t = __builtin_convertvector(fx, i16);  // truncation toward zero
  v16 tf = __builtin_convertvector(t, v16);
  const i16 gt = tf > fx;
  tf = gt ? tf - 1.f : tf;  // floor
  v16 r = xc - tf * 0.693359375f;
  r = r - tf * -2.12194440e-4f;
  const v16 r2 = r * r;
  v16 y = splat(1.9875691500E-4f);
  y = y * r + 1.3981999507E-3f;
  y = y * r + 8.3334519073E-3f;
  y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f;
  y = y * r + 5.0000001201E-1f;
  y = y * r2 + r + 1.f;
  const i16 e = (__builtin_convertvector(tf, i16) + 127) << 23;
  v16 pow2;
  std::memcpy(&pow2, &e, sizeof pow2);
  v16 out = y * pow2;
  out = x < lo ? splat(0.f) : out;
  out = x != x ? x : out;
  return out;
}

PHALANX_ATTN_INLINE float hmax(v16 v) {
  float m = v[0];
  for (int i = 1; i < kW; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
PHALANX_ATTN_INLINE float hsum(v16 v) {
  float s = 0.f;
  for (int i = 0; i < kW; ++i) s += v[i];
  return s;
}

/// C[R x 16 NV] (+)= op(A) B for one register block: op(A)(r, p) is a[r * lda + p], or
/// a[p * lda + r] when kTA; B is row-major with ldb and NV vectors of columns readable.
template <int R, int NV, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void block(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t k,
                               float* c, std::int64_t ldc) {
  v16 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAcc ? load(c + r * ldc + v * kW) : v16{};
  for (std::int64_t p = 0; p < k; ++p) {
    v16 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * kW);
    for (int r = 0; r < R; ++r) {
      const float ar = kTA ? a[p * lda + r] : a[r * lda + p];
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kW, acc[r][v]);
}

template <int NV, bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void rows_block(std::int64_t m, const float* a, std::int64_t lda, const float* b,
                                    std::int64_t ldb, std::int64_t k, float* c, std::int64_t ldc) {
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    block<4, NV, kTA, kAcc>(kTA ? a + i : a + i * lda, lda, b, ldb, k, c + i * ldc, ldc);
  const float* ai = kTA ? a + i : a + i * lda;
  switch (m - i) {
    case 3: block<3, NV, kTA, kAcc>(ai, lda, b, ldb, k, c + i * ldc, ldc); break;
    case 2: block<2, NV, kTA, kAcc>(ai, lda, b, ldb, k, c + i * ldc, ldc); break;
    case 1: block<1, NV, kTA, kAcc>(ai, lda, b, ldb, k, c + i * ldc, ldc); break;
    default: break;
  }
}

/// C[m x n] (+)= op(A)[m x k] B[k x n], n a multiple of 16 (the padded widths), row-major.
template <bool kTA, bool kAcc>
PHALANX_ATTN_INLINE void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                              const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
  std::int64_t j = 0;
  for (; j + 4 * kW <= n; j += 4 * kW) rows_block<4, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc);
  switch ((n - j) / kW) {
    case 3: rows_block<3, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    case 2: rows_block<2, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    case 1: rows_block<1, kTA, kAcc>(m, a, lda, b + j, ldb, k, c + j, ldc); break;
    default: break;
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
  PHALANX_ATTN_INLINE float factor(std::int64_t head, std::int64_t i, std::int64_t j) const {
    const std::uint64_t n = static_cast<std::uint64_t>((head * l + i) * s + j);
    const float u = static_cast<float>(split_mix(seed + n * 0x9e3779b97f4a7c15ULL) >> 40) * 0x1p-24f;
    return u >= p ? keep_scale : 0.f;
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
  PHALANX_ATTN_INLINE void apply(float* st, std::int64_t nr, std::int64_t nc, std::int64_t i0, std::int64_t j0) const {
    const v16 sc = splat(p.scale);
    for (std::int64_t r = 0; r < nr; ++r) {
      float* row = st + r * kBc;
      for (int v = 0; v < kBc / kW; ++v) store(row + v * kW, load(row + v * kW) * sc);
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
};

PHALANX_ATTN_INLINE void forward_head(const AttentionParams& p, std::int64_t head, const float* q, const float* k,
                                      const float* v, const float* fmask, const unsigned char* bmask, float* out,
                                      float* lse, const ForwardScratch& w) {
  const std::int64_t L = p.l, S = p.s, E = p.e, Ev = p.ev;
  const std::int64_t s_pad = round_up(S, kBc), ev_pad = round_up(Ev, kW);
  std::fill(w.kt, w.kt + E * s_pad, 0.f);
  for (std::int64_t j = 0; j < S; ++j)
    for (std::int64_t d = 0; d < E; ++d) w.kt[d * s_pad + j] = k[j * E + d];
  std::fill(w.vp, w.vp + s_pad * ev_pad, 0.f);
  for (std::int64_t j = 0; j < S; ++j) std::memcpy(w.vp + j * ev_pad, v + j * Ev, sizeof(float) * Ev);
  const TileMasker masker{p, fmask, bmask};
  const Dropout drop = make_dropout(p);

  for (std::int64_t i0 = 0; i0 < L; i0 += kBr) {
    const std::int64_t nr = std::min(kBr, L - i0);
    std::fill(w.mrow, w.mrow + nr, kNegInf);
    std::fill(w.lrow, w.lrow + nr, 0.f);
    std::fill(w.acc, w.acc + nr * ev_pad, 0.f);
    // Causal: key tiles wholly right of the tile's last row take no part.
    const std::int64_t j_end = p.causal ? std::min(S, i0 + nr) : S;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += kBc) {
      const std::int64_t nc = std::min(kBc, S - j0);
      gemm<false, false>(nr, kBc, E, q + i0 * E, E, w.kt + j0, s_pad, w.st, kBc);
      masker.apply(w.st, nr, nc, i0, j0);
      for (std::int64_t r = 0; r < nr; ++r) {
        float* row = w.st + r * kBc;
        v16 mx = load(row);
        for (int c = 1; c < kBc / kW; ++c) {
          const v16 x = load(row + c * kW);
          mx = x > mx ? x : mx;
        }
        const float m_old = w.mrow[r];
        const float m_new = std::max(m_old, hmax(mx));
        if (m_new == kNegInf) {  // every score so far masked: nothing to add yet
          std::fill(row, row + kBc, 0.f);
          continue;
        }
        const float alpha = std::exp(m_old - m_new);  // 0 when m_old is -inf
        v16 sum{};
        const v16 mv = splat(m_new);
        for (int c = 0; c < kBc / kW; ++c) {
          const v16 e = exp_v(load(row + c * kW) - mv);
          sum += e;
          store(row + c * kW, e);
        }
        w.lrow[r] = w.lrow[r] * alpha + hsum(sum);
        w.mrow[r] = m_new;
        if (drop.on)
          for (std::int64_t c = 0; c < nc; ++c) row[c] *= drop.factor(head, i0 + r, j0 + c);
        if (alpha != 1.f) {
          float* a = w.acc + r * ev_pad;
          const v16 av = splat(alpha);
          for (std::int64_t c = 0; c < ev_pad; c += kW) store(a + c, load(a + c) * av);
        }
      }
      gemm<false, true>(nr, ev_pad, nc, w.st, kBc, w.vp + j0 * ev_pad, ev_pad, w.acc, ev_pad);
    }
    for (std::int64_t r = 0; r < nr; ++r) {
      // A row with every score masked has l = 0: 0 / 0 = NaN, as PyTorch's softmax gives.
      const float l = w.lrow[r];
      const float* a = w.acc + r * ev_pad;
      float* o = out + (i0 + r) * Ev;
      for (std::int64_t c = 0; c < Ev; ++c) o[c] = a[c] / l;
      lse[i0 + r] = w.mrow[r] + std::log(l);
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

PHALANX_ATTN_INLINE void backward_head(const AttentionParams& p, std::int64_t head, const float* q, const float* k,
                                       const float* v, const float* fmask, const unsigned char* bmask,
                                       const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                       float* dv, const BackwardScratch& w) {
  const std::int64_t L = p.l, S = p.s, E = p.e, Ev = p.ev;
  const std::int64_t s_pad = round_up(S, kBc), e_pad = round_up(E, kW), ev_pad = round_up(Ev, kW);
  std::fill(w.kt, w.kt + E * s_pad, 0.f);
  std::fill(w.vt, w.vt + Ev * s_pad, 0.f);
  std::fill(w.kp, w.kp + s_pad * e_pad, 0.f);
  for (std::int64_t j = 0; j < S; ++j) {
    for (std::int64_t d = 0; d < E; ++d) w.kt[d * s_pad + j] = k[j * E + d];
    for (std::int64_t d = 0; d < Ev; ++d) w.vt[d * s_pad + j] = v[j * Ev + d];
    std::memcpy(w.kp + j * e_pad, k + j * E, sizeof(float) * E);
  }
  std::fill(w.qp, w.qp + L * e_pad, 0.f);
  std::fill(w.dop, w.dop + L * ev_pad, 0.f);
  for (std::int64_t i = 0; i < L; ++i) {
    std::memcpy(w.qp + i * e_pad, q + i * E, sizeof(float) * E);
    std::memcpy(w.dop + i * ev_pad, dout + i * Ev, sizeof(float) * Ev);
    float s = 0.f;
    for (std::int64_t d = 0; d < Ev; ++d) s += dout[i * Ev + d] * out[i * Ev + d];
    w.dsum[i] = s;
  }
  if (dq) std::fill(w.dqp, w.dqp + L * e_pad, 0.f);
  const TileMasker masker{p, fmask, bmask};
  const Dropout drop = make_dropout(p);
  const v16 scale = splat(p.scale);

  for (std::int64_t j0 = 0; j0 < S; j0 += kBc) {
    const std::int64_t nc = std::min(kBc, S - j0);
    if (dk) std::fill(w.dk, w.dk + kBc * e_pad, 0.f);
    if (dv) std::fill(w.dv, w.dv + kBc * ev_pad, 0.f);
    // Causal: query tiles wholly above the tile's first key take no part.
    const std::int64_t i_begin = p.causal ? j0 / kBr * kBr : 0;
    for (std::int64_t i0 = i_begin; i0 < L; i0 += kBr) {
      const std::int64_t nr = std::min(kBr, L - i0);
      gemm<false, false>(nr, kBc, E, w.qp + i0 * e_pad, e_pad, w.kt + j0, s_pad, w.st, kBc);
      masker.apply(w.st, nr, nc, i0, j0);
      for (std::int64_t r = 0; r < nr; ++r) {  // P = exp(s - lse): a fully masked row gives NaN
        float* row = w.st + r * kBc;
        const v16 lv = splat(lse[i0 + r]);
        for (int c = 0; c < kBc / kW; ++c) store(row + c * kW, exp_v(load(row + c * kW) - lv));
      }
      // dP (of the dropped weights) = dO V^T
      gemm<false, false>(nr, kBc, Ev, w.dop + i0 * ev_pad, ev_pad, w.vt + j0, s_pad, w.dp, kBc);
      if (drop.on) {
        // dV += (P * Z)^T dO and dP *= Z, Z the dropout factor of each weight.
        for (std::int64_t r = 0; r < nr; ++r) {
          const float* prow = w.st + r * kBc;
          float* pzrow = w.pz + r * kBc;
          float* drow = w.dp + r * kBc;
          for (std::int64_t c = 0; c < nc; ++c) {
            const float z = drop.factor(head, i0 + r, j0 + c);
            drow[c] *= z;
            pzrow[c] = prow[c] * z;
          }
        }
        if (dv) gemm<true, true>(nc, ev_pad, nr, w.pz, kBc, w.dop + i0 * ev_pad, ev_pad, w.dv, ev_pad);
      } else if (dv) {
        gemm<true, true>(nc, ev_pad, nr, w.st, kBc, w.dop + i0 * ev_pad, ev_pad, w.dv, ev_pad);
      }
      // dS = P * (dP - rowsum(dO * O)) * scale (the scale of the scores folded in)
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* prow = w.st + r * kBc;
        float* drow = w.dp + r * kBc;
        const v16 dsv = splat(w.dsum[i0 + r]);
        for (int c = 0; c < kBc / kW; ++c) {
          const v16 pv = load(prow + c * kW);
          v16 ds = pv * (load(drow + c * kW) - dsv) * scale;
          ds = pv == 0.f ? splat(0.f) : ds;  // masked weights: no gradient, even where dP is inf
          store(drow + c * kW, ds);
        }
      }
      if (dq) gemm<false, true>(nr, e_pad, nc, w.dp, kBc, w.kp + j0 * e_pad, e_pad, w.dqp + i0 * e_pad, e_pad);
      if (dk) gemm<true, true>(nc, e_pad, nr, w.dp, kBc, w.qp + i0 * e_pad, e_pad, w.dk, e_pad);
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

#define PHALANX_ATTN_LEVEL(suffix, target)                                                                    \
  target void forward_##suffix(const AttentionParams& p, std::int64_t head, const float* q, const float* k,    \
                               const float* v, const float* fm, const unsigned char* bm, float* out, float* lse, \
                               const ForwardScratch& w) {                                                     \
    forward_head(p, head, q, k, v, fm, bm, out, lse, w);                                                      \
  }                                                                                                           \
  target void backward_##suffix(const AttentionParams& p, std::int64_t head, const float* q, const float* k,   \
                                const float* v, const float* fm, const unsigned char* bm, const float* out,     \
                                const float* lse, const float* dout, float* dq, float* dk, float* dv,          \
                                const BackwardScratch& w) {                                                   \
    backward_head(p, head, q, k, v, fm, bm, out, lse, dout, dq, dk, dv, w);                                   \
  }
PHALANX_ATTN_LEVEL(scalar, )
#ifdef PHALANX_ATTN_X86
PHALANX_ATTN_LEVEL(avx2, PHALANX_ATTN_TARGET("avx2,fma"))
PHALANX_ATTN_LEVEL(avx512, PHALANX_ATTN_TARGET("avx512f,fma"))
#endif

int simd_level() { return cpu::simd_level("PHALANX_ATTENTION_SIMD"); }

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

/// Float32 scratch from the CPU table, so that the allocator's accounting sees it.
Tensor scratch(std::int64_t n) { return Tensor::empty({std::max<std::int64_t>(n, 1)}, DType::Float32, Device::cpu()); }

}  // namespace

void CpuKernels::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                   const AttentionParams& p, Tensor& out, Tensor& lse) {
  const std::int64_t s_pad = round_up(p.s, kBc), ev_pad = round_up(p.ev, kW);
  Tensor buf = scratch(p.e * s_pad + s_pad * ev_pad + kBr * kBc + kBr * ev_pad + 2 * kBr);
  float* b = buf.data<float>();
  ForwardScratch w;
  w.kt = b, b += p.e * s_pad;
  w.vp = b, b += s_pad * ev_pad;
  w.st = b, b += kBr * kBc;
  w.acc = b, b += kBr * ev_pad;
  w.mrow = b, b += kBr;
  w.lrow = b;
  const ForwardFn fn = forward_fn(simd_level());
  const float* fm = fmask_of(mask, p);
  const unsigned char* bm = bmask_of(mask, p);
  const float *qd = q.data<float>(), *kd = k.data<float>(), *vd = v.data<float>();
  float *od = out.data<float>(), *ld = lse.data<float>();
  for (std::int64_t h = 0; h < p.batch; ++h) {
    const std::int64_t moff = p.mask_kind == AttentionMask::None ? 0 : mask_offset(p, h);
    fn(p, h, qd + h * p.l * p.e, kd + h * p.s * p.e, vd + h * p.s * p.ev, fm ? fm + moff : nullptr,
       bm ? bm + moff : nullptr, od + h * p.l * p.ev, ld + h * p.l, w);
  }
}

void CpuKernels::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const Tensor& out, const Tensor& lse, const Tensor& grad_out,
                                    const AttentionParams& p, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v) {
  const std::int64_t s_pad = round_up(p.s, kBc), e_pad = round_up(p.e, kW), ev_pad = round_up(p.ev, kW);
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
              *ld = lse.data<float>(), *gd = grad_out.data<float>();
  float* dq = grad_q.defined() ? grad_q.data<float>() : nullptr;
  float* dk = grad_k.defined() ? grad_k.data<float>() : nullptr;
  float* dv = grad_v.defined() ? grad_v.data<float>() : nullptr;
  for (std::int64_t h = 0; h < p.batch; ++h) {
    const std::int64_t moff = p.mask_kind == AttentionMask::None ? 0 : mask_offset(p, h);
    fn(p, h, qd + h * p.l * p.e, kd + h * p.s * p.e, vd + h * p.s * p.ev, fm ? fm + moff : nullptr,
       bm ? bm + moff : nullptr, od + h * p.l * p.ev, ld + h * p.l, gd + h * p.l * p.ev,
       dq ? dq + h * p.l * p.e : nullptr, dk ? dk + h * p.s * p.e : nullptr, dv ? dv + h * p.s * p.ev : nullptr, w);
  }
}

}  // namespace phalanx
