// Elementwise CPU kernels: xtensor expressions over adapted buffers (no copies).
#include <algorithm>
#include <array>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/bf16_elementwise.hpp"
#include "cpu/cpu_kernels.hpp"

namespace phalanx {

namespace {
using Shape1 = std::array<std::size_t, 1>;
using Shape2 = std::array<std::size_t, 2>;

auto flat(const Tensor& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  return xt::adapt(t.data<float>(), n, xt::no_ownership(), Shape1{n});
}
auto rows(const Tensor& t, std::size_t period) {
  const auto n = static_cast<std::size_t>(t.numel());
  return xt::adapt(t.data<float>(), n, xt::no_ownership(), Shape2{n / period, period});
}

// ReLU and its backward are a step's memory-bound elementwise passes ([batch, width] each,
// L2-resident): compiled for AVX-512F, AVX2 and baseline x86-64, picked at load time (as
// small_gemm's blocks are). A compare and a blend, no arithmetic: the same bits on each.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_ELEMENTWISE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PHALANX_ELEMENTWISE_CLONES
#endif

/// NaN stays NaN, as in PyTorch (xt::maximum(x, 0) turned it into 0 and hid it).
PHALANX_ELEMENTWISE_CLONES
void relu(const float* __restrict x, float* __restrict o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    o[i] = xi <= 0.f ? 0.f : xi;
  }
}

/// y > 0 exactly where x > 0. As PyTorch's threshold_backward: zero where y <= 0, so a NaN y
/// passes the gradient on.
PHALANX_ELEMENTWISE_CLONES
void relu_backward(const float* __restrict g, const float* __restrict y, float* __restrict o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];  // unconditional load: lets the compiler use a blend
    o[i] = y[i] <= 0.f ? 0.f : gi;
  }
}


// GELU's forward and backward are a step's costliest elementwise passes ([tokens, 4 x width]);
// libm's erff/expf are scalar calls. These are branch-free (both erf ranges computed, then
// selected) so that each clone vectorises. Every multiply-add is an explicit std::fma and
// nothing else is contractible, so each clone (the baseline one through libm's fmaf) gives
// the same bits. "arch=haswell" is AVX2 with FMA.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_FMA_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define PHALANX_FMA_CLONES
#endif

__attribute__((always_inline)) inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
__attribute__((always_inline)) inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// c ? a : b as bit operations: GCC does not if-convert a select between two float
/// computations (with trapping math they could trap), it branches, and then the loop does not
/// vectorise without AVX-512's masks.
__attribute__((always_inline)) inline float select_bits(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return bits_to_float((float_to_bits(a) & m) | (float_to_bits(b) & ~m));
}

/// exp(r) for r in [-87, 0] (callers clamp): 2^k exp(f), |f| <= ln2 / 2, a degree-7 polynomial;
/// within 1e-7 relative of exp. The result stays a normal float, so 2^k goes into the exponent bits.
__attribute__((always_inline)) inline float exp_nonpositive(float r) {
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = std::fma(r, 1.44269504f, magic);  // k in its low mantissa bits
  const float k = shifted - magic;
  float f = std::fma(k, -0.693145752f, r);  // ln 2 in two parts (Cody-Waite)
  f = std::fma(k, -1.42860677e-6f, f);
  float p = 1.98756912e-4f;
  p = std::fma(p, f, 1.39819994e-3f);
  p = std::fma(p, f, 8.33345205e-3f);
  p = std::fma(p, f, 4.16657962e-2f);
  p = std::fma(p, f, 1.66666657e-1f);
  p = std::fma(p, f, 5.0e-1f);
  p = std::fma(p, f * f, f) + 1.0f;
  return bits_to_float(float_to_bits(p) + ((float_to_bits(shifted) - float_to_bits(magic)) << 23));
}

