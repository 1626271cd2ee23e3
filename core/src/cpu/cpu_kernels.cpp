#include "cpu/cpu_kernels.hpp"

#include "cpu/bf16_elementwise.hpp"
#include "cpu/bf16_gemm.hpp"
#include "cpu/fp16_convert.hpp"
#include "cpu/small_gemm.hpp"
#include "phalanx/core/half.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace phalanx {

DeviceKernels& cpu_kernels() {
  static CpuKernels k;
  return k;
}

void* CpuKernels::allocate(std::size_t nbytes, int) { return allocator_.allocate(nbytes); }
void CpuKernels::deallocate(void* p, std::size_t nbytes, int) { allocator_.deallocate(p, nbytes); }
void CpuKernels::copy(void* dst, const void* src, std::size_t n) {
  if (n) std::memmove(dst, src, n);
}
void CpuKernels::copy_to_host(void* dst, const void* src, std::size_t n) { copy(dst, src, n); }
void CpuKernels::copy_from_host(void* dst, const void* src, std::size_t n) { copy(dst, src, n); }

void CpuKernels::fill(Tensor& out, double value) {
  const std::int64_t n = out.numel();
  if (value == 0.0 && !std::signbit(value)) {  // +0 is all-zero bytes in every dtype
    std::memset(out.raw_data(), 0, static_cast<std::size_t>(n) * element_size(out.dtype()));
    return;
  }
  if (out.dtype() == DType::Float32) {
    float* p = out.data<float>();
    std::fill(p, p + n, static_cast<float>(value));
  } else if (out.dtype() == DType::Int64) {
    auto* p = out.data<std::int64_t>();
    std::fill(p, p + n, static_cast<std::int64_t>(value));
  } else if (out.dtype() == DType::Bool) {  // PyTorch: any non-zero value (NaN too) is true
    std::memset(out.raw_data(), value != 0.0 ? 1 : 0, static_cast<std::size_t>(n));
  } else {  // float16 / bfloat16: one 2-byte pattern per element, rounded as convert() does
    const float v = static_cast<float>(value);
    const std::uint16_t bits = out.dtype() == DType::Float16 ? float_to_fp16(v) : float_to_bf16(v);
    auto* p = static_cast<std::uint16_t*>(out.raw_data());
    std::fill(p, p + n, bits);
  }
}

void CpuKernels::axpy(float alpha, const Tensor& x, Tensor& y) {
  if (y.dtype() == DType::BFloat16) {  // summing bf16 gradients: in float32, rounded once
    const auto* xs = static_cast<const std::uint16_t*>(x.raw_data());
    auto* ys = static_cast<std::uint16_t*>(y.raw_data());
    for (std::int64_t i = 0, n = y.numel(); i < n; ++i)
      ys[i] = float_to_bf16(bf16_to_float(ys[i]) + alpha * bf16_to_float(xs[i]));
    return;
  }
  const float* __restrict xs = x.data<float>();
  float* __restrict ys = y.data<float>();
  const std::int64_t n = y.numel();
  if (alpha == 1.f)
    for (std::int64_t i = 0; i < n; ++i) ys[i] += xs[i];
  else
    for (std::int64_t i = 0; i < n; ++i) ys[i] += alpha * xs[i];
}

void CpuKernels::scale(Tensor& x, float f) {
  float* p = x.data<float>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) p[i] *= f;
}

void CpuKernels::divide(Tensor& x, float d) {
  float* p = x.data<float>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) p[i] /= d;
}

void CpuKernels::gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      float alpha, const float* a, std::int64_t lda, const float* b,
                      std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  // Phalanx's kernel is single-threaded: for large products it replaces a generic OpenBLAS
  // only when OpenBLAS would run single-threaded too (each data-parallel worker does).
  if (m * n * k <= cpu::kSmallGemmMacs || (cpu::own_gemm_for_all_sizes() && openblas_get_num_threads() == 1)) {
    cpu::small_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void CpuKernels::gemm_bf16(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                           const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
                           float beta, void* c, std::int64_t ldc, bool c_bf16) {
  cpu::bf16_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, c_bf16);
}

namespace {
/// o[j] = sum over rows of x[r * p + j], added row by row (each o[j] in the same order on every
/// path): a Linear's bias gradient, once per layer and step. Compiled for AVX-512F, AVX2 and
/// baseline x86-64, picked at load time (as small_gemm's blocks are).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void column_sums(const float* __restrict x, std::int64_t rows, std::int64_t p, float* __restrict o) {
  for (std::int64_t j = 0; j < p; ++j) o[j] = 0.f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * p;
    for (std::int64_t j = 0; j < p; ++j) o[j] += row[j];
  }
}
}  // namespace

