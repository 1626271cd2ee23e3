// CPU kernels of convolution and pooling: im2col/col2im for the GEMM-based
// convolution (core/src/ops/conv.cpp runs the GEMMs), and direct pooling loops with
// PyTorch 1.13's window, index and divisor rules.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/cpu_kernels.hpp"

namespace phalanx {

namespace {

// [lo, hi): the output columns ox whose input column ox * s + off lies in [0, w).
void valid_range(std::int64_t off, std::int64_t s, std::int64_t w, std::int64_t ow, std::int64_t& lo,
                 std::int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = w - 1 - off < 0 ? 0 : (w - 1 - off) / s + 1;
  lo = std::min(lo, ow);
  hi = std::max(lo, std::min(hi, ow));
}

}  // namespace

void CpuKernels::im2col(const Tensor& x, std::int64_t image, const Window2d& g, Tensor& col) {
  const std::int64_t L = g.oh * g.ow, plane = g.h * g.w;
  const float* __restrict src = x.data<float>() + image * g.c * plane;
  float* __restrict dst = col.data<float>();
  for (std::int64_t ci = 0; ci < g.c; ++ci) {
    const float* p = src + ci * plane;
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        float* row = dst + ((ci * g.kh + i) * g.kw + j) * L;
        const std::int64_t xoff = j * g.dw - g.pw;
        std::int64_t lo, hi;
        valid_range(xoff, g.sw, g.w, g.ow, lo, hi);
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          float* r = row + oy * g.ow;
          const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) {
            std::memset(r, 0, sizeof(float) * g.ow);
            continue;
          }
          const float* in = p + iy * g.w + xoff;
          for (std::int64_t ox = 0; ox < lo; ++ox) r[ox] = 0.f;
          if (g.sw == 1) {
            std::memcpy(r + lo, in + lo, sizeof(float) * (hi - lo));
          } else {
            for (std::int64_t ox = lo; ox < hi; ++ox) r[ox] = in[ox * g.sw];
          }
          for (std::int64_t ox = hi; ox < g.ow; ++ox) r[ox] = 0.f;
        }
      }
  }
}

void CpuKernels::col2im(const Tensor& col, std::int64_t image, const Window2d& g, Tensor& grad_x) {
  const std::int64_t L = g.oh * g.ow, plane = g.h * g.w;
  float* __restrict dst = grad_x.data<float>() + image * g.c * plane;
  const float* __restrict src = col.data<float>();
  std::memset(dst, 0, sizeof(float) * g.c * plane);
  for (std::int64_t ci = 0; ci < g.c; ++ci) {
    float* p = dst + ci * plane;
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const float* row = src + ((ci * g.kh + i) * g.kw + j) * L;
        const std::int64_t xoff = j * g.dw - g.pw;
        std::int64_t lo, hi;
        valid_range(xoff, g.sw, g.w, g.ow, lo, hi);
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          const float* r = row + oy * g.ow;
          float* out = p + iy * g.w + xoff;
          if (g.sw == 1) {
            for (std::int64_t ox = lo; ox < hi; ++ox) out[ox] += r[ox];
          } else {
            for (std::int64_t ox = lo; ox < hi; ++ox) out[ox * g.sw] += r[ox];
          }
        }
      }
  }
}

