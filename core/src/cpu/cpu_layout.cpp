// Layout and mask kernels of the CPU table: the one strided copy behind permute, cat, stack,
// split, chunk and mask broadcasting.
//
// The copy first simplifies its index space (drops size-1 dims, orders dims by destination
// step, merges dims that are contiguous on both sides), then walks the outer dims with an
// odometer that moves two pointers (no index division anywhere) and runs one of three inner
// loops: a contiguous row (memcpy), a tiled 2-D transpose when the source's unit-step dim
// is not the destination's (both sides then touch whole cache lines), or a plain strided
// loop (broadcast rows, odd layouts).
#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PHALANX_LAYOUT_X86 1
#endif

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

namespace {

// The memory-bound inner loops are compiled for AVX-512F, AVX2 and baseline x86-64, picked at
// load time (as cpu_elementwise.cpp's): moves and selects only, the same bits on each.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_LAYOUT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PHALANX_LAYOUT_CLONES
#endif
// clang cannot multiversion a function template (GCC can): there the tiled transpose is
// built for baseline x86-64 only (the 4-byte AVX path below is chosen at run time either way).
#if defined(__clang__)
#define PHALANX_LAYOUT_TEMPLATE_CLONES
#else
#define PHALANX_LAYOUT_TEMPLATE_CLONES PHALANX_LAYOUT_CLONES
#endif

struct Walk {
  int n = 0;
  std::int64_t size[kMaxLayoutDims], ss[kMaxLayoutDims], ds[kMaxLayoutDims];
};

Walk simplify(const StridedLayout& l) {
  Walk w;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.sizes[d] == 1) continue;
    w.size[w.n] = l.sizes[d];
    w.ss[w.n] = l.src_strides[d];
    w.ds[w.n] = l.dst_strides[d];
    ++w.n;
  }
  // Destination steps descending (insertion sort, at most 8 dims; stable): the innermost loop
  // then writes consecutive elements.
  for (int i = 1; i < w.n; ++i)
    for (int j = i; j > 0 && w.ds[j - 1] < w.ds[j]; --j) {
      std::swap(w.size[j], w.size[j - 1]);
      std::swap(w.ss[j], w.ss[j - 1]);
      std::swap(w.ds[j], w.ds[j - 1]);
    }
  // Merge dim d into d + 1 where stepping d is the same as stepping d + 1 size[d + 1] times.
  int m = 0;
  for (int d = 0; d < w.n; ++d) {
    if (m > 0 && w.ss[m - 1] == w.ss[d] * w.size[d] && w.ds[m - 1] == w.ds[d] * w.size[d]) {
      w.size[m - 1] *= w.size[d];
      w.ss[m - 1] = w.ss[d];
      w.ds[m - 1] = w.ds[d];
    } else {
      w.size[m] = w.size[d];
      w.ss[m] = w.ss[d];
      w.ds[m] = w.ds[d];
      ++m;
    }
  }
  w.n = m;
  return w;
}

// Calls body(src, dst) once per index of the dims `dims[0..nd)` of `w` (outermost first), the
// pointers advanced by the source and destination steps of those dims (in bytes).
template <typename Body>
void odometer(const Walk& w, const int* dims, int nd, std::size_t es, const char* src, char* dst, Body&& body) {
  std::int64_t idx[kMaxLayoutDims] = {};
  std::int64_t sstep[kMaxLayoutDims], dstep[kMaxLayoutDims], size[kMaxLayoutDims];
  for (int i = 0; i < nd; ++i) {
    size[i] = w.size[dims[i]];
    sstep[i] = w.ss[dims[i]] * static_cast<std::int64_t>(es);
    dstep[i] = w.ds[dims[i]] * static_cast<std::int64_t>(es);
  }
  for (;;) {
    body(src, dst);
    int i = nd - 1;
    for (; i >= 0; --i) {
      src += sstep[i];
      dst += dstep[i];
      if (++idx[i] < size[i]) break;
      src -= sstep[i] * size[i];
      dst -= dstep[i] * size[i];
      idx[i] = 0;
    }
    if (i < 0) return;
  }
}

template <typename T>
void strided_row(const char* src, char* dst, std::int64_t n, std::int64_t ss, std::int64_t ds) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  if (ss == 0) {
    const T v = *s;
    for (std::int64_t i = 0; i < n; ++i) d[i * ds] = v;
  } else {
    for (std::int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
  }
}

