#include "shm_reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "phalanx/core/error.hpp"
#include "phalanx/core/half_sum.hpp"

namespace phalanx::shm {

namespace {

constexpr std::size_t kBlockBytes = 8192;  // the private buffer: well inside L1

#define PHX_INLINE inline __attribute__((always_inline))

struct Sum {
  template <class T> PHX_INLINE T operator()(T a, T b) const { return a + b; }
};
struct Prod {
  template <class T> PHX_INLINE T operator()(T a, T b) const { return a * b; }
};
struct Min {
  template <class T> PHX_INLINE T operator()(T a, T b) const { return b < a ? b : a; }  // std::min
};
struct Max {
  template <class T> PHX_INLINE T operator()(T a, T b) const { return a < b ? b : a; }  // std::max
};

/// Native types (float32, int64): acc = s0 op s1 op ... in source order, block by block.
template <class T, class Op>
PHX_INLINE void native(void* const* dst, int ndst, const void* const* src, int nsrc, std::size_t n, Op op,
                       int divisor) {
  constexpr std::size_t kBlock = kBlockBytes / sizeof(T);
  alignas(64) T tmp[kBlock];
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t m = std::min(kBlock, n - b);
    {  // the restrict pointers' scope ends before dst (maybe one of the sources) is written
      const T* __restrict s0 = static_cast<const T*>(src[0]) + b;
      if (nsrc == 1) {
        std::memcpy(tmp, s0, m * sizeof(T));
      } else {
        const T* __restrict s1 = static_cast<const T*>(src[1]) + b;
        for (std::size_t i = 0; i < m; ++i) tmp[i] = op(s0[i], s1[i]);
      }
    }
    for (int q = 2; q < nsrc; ++q) {
      const T* __restrict s = static_cast<const T*>(src[q]) + b;
      for (std::size_t i = 0; i < m; ++i) tmp[i] = op(tmp[i], s[i]);
    }
    if (divisor > 0) {
      const T d = static_cast<T>(divisor);
      for (std::size_t i = 0; i < m; ++i) tmp[i] = tmp[i] / d;
    }
    for (int d = 0; d < ndst; ++d) std::memcpy(static_cast<T*>(dst[d]) + b, tmp, m * sizeof(T));
  }
}

template <class T>
PHX_INLINE void native_op(ReduceOp op, void* const* d, int nd, const void* const* src, int nsrc, std::size_t n,
                          int divisor) {
  switch (op) {
    case ReduceOp::Sum: native<T>(d, nd, src, nsrc, n, Sum{}, 0); break;
    case ReduceOp::Avg: native<T>(d, nd, src, nsrc, n, Sum{}, divisor); break;
    case ReduceOp::Product: native<T>(d, nd, src, nsrc, n, Prod{}, 0); break;
    case ReduceOp::Min: native<T>(d, nd, src, nsrc, n, Min{}, 0); break;
    case ReduceOp::Max: native<T>(d, nd, src, nsrc, n, Max{}, 0); break;
  }
}

// One clone per instruction set, chosen at load time: memory-bound loops in L1/L2 still
// run twice as fast on 256-bit vectors as on SSE2 (the default target).
__attribute__((target_clones("avx512f", "avx2", "default"))) void reduce_f32(ReduceOp op, void* const* dst,
                                                                              int ndst, const void* const* src,
                                                                              int nsrc, std::size_t n, int divisor) {
  native_op<float>(op, dst, ndst, src, nsrc, n, divisor);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void reduce_i64(ReduceOp op, void* const* dst,
                                                                              int ndst, const void* const* src,
                                                                              int nsrc, std::size_t n, int divisor) {
  native_op<std::int64_t>(op, dst, ndst, src, nsrc, n, divisor);
}

}  // namespace

void reduce_into_all(DType dtype, ReduceOp op, void* const* dst, int ndst, const void* const* src, int nsrc,
                     std::size_t n, int divisor) {
  switch (dtype) {
    case DType::Float32: reduce_f32(op, dst, ndst, src, nsrc, n, divisor); return;
    case DType::Int64: reduce_i64(op, dst, ndst, src, nsrc, n, divisor); return;
    case DType::Bool: throw TypeError("shm: bool tensors cannot be reduced");  // ProcessGroup refuses them first
    case DType::Float16:
    case DType::BFloat16: break;
  }
  // 16-bit floats (sum only): widened, summed in source order in float32, rounded once;
  // libphalanx's AVX2 code (phalanx/core/half_sum.hpp), into the first two destinations; the
  // others copy the first (written after every source was read: a destination may be one).
  void* d0 = ndst > 0 ? dst[0] : nullptr;
  void* d1 = ndst > 1 ? dst[1] : nullptr;
  if (dtype == DType::Float16)
    fp16_sum(d0, d1, src, nsrc, n);
  else
    bf16_sum(d0, d1, src, nsrc, n);
  for (int d = 2; d < ndst; ++d) std::memcpy(dst[d], d0, n * 2);
}

void reduce_into(DType dtype, ReduceOp op, void* dst, void* dst2, const void* const* src, int nsrc, std::size_t n,
                 int divisor) {
  void* dsts[2];
  int nd = 0;
  if (dst) dsts[nd++] = dst;
  if (dst2) dsts[nd++] = dst2;
  reduce_into_all(dtype, op, dsts, nd, src, nsrc, n, divisor);
}

}  // namespace phalanx::shm
