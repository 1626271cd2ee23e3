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

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

namespace {

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
void tiled_transpose(const char* src, char* dst, std::int64_t rows, std::int64_t cols, std::int64_t sn,
                     std::int64_t dp) {
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
    for (int i = 0; i < inner; ++i) outer_dims[i] = i;
    const std::size_t row = static_cast<std::size_t>(n) * es;
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
        case 4: return tiled_transpose<std::uint32_t>(a, b, rows, n, sn, dp);
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

}  // namespace phalanx