/// erf(a) within 1.02 ulp of the exact value (checked against double erf over the float range):
/// a + a P(a^2) for |a| <= 0.9277, else 1 - exp(Q(|a|)) with its sign; |a| is capped at 4
/// (erf is 1 in float from 3.92) so exp's argument stays in range. NaN stays NaN.
__attribute__((always_inline)) inline float erf_float(float a) {
  const float t = std::fabs(a), s = a * a;
  float r = -5.96761703e-4f;
  r = std::fma(r, s, 4.99119423e-3f);
  r = std::fma(r, s, -2.67681349e-2f);
  r = std::fma(r, s, 1.12819925e-1f);
  r = std::fma(r, s, -3.76125336e-1f);
  r = std::fma(r, s, 1.28379166e-1f);
  const float small = std::fma(r, a, a);
  const float tc = select_bits(t < 4.0f, t, 4.0f);
  float u = std::fma(-1.72853470e-5f, tc, 3.83197126e-4f);
  const float v = std::fma(-3.88396438e-3f, tc, 2.42546219e-2f);
  u = std::fma(u, tc * tc, v);
  u = std::fma(u, tc, -1.06777877e-1f);
  u = std::fma(u, tc, -6.34846687e-1f);
  u = std::fma(u, tc, -1.28717512e-1f);
  u = std::fma(u, tc, -tc);
  const float big = std::copysign(1.0f - exp_nonpositive(u), a);
  return select_bits(t > 0.927734375f, big, small);
}

/// PyTorch's exact (erf) GELU: x/2 (1 + erf(x / sqrt 2)).
PHALANX_FMA_CLONES
void gelu(const float* __restrict x, float* __restrict o, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    o[i] = xi * 0.5f * (1.0f + erf_float(xi * static_cast<float>(M_SQRT1_2)));
  }
}

/// d/dx = Phi(x) + x phi(x), as PyTorch's GeluBackward; phi is 0 where x^2/2 > 87 (exp underflows).
PHALANX_FMA_CLONES
void gelu_backward(const float* __restrict g, const float* __restrict x, float* __restrict o, std::int64_t n) {
  const float kBeta = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float cdf = 0.5f * (1.0f + erf_float(xi * static_cast<float>(M_SQRT1_2)));
    const float e = xi * xi * -0.5f;
    const bool under = e < -87.0f;
    const float pdf = select_bits(under, 0.0f, kBeta * exp_nonpositive(select_bits(under, -87.0f, e)));
    o[i] = g[i] * std::fma(xi, pdf, cdf);
  }
}

/// out = a op b with b repeating every `period` elements of a (period == n: same shapes), or a
/// repeating when `a_repeats`: the bias and residual adds of a step, without xtensor's
/// broadcasting steppers. Rows of one op in one loop each, so each vectorises.
#define PHALANX_BINARY_ROWS(EXPR)                                \
  for (std::int64_t r = 0; r < n; r += period) {                 \
    const float* ar = a_repeats ? a : a + r;                     \
    const float* br = a_repeats ? b + r : b;                     \
    float* orow = o + r;                                         \
    for (std::int64_t j = 0; j < period; ++j) orow[j] = (EXPR);  \
  }
PHALANX_ELEMENTWISE_CLONES
void binary_rows(BinaryOp op, const float* a, const float* b, float* o, std::int64_t n, std::int64_t period,
                 bool a_repeats) {
  switch (op) {
    case BinaryOp::Add: PHALANX_BINARY_ROWS(ar[j] + br[j]) break;
    case BinaryOp::Sub: PHALANX_BINARY_ROWS(ar[j] - br[j]) break;
    case BinaryOp::Mul: PHALANX_BINARY_ROWS(ar[j] * br[j]) break;
    case BinaryOp::Div: PHALANX_BINARY_ROWS(ar[j] / br[j]) break;
  }
}
#undef PHALANX_BINARY_ROWS

template <typename A, typename B, typename O>
void apply_binary(BinaryOp op, const A& a, const B& b, O&& o) {
  switch (op) {
    case BinaryOp::Add: xt::noalias(o) = a + b; break;
    case BinaryOp::Sub: xt::noalias(o) = a - b; break;
    case BinaryOp::Mul: xt::noalias(o) = a * b; break;
    case BinaryOp::Div: xt::noalias(o) = a / b; break;
  }
}
}  // namespace