void CpuKernels::sum_to_period(const Tensor& in, Tensor& out, float scale) {
  const std::int64_t p = out.numel(), rows = in.numel() / p;
  float* __restrict o = out.data<float>();
  if (in.dtype() == DType::BFloat16)  // a bf16 gradient's column sums, in float32 (matmul.cpp's LinearBackward)
    cpu::column_sums_bf16(static_cast<const std::uint16_t*>(in.raw_data()), rows, p, o);
  else
    column_sums(in.data<float>(), rows, p, o);
  if (scale != 1.f)
    for (std::int64_t j = 0; j < p; ++j) o[j] *= scale;
}

void CpuKernels::sum_dim(const Tensor& in, std::int64_t outer, std::int64_t d, std::int64_t inner,
                         Tensor& out, float scale) {
  const float* x = in.data<float>();
  float* o = out.data<float>();
  if (inner == 1) {
    // Contiguous rows: accumulate in double (sums of many terms, e.g. a whole-batch loss).
    for (std::int64_t r = 0; r < outer; ++r) {
      const float* row = x + r * d;
      double s = 0.0;
      for (std::int64_t i = 0; i < d; ++i) s += row[i];
      o[r] = static_cast<float>(s * scale);
    }
    return;
  }
  for (std::int64_t r = 0; r < outer; ++r) {
    float* orow = o + r * inner;
    std::fill(orow, orow + inner, 0.f);
    for (std::int64_t i = 0; i < d; ++i) {
      const float* row = x + (r * d + i) * inner;
      for (std::int64_t j = 0; j < inner; ++j) orow[j] += row[j];
    }
    if (scale != 1.f)
      for (std::int64_t j = 0; j < inner; ++j) orow[j] *= scale;
  }
}

void CpuKernels::expand_dim(const Tensor& g, std::int64_t outer, std::int64_t d,
                            std::int64_t inner, Tensor& out, float scale) {
  const float* x = g.data<float>();
  float* o = out.data<float>();
  for (std::int64_t r = 0; r < outer; ++r)
    for (std::int64_t i = 0; i < d; ++i) {
      float* orow = o + (r * d + i) * inner;
      const float* grow = x + r * inner;
      for (std::int64_t j = 0; j < inner; ++j) orow[j] = grow[j] * scale;
    }
}

void CpuKernels::broadcast_rows(const Tensor& row, Tensor& out) {
  const std::int64_t p = row.numel(), rows = out.numel() / std::max<std::int64_t>(p, 1);
  const float* r = row.data<float>();
  float* o = out.data<float>();
  for (std::int64_t i = 0; i < rows; ++i) std::memcpy(o + i * p, r, p * sizeof(float));
}

void CpuKernels::transpose(const Tensor& in, int d0, int d1, Tensor& out) {
  const Shape& s = in.shape();
  if (d0 > d1) std::swap(d0, d1);
  // View as [A, n0, B, n1, C] and write [A, n1, B, n0, C]: one strided copy (cpu_layout.cpp),
  // whose tiled path serves the swaps of the last dim (k^T in attention) that a copy of C
  // elements at a time made one call per element.
  std::int64_t A = 1, B = 1, C = 1;
  for (int i = 0; i < d0; ++i) A *= s[i];
  for (int i = d0 + 1; i < d1; ++i) B *= s[i];
  for (std::size_t i = d1 + 1; i < s.size(); ++i) C *= s[i];
  const std::int64_t n0 = s[d0], n1 = s[d1];
  StridedLayout l;
  l.ndim = 5;
  const std::int64_t sizes[5] = {A, n1, B, n0, C};
  const std::int64_t src[5] = {n0 * B * n1 * C, C, n1 * C, B * n1 * C, 1};
  const std::int64_t dst[5] = {n1 * B * n0 * C, B * n0 * C, n0 * C, C, 1};
  for (int i = 0; i < 5; ++i) {
    l.sizes[i] = sizes[i];
    l.src_strides[i] = src[i];
    l.dst_strides[i] = dst[i];
  }
  strided_copy(in, l, out);
}

