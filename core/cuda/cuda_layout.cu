// Layout and mask kernels of the CUDA table (kernels.hpp, "layout and masks"): one thread
// per destination element, its index decomposed over the (at most kMaxLayoutDims) dims.
#include <algorithm>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"

namespace phalanx::cuda {

namespace {

constexpr int kThreads = 256;
inline int blocks_for(std::int64_t n) {
  return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 4));
}
#define LAYOUT_GRID_LOOP(i, n) \
  for (std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x; i < (n); i += (std::int64_t)blockDim.x * gridDim.x)

void after_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(what, e, __FILE__, __LINE__);
}

template <typename T>
__global__ void strided_copy_k(const T* src, T* dst, StridedLayout l, std::int64_t n) {
  LAYOUT_GRID_LOOP(i, n) {
    std::int64_t r = i, s = l.src_offset, d = l.dst_offset;
    for (int k = l.ndim - 1; k >= 0; --k) {
      const std::int64_t idx = r % l.sizes[k];
      r /= l.sizes[k];
      s += idx * l.src_strides[k];
      d += idx * l.dst_strides[k];
    }
    dst[d] = src[s];
  }
}

__global__ void masked_fill_k(const float* x, const unsigned char* m, float v, float* o, std::int64_t n,
                              std::int64_t p) {
  LAYOUT_GRID_LOOP(i, n) o[i] = m[i % p] ? v : x[i];
}

template <typename T>
__global__ void triangle_k(const T* x, T* o, std::int64_t n, std::int64_t rows, std::int64_t cols,
                           std::int64_t diagonal, bool upper) {
  LAYOUT_GRID_LOOP(i, n) {
    const std::int64_t j = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? j - r >= diagonal : j - r <= diagonal;
    o[i] = keep ? x[i] : T(0);
  }
}

}  // namespace

void CudaKernels::masked_fill(const Tensor& x, const Tensor& mask, float value, Tensor& out) {
  PHALANX_CUDA_CHECK(cudaSetDevice(x.device().index));
  const std::int64_t n = x.numel();
  if (n == 0) return;
  masked_fill_k<<<blocks_for(n), kThreads>>>(static_cast<const float*>(x.raw_data()),
                                             static_cast<const unsigned char*>(mask.raw_data()), value,
                                             static_cast<float*>(out.raw_data()), n, mask.numel());
  after_launch("masked_fill kernel");
}

void CudaKernels::triangle(const Tensor& x, std::int64_t rows, std::int64_t cols, std::int64_t diagonal, bool upper,
                           Tensor& out) {
  PHALANX_CUDA_CHECK(cudaSetDevice(x.device().index));
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const void* s = x.raw_data();
  void* d = out.raw_data();
  switch (element_size(x.dtype())) {
    case 1:
      triangle_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned char*>(s), static_cast<unsigned char*>(d), n,
                                              rows, cols, diagonal, upper);
      break;
    case 2:
      triangle_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned short*>(s), static_cast<unsigned short*>(d), n,
                                              rows, cols, diagonal, upper);
      break;
    case 4:
      triangle_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned int*>(s), static_cast<unsigned int*>(d), n,
                                              rows, cols, diagonal, upper);
      break;
    default:
      triangle_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned long long*>(s),
                                              static_cast<unsigned long long*>(d), n, rows, cols, diagonal, upper);
  }
  after_launch("triangle kernel");
}

void CudaKernels::strided_copy(const Tensor& src, const StridedLayout& l, Tensor& dst) {
  PHALANX_CUDA_CHECK(cudaSetDevice(src.device().index));
  std::int64_t n = 1;
  for (int k = 0; k < l.ndim; ++k) n *= l.sizes[k];
  if (n == 0) return;
  const void* s = src.raw_data();
  void* d = dst.raw_data();
  switch (element_size(src.dtype())) {
    case 1:
      strided_copy_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned char*>(s), static_cast<unsigned char*>(d), l, n);
      break;
    case 2:
      strided_copy_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned short*>(s), static_cast<unsigned short*>(d), l, n);
      break;
    case 4:
      strided_copy_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned int*>(s), static_cast<unsigned int*>(d), l, n);
      break;
    default:
      strided_copy_k<<<blocks_for(n), kThreads>>>(static_cast<const unsigned long long*>(s),
                                                  static_cast<unsigned long long*>(d), l, n);
  }
  after_launch("strided_copy kernel");
}

}  // namespace phalanx::cuda
