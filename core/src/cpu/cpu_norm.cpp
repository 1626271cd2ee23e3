// CPU kernels for normalisation (per-channel statistics over [outer, c, inner]), embedding
// gather/scatter-add, argmax and clamp. Plain loops; sums in double.
#include <cmath>
#include <cstring>

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

namespace {
inline float at_or(const Tensor& t, std::int64_t i, float dflt) {
  return t.defined() ? t.data<float>()[i] : dflt;
}

// The per-channel sums run in double over 8 lanes (element i of a row into lane i % 8, the
// lanes added in order at the end): one sequential double sum was a chain of dependent adds
// (a layer_norm row of 128 is a channel here), 8 lanes vectorise. The order is fixed, so the
// result does not depend on the vector width; fp-contract=off keeps FMA out of the AVX-512
// clone, so each clone gives the same bits.
constexpr int kLanes = 8;
using Lanes = double[kLanes];

inline double lanes_total(const Lanes acc) {
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_NORM_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
#else
#define PHALANX_NORM_CLONES
#endif

/// acc[i % 8] += x[i] (sum) or (x[i] - m)^2 (centred squares).
PHALANX_NORM_CLONES
void add_row(const float* __restrict x, std::int64_t n, double m, bool squares, double* __restrict acc) {
  std::int64_t i = 0;
  if (squares) {
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        const double d = x[i + j] - m;
        acc[j] += d * d;
      }
    for (int j = 0; i < n; ++i, ++j) {
      const double d = x[i] - m;
      acc[j] += d * d;
    }
  } else {
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  }
}

/// s[i % 8] += g[i], d[i % 8] += g[i] (x[i] - m).
PHALANX_NORM_CLONES
void add_row_dy(const float* __restrict g, const float* __restrict x, std::int64_t n, double m,
                double* __restrict s, double* __restrict d) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double gj = g[i + j];
      s[j] += gj;
      d[j] += gj * (x[i + j] - m);
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double gj = g[i];
    s[j] += gj;
    d[j] += gj * (x[i] - m);
  }
}
}  // namespace

void CpuKernels::batch_norm_stats(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                  Tensor& mean, Tensor& var) {
  const float* px = x.data<float>();
  float* pm = mean.data<float>();
  float* pv = var.data<float>();
  const double n = static_cast<double>(outer * inner);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    Lanes sum = {}, sq = {};
    for (std::int64_t o = 0; o < outer; ++o) add_row(px + (o * c + ch) * inner, inner, 0.0, false, sum);
    const double m = n > 0 ? lanes_total(sum) / n : 0.0;
    for (std::int64_t o = 0; o < outer; ++o) add_row(px + (o * c + ch) * inner, inner, m, true, sq);
    const double q = lanes_total(sq);
    pm[ch] = static_cast<float>(m);
    pv[ch] = static_cast<float>(n > 0 ? q / n : 0.0);
  }
}

void CpuKernels::batch_norm_elemt(const Tensor& x, std::int64_t outer, std::int64_t c, std::int64_t inner,
                                  const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                                  const Tensor& bias, Tensor& out) {
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const float* pm = mean.data<float>();
  const float* pi = invstd.data<float>();
  for (std::int64_t ch = 0; ch < c; ++ch) {
    // As PyTorch's CPU kernel: y = x * alpha + beta with alpha = invstd * w, beta = b - mean * alpha.
    const float alpha = pi[ch] * at_or(weight, ch, 1.f);
    const float beta = at_or(bias, ch, 0.f) - pm[ch] * alpha;
    for (std::int64_t o = 0; o < outer; ++o) {
      const std::int64_t off = (o * c + ch) * inner;
      const float* __restrict xr = px + off;
      float* __restrict orow = po + off;
      for (std::int64_t i = 0; i < inner; ++i) orow[i] = xr[i] * alpha + beta;
    }
  }
}