void CpuKernels::max_pool2d(const Tensor& x, const Window2d& g, Tensor& out, Tensor& indices) {
  const float* src = x.data<float>();
  float* o = out.data<float>();
  std::int64_t* idx = indices.data<std::int64_t>();
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w;
  if (g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0) {  // the common 2x2 pool
    for (std::int64_t pl = 0; pl < planes; ++pl) {
      const float* p = src + pl * plane;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const float* r0 = p + 2 * oy * g.w;
        const float* r1 = r0 + g.w;
        const std::int64_t base = 2 * oy * g.w;
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          // PyTorch's scan order: (0,0), (0,1), (1,0), (1,1); a later value wins if larger or NaN.
          // Selects, not branches (random data makes each comparison a coin toss for the
          // predictor); a window with a NaN (or infinities of both signs) takes the exact scan.
          const float v[4] = {r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1]};
          float m = v[0];
          int q_best = 0;
          const float total = v[0] + v[1] + v[2] + v[3];
          if (__builtin_expect(total != total, 0)) {
            for (int q = 1; q < 4; ++q)
              if (v[q] > m || std::isnan(v[q])) m = v[q], q_best = q;
          } else {
            for (int q = 1; q < 4; ++q) {  // setcc and arithmetic, which GCC keeps branch-free
              const int take = v[q] > m;
              q_best += take * (q - q_best);
              m = std::max(m, v[q]);
            }
          }
          *o++ = m;
          *idx++ = base + (q_best >> 1) * g.w + 2 * ox + (q_best & 1);
        }
      }
    }
    return;
  }
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    const float* p = src + pl * plane;
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      std::int64_t y0 = oy * g.sh - g.ph;
      const std::int64_t y1 = std::min(y0 + (g.kh - 1) * g.dh + 1, g.h);
      while (y0 < 0) y0 += g.dh;
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        std::int64_t x0 = ox * g.sw - g.pw;
        const std::int64_t x1 = std::min(x0 + (g.kw - 1) * g.dw + 1, g.w);
        while (x0 < 0) x0 += g.dw;
        std::int64_t best = y0 * g.w + x0;
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t iy = y0; iy < y1; iy += g.dh)
          for (std::int64_t ix = x0; ix < x1; ix += g.dw) {
            const float v = p[iy * g.w + ix];
            if (v > m || std::isnan(v)) {
              m = v;
              best = iy * g.w + ix;
            }
          }
        *o++ = m;
        *idx++ = best;
      }
    }
  }
}

void CpuKernels::max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Window2d& g,
                                     Tensor& grad_x) {
  const float* go = grad_out.data<float>();
  const std::int64_t* idx = indices.data<std::int64_t>();
  float* gx = grad_x.data<float>();
  std::memset(gx, 0, grad_x.nbytes());
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w, L = g.oh * g.ow;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    float* p = gx + pl * plane;
    for (std::int64_t o = 0; o < L; ++o) p[idx[pl * L + o]] += go[pl * L + o];
  }
}

namespace {

// PyTorch's avg-pool window of output (oy, ox): clipped bounds and the divisor.
struct AvgWindow {
  std::int64_t y0, y1, x0, x1;
  float divisor;
  bool empty;
};
AvgWindow avg_window(const Window2d& g, bool count_include_pad, std::int64_t oy, std::int64_t ox) {
  AvgWindow a;
  a.y0 = oy * g.sh - g.ph;
  a.x0 = ox * g.sw - g.pw;
  a.y1 = std::min(a.y0 + g.kh, g.h + g.ph);
  a.x1 = std::min(a.x0 + g.kw, g.w + g.pw);
  const std::int64_t pool = (a.y1 - a.y0) * (a.x1 - a.x0);
  a.y0 = std::max<std::int64_t>(a.y0, 0);
  a.x0 = std::max<std::int64_t>(a.x0, 0);
  a.y1 = std::min(a.y1, g.h);
  a.x1 = std::min(a.x1, g.w);
  a.empty = a.y0 >= a.y1 || a.x0 >= a.x1;
  a.divisor = static_cast<float>(count_include_pad ? pool : (a.y1 - a.y0) * (a.x1 - a.x0));
  return a;
}

}  // namespace

void CpuKernels::avg_pool2d(const Tensor& x, const Window2d& g, bool count_include_pad, Tensor& out) {
  const float* src = x.data<float>();
  float* o = out.data<float>();
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    const float* p = src + pl * plane;
    for (std::int64_t oy = 0; oy < g.oh; ++oy)
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const AvgWindow a = avg_window(g, count_include_pad, oy, ox);
        float s = 0.f;
        if (!a.empty)
          for (std::int64_t iy = a.y0; iy < a.y1; ++iy)
            for (std::int64_t ix = a.x0; ix < a.x1; ++ix) s += p[iy * g.w + ix];
        *o++ = a.empty ? 0.f : s / a.divisor;
      }
  }
}