void strided_row_bytes(const char* src, char* dst, std::int64_t n, std::int64_t ss, std::int64_t ds,
                       std::size_t es) {
  switch (es) {
    case 1: return strided_row<std::uint8_t>(src, dst, n, ss, ds);
    case 2: return strided_row<std::uint16_t>(src, dst, n, ss, ds);
    case 4: return strided_row<std::uint32_t>(src, dst, n, ss, ds);
    case 8: return strided_row<std::uint64_t>(src, dst, n, ss, ds);
    default:
      for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds * es, src + i * ss * es, es);
  }
}

// dst[i * dp + j] = src[i + j * sn] for i < rows, j < cols: src's unit step is along i, dst's
// along j. Tiles of kTile x kTile keep both sides' cache lines in use.
template <typename T>
PHALANX_LAYOUT_TEMPLATE_CLONES void tiled_transpose(const char* src, char* dst, std::int64_t rows, std::int64_t cols,
                                           std::int64_t sn, std::int64_t dp) {
  constexpr std::int64_t kTile = 16;
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (std::int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const std::int64_t i1 = std::min(rows, i0 + kTile);
    for (std::int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const std::int64_t j1 = std::min(cols, j0 + kTile);
      for (std::int64_t i = i0; i < i1; ++i)
        for (std::int64_t j = j0; j < j1; ++j) d[i * dp + j] = s[i + j * sn];
    }
  }
}

#ifdef PHALANX_LAYOUT_X86
// One 8 x 8 block of 4-byte elements through AVX registers: d[l * dp + k] = s[l + k * sn].
__attribute__((target("avx"))) inline void transpose8x8(const float* s, std::int64_t sn, float* d, std::int64_t dp) {
  const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + sn), r2 = _mm256_loadu_ps(s + 2 * sn),
               r3 = _mm256_loadu_ps(s + 3 * sn), r4 = _mm256_loadu_ps(s + 4 * sn), r5 = _mm256_loadu_ps(s + 5 * sn),
               r6 = _mm256_loadu_ps(s + 6 * sn), r7 = _mm256_loadu_ps(s + 7 * sn);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
               u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
               u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
               u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + dp, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * dp, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * dp, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * dp, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * dp, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * dp, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * dp, _mm256_permute2f128_ps(u3, u7, 0x31));
}

// tiled_transpose for 4-byte elements with 8 x 8 register blocks (about 3x the scalar tiles
// when the data is in cache); the edges of a tile that are not whole blocks stay scalar.
// Pure moves: the same bits as the scalar path.
__attribute__((target("avx"))) void tiled_transpose32_avx(const char* src, char* dst, std::int64_t rows,
                                                         std::int64_t cols, std::int64_t sn, std::int64_t dp) {
  constexpr std::int64_t kTile = 16;
  // float lanes only carry the bits (no arithmetic): any 4-byte element goes through them
  const float* s = reinterpret_cast<const float*>(src);
  float* d = reinterpret_cast<float*>(dst);
  for (std::int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const std::int64_t i1 = std::min(rows, i0 + kTile);
    for (std::int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const std::int64_t j1 = std::min(cols, j0 + kTile);
      std::int64_t i = i0;
      for (; i + 8 <= i1; i += 8) {
        std::int64_t j = j0;
        for (; j + 8 <= j1; j += 8) transpose8x8(s + i + j * sn, sn, d + i * dp + j, dp);
        for (std::int64_t ii = i; ii < i + 8; ++ii)
          for (std::int64_t jj = j; jj < j1; ++jj) std::memcpy(d + ii * dp + jj, s + ii + jj * sn, 4);
      }
      for (; i < i1; ++i)
        for (std::int64_t j = j0; j < j1; ++j) std::memcpy(d + i * dp + j, s + i + j * sn, 4);
    }
  }
}

bool have_avx() {
  static const bool yes = __builtin_cpu_supports("avx");
  return yes;
}
#endif

}  // namespace