void CpuKernels::unary(UnaryOp op, const Tensor& x, Tensor& out) {
  if (x.dtype() == DType::BFloat16) {  // the ops send bf16 here for ReLU only (ops/elementwise.cpp)
    if (op != UnaryOp::Relu || out.dtype() != DType::BFloat16)
      throw TypeError("unary: a bfloat16 input on the CPU kernel is supported for relu only; convert to float32");
    cpu::relu_bf16(static_cast<const std::uint16_t*>(x.raw_data()), static_cast<std::uint16_t*>(out.raw_data()),
                   x.numel());
    return;
  }
  auto X = flat(x);
  auto O = flat(out);
  switch (op) {
    case UnaryOp::Neg: xt::noalias(O) = -X; break;
    case UnaryOp::Exp: xt::noalias(O) = xt::exp(X); break;
    case UnaryOp::Log: xt::noalias(O) = xt::log(X); break;
    case UnaryOp::Relu: relu(x.data<float>(), out.data<float>(), x.numel()); break;
    case UnaryOp::Tanh: xt::noalias(O) = xt::tanh(X); break;
    case UnaryOp::Sigmoid: xt::noalias(O) = 1.0f / (1.0f + xt::exp(-X)); break;
    case UnaryOp::Gelu: gelu(x.data<float>(), out.data<float>(), x.numel()); break;
    case UnaryOp::Rsqrt: xt::noalias(O) = 1.0f / xt::sqrt(X); break;
  }
}

void CpuKernels::unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                                const Tensor& y, Tensor& grad_x) {
  if (grad_y.dtype() == DType::BFloat16) {
    if (op != UnaryOp::Relu || y.dtype() != DType::BFloat16 || grad_x.dtype() != DType::BFloat16)
      throw TypeError("unary_backward: bfloat16 on the CPU kernel is supported for relu only; convert to float32");
    cpu::relu_backward_bf16(static_cast<const std::uint16_t*>(grad_y.raw_data()),
                            static_cast<const std::uint16_t*>(y.raw_data()),
                            static_cast<std::uint16_t*>(grad_x.raw_data()), grad_y.numel());
    return;
  }
  auto G = flat(grad_y);
  auto O = flat(grad_x);
  switch (op) {
    case UnaryOp::Neg: xt::noalias(O) = -G; break;
    case UnaryOp::Exp: xt::noalias(O) = G * flat(y); break;
    case UnaryOp::Log: xt::noalias(O) = G / flat(x); break;
    case UnaryOp::Relu: relu_backward(grad_y.data<float>(), y.data<float>(), grad_x.data<float>(), grad_y.numel()); break;
    case UnaryOp::Tanh: {
      auto Y = flat(y);
      xt::noalias(O) = G * (1.0f - Y * Y);
      break;
    }
    case UnaryOp::Sigmoid: {
      auto Y = flat(y);
      xt::noalias(O) = G * Y * (1.0f - Y);
      break;
    }
    case UnaryOp::Gelu:
      gelu_backward(grad_y.data<float>(), x.data<float>(), grad_x.data<float>(), grad_y.numel());
      break;
    case UnaryOp::Rsqrt: {
      auto Y = flat(y);
      xt::noalias(O) = G * -0.5f * Y * Y * Y;
      break;
    }
  }
}

void CpuKernels::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const auto n = out.numel(), na = a.numel(), nb = b.numel();
  if (n == 0) return;
  if (std::min(na, nb) < 16) {  // short periods (a scalar): xtensor's broadcast loops over the long side
    if (na == n && nb == n) apply_binary(op, flat(a), flat(b), flat(out));
    else if (na == n) apply_binary(op, rows(a, nb), flat(b), rows(out, nb));
    else apply_binary(op, flat(a), rows(b, na), rows(out, na));
  } else if (na == n) {  // b repeats with period nb (nb == n: the same shapes)
    binary_rows(op, a.data<float>(), b.data<float>(), out.data<float>(), n, nb, false);
  } else {  // a repeats with period na
    binary_rows(op, a.data<float>(), b.data<float>(), out.data<float>(), n, na, true);
  }
}

void CpuKernels::affine_scalar(const Tensor& x, float mul, float add, Tensor& out) {
  xt::noalias(flat(out)) = flat(x) * mul + add;
}

}  // namespace phalanx