void CpuKernels::avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, bool count_include_pad,
                                     Tensor& grad_x) {
  const float* go = grad_out.data<float>();
  float* gx = grad_x.data<float>();
  std::memset(gx, 0, grad_x.nbytes());
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    float* p = gx + pl * plane;
    for (std::int64_t oy = 0; oy < g.oh; ++oy)
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const AvgWindow a = avg_window(g, count_include_pad, oy, ox);
        const float d = *go++;
        if (a.empty) continue;
        const float v = d / a.divisor;
        for (std::int64_t iy = a.y0; iy < a.y1; ++iy)
          for (std::int64_t ix = a.x0; ix < a.x1; ++ix) p[iy * g.w + ix] += v;
      }
  }
}

namespace {
std::int64_t start_index(std::int64_t a, std::int64_t b, std::int64_t c) { return (a * c) / b; }
std::int64_t end_index(std::int64_t a, std::int64_t b, std::int64_t c) { return ((a + 1) * c + b - 1) / b; }
}  // namespace

void CpuKernels::adaptive_avg_pool2d(const Tensor& x, const Window2d& g, Tensor& out) {
  const float* src = x.data<float>();
  float* o = out.data<float>();
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    const float* p = src + pl * plane;
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      const std::int64_t y0 = start_index(oy, g.oh, g.h), y1 = end_index(oy, g.oh, g.h);
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const std::int64_t x0 = start_index(ox, g.ow, g.w), x1 = end_index(ox, g.ow, g.w);
        float s = 0.f;
        for (std::int64_t iy = y0; iy < y1; ++iy)
          for (std::int64_t ix = x0; ix < x1; ++ix) s += p[iy * g.w + ix];
        *o++ = s / static_cast<float>((y1 - y0) * (x1 - x0));
      }
    }
  }
}

void CpuKernels::adaptive_avg_pool2d_backward(const Tensor& grad_out, const Window2d& g, Tensor& grad_x) {
  const float* go = grad_out.data<float>();
  float* gx = grad_x.data<float>();
  std::memset(gx, 0, grad_x.nbytes());
  const std::int64_t planes = g.n * g.c, plane = g.h * g.w;
  for (std::int64_t pl = 0; pl < planes; ++pl) {
    float* p = gx + pl * plane;
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      const std::int64_t y0 = start_index(oy, g.oh, g.h), y1 = end_index(oy, g.oh, g.h);
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const std::int64_t x0 = start_index(ox, g.ow, g.w), x1 = end_index(ox, g.ow, g.w);
        const float v = *go++ / static_cast<float>((y1 - y0) * (x1 - x0));
        for (std::int64_t iy = y0; iy < y1; ++iy)
          for (std::int64_t ix = x0; ix < x1; ++ix) p[iy * g.w + ix] += v;
      }
    }
  }
}

void CpuKernels::add_channel_bias(const Tensor& bias, std::int64_t outer, std::int64_t inner, Tensor& out) {
  const float* b = bias.data<float>();
  float* o = out.data<float>();
  const std::int64_t c = bias.numel();
  for (std::int64_t i = 0; i < outer; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      float* row = o + (i * c + ch) * inner;
      const float v = b[ch];
      for (std::int64_t k = 0; k < inner; ++k) row[k] += v;
    }
}

void CpuKernels::channel_sum(const Tensor& g, std::int64_t outer, std::int64_t inner, Tensor& out) {
  const float* x = g.data<float>();
  float* o = out.data<float>();
  const std::int64_t c = out.numel();
  std::fill(o, o + c, 0.f);
  for (std::int64_t i = 0; i < outer; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const float* row = x + (i * c + ch) * inner;
      float s = 0.f;
      for (std::int64_t k = 0; k < inner; ++k) s += row[k];
      o[ch] += s;
    }
}

}  // namespace phalanx
