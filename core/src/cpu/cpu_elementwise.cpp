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
#include "cpu/gelu_math.hpp"
#include "cpu/simd_level.hpp"

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
// libm's erff/expf are scalar calls. cpu/gelu_math.hpp's are branch-free, so that each
// compiled level vectorises, and give the same bits on each (the baseline one through libm's
// fmaf). Three copies picked by cpu::simd_level("PHALANX_GELU_SIMD") from CPU features (a
// target_clones "arch=haswell" clone was picked by CPU model, __builtin_cpu_is("haswell"), so
// an AMD Zen or a later Intel client never ran it: they ran the baseline one, each fma a libm
// call, 5x slower), capped by the variable so that the tests compare the levels bit for bit.
// The AVX-512F copy is target_clones' former "avx512f" clone, the same code.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PHALANX_GELU_X86 1
#endif
#define PHALANX_GELU_LEVEL(suffix, target)                                                                    \
  target void gelu_##suffix(const float* __restrict x, float* __restrict o, std::int64_t n) {                 \
    for (std::int64_t i = 0; i < n; ++i) o[i] = cpu::gelu_math::gelu_one(x[i]);                              \
  }                                                                                                           \
  target void gelu_backward_##suffix(const float* __restrict g, const float* __restrict x, float* __restrict o, \
                                     std::int64_t n) {                                                        \
    for (std::int64_t i = 0; i < n; ++i) o[i] = cpu::gelu_math::gelu_backward_one(g[i], x[i]);               \
  }
PHALANX_GELU_LEVEL(scalar, )
#ifdef PHALANX_GELU_X86
PHALANX_GELU_LEVEL(avx2, __attribute__((target("avx2,fma"))))
PHALANX_GELU_LEVEL(avx512, __attribute__((target("avx512f"))))
#endif
#undef PHALANX_GELU_LEVEL

#ifdef PHALANX_GELU_X86
/// 2: AVX-512F, 1: AVX2 + FMA, 0: baseline (cpu/simd_level.hpp; FMA required above baseline).
int gelu_level() { return cpu::simd_level("PHALANX_GELU_SIMD", false, true); }
#endif

void gelu(const float* x, float* o, std::int64_t n) {
#ifdef PHALANX_GELU_X86
  const int level = gelu_level();
  if (level == 2) return gelu_avx512(x, o, n);
  if (level == 1) return gelu_avx2(x, o, n);
#endif
  gelu_scalar(x, o, n);
}

void gelu_backward(const float* g, const float* x, float* o, std::int64_t n) {
#ifdef PHALANX_GELU_X86
  const int level = gelu_level();
  if (level == 2) return gelu_backward_avx512(g, x, o, n);
  if (level == 1) return gelu_backward_avx2(g, x, o, n);
#endif
  gelu_backward_scalar(g, x, o, n);
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
  if (x.dtype() == DType::BFloat16) {  // the ops send bf16 here for ReLU and GELU only (ops/elementwise.cpp)
    if ((op != UnaryOp::Relu && op != UnaryOp::Gelu) || out.dtype() != DType::BFloat16)
      throw TypeError("unary: a bfloat16 input on the CPU kernel is supported for relu and gelu only; convert to float32");
    const auto* xs = static_cast<const std::uint16_t*>(x.raw_data());
    auto* os = static_cast<std::uint16_t*>(out.raw_data());
    if (op == UnaryOp::Relu) cpu::relu_bf16(xs, os, x.numel());
    else cpu::gelu_bf16(xs, os, x.numel());
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
    if (op == UnaryOp::Gelu && x.dtype() == DType::BFloat16 && grad_x.dtype() == DType::BFloat16) {
      cpu::gelu_backward_bf16(static_cast<const std::uint16_t*>(grad_y.raw_data()),
                              static_cast<const std::uint16_t*>(x.raw_data()),
                              static_cast<std::uint16_t*>(grad_x.raw_data()), grad_y.numel());
      return;
    }
    if (op != UnaryOp::Relu || y.dtype() != DType::BFloat16 || grad_x.dtype() != DType::BFloat16)
      throw TypeError("unary_backward: bfloat16 on the CPU kernel is supported for relu and gelu only; convert to float32");
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
  if (b.dtype() == DType::BFloat16) {  // float32 + bf16, same shapes (ops/elementwise.cpp's residual add)
    if (op != BinaryOp::Add || a.dtype() != DType::Float32 || out.dtype() != DType::Float32 || na != n || nb != n)
      throw TypeError("binary: a bfloat16 b on the CPU kernel is supported for a same-shape float32 + bfloat16 add only");
    cpu::add_f32_bf16(a.data<float>(), static_cast<const std::uint16_t*>(b.raw_data()), out.data<float>(), n);
    return;
  }
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