void CpuKernels::log_softmax(const Tensor& x, std::int64_t outer, std::int64_t d,
                             std::int64_t inner, Tensor& out) {
  const float* in = x.data<float>();
  float* o = out.data<float>();
  for (std::int64_t r = 0; r < outer; ++r)
    for (std::int64_t j = 0; j < inner; ++j) {
      const float* base = in + r * d * inner + j;
      float* obase = o + r * d * inner + j;
      float mx = -INFINITY;
      for (std::int64_t i = 0; i < d; ++i) mx = std::max(mx, base[i * inner]);
      double s = 0.0;
      for (std::int64_t i = 0; i < d; ++i) s += std::exp(static_cast<double>(base[i * inner] - mx));
      // (x - max) - log(sum), as PyTorch: x - (max + log(sum)) would round log(sum) away
      // when |max| is large (a row masked with -1e9 would give log-probabilities of 0).
      const float log_sum = static_cast<float>(std::log(s));
      for (std::int64_t i = 0; i < d; ++i) obase[i * inner] = (base[i * inner] - mx) - log_sum;
    }
}

void CpuKernels::log_softmax_backward(const Tensor& grad_y, const Tensor& y, std::int64_t outer,
                                      std::int64_t d, std::int64_t inner, Tensor& grad_x) {
  const float* g = grad_y.data<float>();
  const float* yy = y.data<float>();
  float* o = grad_x.data<float>();
  for (std::int64_t r = 0; r < outer; ++r)
    for (std::int64_t j = 0; j < inner; ++j) {
      const std::int64_t off = r * d * inner + j;
      double s = 0.0;
      for (std::int64_t i = 0; i < d; ++i) s += g[off + i * inner];
      for (std::int64_t i = 0; i < d; ++i)
        o[off + i * inner] =
            g[off + i * inner] - std::exp(yy[off + i * inner]) * static_cast<float>(s);
    }
}

void CpuKernels::cross_entropy(const Tensor& logits, const Tensor& target, Tensor& probs,
                               Tensor& loss) {
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  const float* x = logits.data<float>();
  const auto* t = target.data<std::int64_t>();
  float* p = probs.data<float>();
  float* l = loss.data<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    const float* row = x + r * c;
    float* prow = p + r * c;
    float mx = row[0];
    for (std::int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
    float s = 0.f;
    for (std::int64_t j = 0; j < c; ++j) {
      prow[j] = std::exp(row[j] - mx);
      s += prow[j];
    }
    const float inv = 1.f / s;
    for (std::int64_t j = 0; j < c; ++j) prow[j] *= inv;
    l[r] = std::log(s) - (row[t[r]] - mx);  // not (mx + log s) - x: see log_softmax
  }
}

void CpuKernels::cross_entropy_backward(const Tensor& probs, const Tensor& target,
                                        const Tensor& grad_loss, float scale,
                                        Tensor& grad_logits) {
  const std::int64_t n = probs.shape()[0], c = probs.shape()[1];
  const float* p = probs.data<float>();
  const auto* t = target.data<std::int64_t>();
  const float* gl = grad_loss.data<float>();
  const bool per_row = grad_loss.numel() == n && n != 1;
  float* o = grad_logits.data<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    const float g = (per_row ? gl[r] : gl[0]) * scale;
    const float* prow = p + r * c;
    float* orow = o + r * c;
    for (std::int64_t j = 0; j < c; ++j) orow[j] = prow[j] * g;
    orow[t[r]] -= g;
  }
}

void CpuKernels::convert(const Tensor& src, Tensor& dst) {
  const std::int64_t n = src.numel();
  const DType from = src.dtype(), to = dst.dtype();
  if (from == DType::Float32 && (to == DType::Float16 || to == DType::BFloat16)) {
    const float* s = src.data<float>();
    auto* d = static_cast<std::uint16_t*>(dst.raw_data());
    if (to == DType::Float16)
      cpu::floats_to_fp16(s, d, n);
    else
      cpu::floats_to_bf16(s, d, n);
  } else if (to == DType::Float32 && (from == DType::Float16 || from == DType::BFloat16)) {
    const auto* s = static_cast<const std::uint16_t*>(src.raw_data());
    float* d = dst.data<float>();
    if (from == DType::Float16)
      cpu::fp16_to_floats(s, d, n);
    else
      cpu::bf16_to_floats(s, d, n);
  } else {
    throw TypeError(std::string("convert: ") + dtype_name(from) + " to " + dtype_name(to) +
                    " is not supported (float32 <-> float16/bfloat16)");
  }
}

std::int64_t CpuKernels::find_label_out_of_range(const Tensor& target, std::int64_t classes) {
  const auto* t = target.data<std::int64_t>();
  for (std::int64_t i = 0; i < target.numel(); ++i)
    if (t[i] < 0 || t[i] >= classes) return i;
  return -1;
}

}  // namespace phalanx