void CpuKernels::strided_copy(const Tensor& src, const StridedLayout& l, Tensor& dst) {
  for (int d = 0; d < l.ndim; ++d)
    if (l.sizes[d] == 0) return;
  const std::size_t es = element_size(src.dtype());
  const char* s = static_cast<const char*>(src.raw_data()) + l.src_offset * static_cast<std::int64_t>(es);
  char* o = static_cast<char*>(dst.raw_data()) + l.dst_offset * static_cast<std::int64_t>(es);
  const Walk w = simplify(l);
  if (w.n == 0) {
    std::memcpy(o, s, es);
    return;
  }
  const int inner = w.n - 1;
  int outer_dims[kMaxLayoutDims];
  const std::int64_t n = w.size[inner];
  if (w.ss[inner] == 1 && w.ds[inner] == 1) {  // contiguous rows
    const std::size_t row = static_cast<std::size_t>(n) * es;
    for (int i = 0; i < inner; ++i) outer_dims[i] = i;
    odometer(w, outer_dims, inner, es, s, o, [row](const char* a, char* b) { std::memcpy(b, a, row); });
    return;
  }
  // The source's unit-step dim, when the destination's innermost one is another: a transpose.
  int p = -1;
  if (w.ds[inner] == 1 && (es == 4 || es == 8 || es == 2 || es == 1))
    for (int d = 0; d < inner; ++d)
      if (w.ss[d] == 1) p = d;
  if (p >= 0) {
    int nd = 0;
    for (int d = 0; d < inner; ++d)
      if (d != p) outer_dims[nd++] = d;
    const std::int64_t rows = w.size[p], sn = w.ss[inner], dp = w.ds[p];
    odometer(w, outer_dims, nd, es, s, o, [&](const char* a, char* b) {
      switch (es) {
        case 1: return tiled_transpose<std::uint8_t>(a, b, rows, n, sn, dp);
        case 2: return tiled_transpose<std::uint16_t>(a, b, rows, n, sn, dp);
        case 4:
#ifdef PHALANX_LAYOUT_X86
          if (have_avx()) return tiled_transpose32_avx(a, b, rows, n, sn, dp);
#endif
          return tiled_transpose<std::uint32_t>(a, b, rows, n, sn, dp);
        default: return tiled_transpose<std::uint64_t>(a, b, rows, n, sn, dp);
      }
    });
    return;
  }
  for (int i = 0; i < inner; ++i) outer_dims[i] = i;
  const std::int64_t ss = w.ss[inner], ds = w.ds[inner];
  odometer(w, outer_dims, inner, es, s, o,
           [&](const char* a, char* b) { strided_row_bytes(a, b, n, ss, ds, es); });
}

namespace {
PHALANX_LAYOUT_CLONES
void masked_fill_rows(const float* x, const std::uint8_t* __restrict m, float value, float* o, std::int64_t n,
                      std::int64_t p) {
  for (std::int64_t base = 0; base < n; base += p) {  // a select the compiler vectorises
    const float* xs = x + base;
    float* os = o + base;
    for (std::int64_t j = 0; j < p; ++j) os[j] = m[j] ? value : xs[j];
  }
}
}  // namespace

void CpuKernels::masked_fill(const Tensor& x, const Tensor& mask, float value, Tensor& out) {
  const std::int64_t n = x.numel(), p = mask.numel();
  if (n == 0) return;
  masked_fill_rows(x.data<float>(), static_cast<const std::uint8_t*>(mask.raw_data()), value, out.data<float>(), n, p);
}

namespace {
template <typename T>
void triangle_rows(const T* x, T* o, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                   std::int64_t diagonal, bool upper) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* xr = x + (b * rows + i) * cols;
      T* orow = o + (b * rows + i) * cols;
      // lower keeps j <= i + diagonal, upper keeps j >= i + diagonal
      const std::int64_t edge = std::clamp<std::int64_t>(i + diagonal + (upper ? 0 : 1), 0, cols);
      const std::int64_t keep_from = upper ? edge : 0, keep_to = upper ? cols : edge;
      for (std::int64_t j = 0; j < keep_from; ++j) orow[j] = T{};
      if (o != x)
        for (std::int64_t j = keep_from; j < keep_to; ++j) orow[j] = xr[j];
      for (std::int64_t j = keep_to; j < cols; ++j) orow[j] = T{};
    }
}
}  // namespace

void CpuKernels::triangle(const Tensor& x, std::int64_t rows, std::int64_t cols, std::int64_t diagonal, bool upper,
                          Tensor& out) {
  if (x.numel() == 0) return;
  const std::int64_t batch = x.numel() / (rows * cols);
  const void* s = x.raw_data();
  void* o = out.raw_data();
  switch (element_size(x.dtype())) {
    case 1:
      return triangle_rows(static_cast<const std::uint8_t*>(s), static_cast<std::uint8_t*>(o), batch, rows, cols,
                           diagonal, upper);
    case 2:
      return triangle_rows(static_cast<const std::uint16_t*>(s), static_cast<std::uint16_t*>(o), batch, rows, cols,
                           diagonal, upper);
    case 4:
      return triangle_rows(static_cast<const std::uint32_t*>(s), static_cast<std::uint32_t*>(o), batch, rows, cols,
                           diagonal, upper);
    default:
      return triangle_rows(static_cast<const std::uint64_t*>(s), static_cast<std::uint64_t*>(o), batch, rows, cols,
                           diagonal, upper);
  }
}

}  // namespace phalanx