void CpuKernels::batch_norm_backward_reduce(const Tensor& grad_y, const Tensor& x, std::int64_t outer,
                                            std::int64_t c, std::int64_t inner, const Tensor& mean,
                                            Tensor& sum_dy, Tensor& sum_dy_xmu) {
  const float* pg = grad_y.data<float>();
  const float* px = x.data<float>();
  const float* pm = mean.data<float>();
  float* ps = sum_dy.data<float>();
  float* pd = sum_dy_xmu.data<float>();
  for (std::int64_t ch = 0; ch < c; ++ch) {
    Lanes s = {}, d = {};
    const double m = pm[ch];
    for (std::int64_t o = 0; o < outer; ++o) {
      const std::int64_t off = (o * c + ch) * inner;
      add_row_dy(pg + off, px + off, inner, m, s, d);
    }
    ps[ch] = static_cast<float>(lanes_total(s));
    pd[ch] = static_cast<float>(lanes_total(d));
  }
}

void CpuKernels::batch_norm_backward_elemt(const Tensor& grad_y, const Tensor& x, std::int64_t outer,
                                           std::int64_t c, std::int64_t inner, const Tensor& mean,
                                           const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                           const Tensor& sum_dy_xmu, double count, Tensor& grad_x) {
  const float* pg = grad_y.data<float>();
  const float* px = x.data<float>();
  const float* pm = mean.data<float>();
  const float* pi = invstd.data<float>();
  float* po = grad_x.data<float>();
  const bool batch = sum_dy.defined();
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const float is = pi[ch];
    const float scale = is * at_or(weight, ch, 1.f);
    const float m = pm[ch];
    const float mean_dy = batch ? static_cast<float>(sum_dy.data<float>()[ch] / count) : 0.f;
    const float proj = batch ? static_cast<float>(sum_dy_xmu.data<float>()[ch] / count) * is * is : 0.f;
    for (std::int64_t o = 0; o < outer; ++o) {
      const std::int64_t off = (o * c + ch) * inner;
      const float* __restrict g = pg + off;
      const float* __restrict xr = px + off;
      float* __restrict orow = po + off;
      if (batch)
        for (std::int64_t i = 0; i < inner; ++i) orow[i] = (g[i] - mean_dy - (xr[i] - m) * proj) * scale;
      else
        for (std::int64_t i = 0; i < inner; ++i) orow[i] = g[i] * scale;
    }
  }
}

void CpuKernels::embedding(const Tensor& weight, const Tensor& indices, Tensor& out) {
  const std::int64_t n = indices.numel(), dim = weight.shape()[1];
  const std::int64_t* idx = indices.data<std::int64_t>();
  const float* w = weight.data<float>();
  float* o = out.data<float>();
  for (std::int64_t i = 0; i < n; ++i)
    std::memcpy(o + i * dim, w + idx[i] * dim, static_cast<std::size_t>(dim) * sizeof(float));
}

void CpuKernels::embedding_backward(const Tensor& grad, const Tensor& indices, std::int64_t padding_idx,
                                    Tensor& grad_weight) {
  const std::int64_t n = indices.numel(), dim = grad_weight.shape()[1];
  const std::int64_t* idx = indices.data<std::int64_t>();
  const float* g = grad.data<float>();
  float* gw = grad_weight.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (idx[i] == padding_idx) continue;
    float* __restrict row = gw + idx[i] * dim;
    const float* __restrict gr = g + i * dim;
    for (std::int64_t j = 0; j < dim; ++j) row[j] += gr[j];
  }
}

void CpuKernels::argmax(const Tensor& x, std::int64_t outer, std::int64_t d, std::int64_t inner, Tensor& out) {
  const float* px = x.data<float>();
  std::int64_t* po = out.data<std::int64_t>();
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t n = 0; n < inner; ++n) {
      const float* base = px + o * d * inner + n;
      std::int64_t best = 0;
      float bv = base[0];
      for (std::int64_t i = 1; i < d && !std::isnan(bv); ++i) {
        const float v = base[i * inner];
        if (v > bv || std::isnan(v)) {
          bv = v;
          best = i;
        }
      }
      po[o * inner + n] = best;
    }
}

void CpuKernels::clamp(const Tensor& x, float lo, float hi, Tensor& out) {
  const float* __restrict px = x.data<float>();
  float* __restrict po = out.data<float>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    po[i] = v < lo ? lo : (v > hi ? hi : v);  // NaN fails both compares and stays
  }
}

}  // namespace phalanx
