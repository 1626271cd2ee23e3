// Elementwise CPU kernels: xtensor expressions over adapted buffers (no copies).
#include <array>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <cmath>

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
  auto X = flat(x);
  auto O = flat(out);
  switch (op) {
    case UnaryOp::Neg: xt::noalias(O) = -X; break;
    case UnaryOp::Exp: xt::noalias(O) = xt::exp(X); break;
    case UnaryOp::Log: xt::noalias(O) = xt::log(X); break;
    case UnaryOp::Relu: relu(x.data<float>(), out.data<float>(), x.numel()); break;
    case UnaryOp::Tanh: xt::noalias(O) = xt::tanh(X); break;
    case UnaryOp::Sigmoid: xt::noalias(O) = 1.0f / (1.0f + xt::exp(-X)); break;
    case UnaryOp::Gelu: {  // PyTorch's exact (erf) GELU
      const float* xx = x.data<float>();
      float* o = out.data<float>();
      for (std::int64_t i = 0, n = x.numel(); i < n; ++i)
        o[i] = xx[i] * 0.5f * (1.0f + std::erf(xx[i] * static_cast<float>(M_SQRT1_2)));
      break;
    }
    case UnaryOp::Rsqrt: xt::noalias(O) = 1.0f / xt::sqrt(X); break;
  }
}

void CpuKernels::unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                                const Tensor& y, Tensor& grad_x) {
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
    case UnaryOp::Gelu: {  // d/dx = Phi(x) + x * phi(x), as PyTorch's GeluBackward
      const float* g = grad_y.data<float>();
      const float* xx = x.data<float>();
      float* o = grad_x.data<float>();
      const float kBeta = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);
      for (std::int64_t i = 0, n = grad_y.numel(); i < n; ++i) {
        const float cdf = 0.5f * (1.0f + std::erf(xx[i] * static_cast<float>(M_SQRT1_2)));
        const float pdf = kBeta * std::exp(xx[i] * xx[i] * -0.5f);
        o[i] = g[i] * (cdf + xx[i] * pdf);
      }
      break;
    }
    case UnaryOp::Rsqrt: {
      auto Y = flat(y);
      xt::noalias(O) = G * -0.5f * Y * Y * Y;
      break;
    }
  }
}

void CpuKernels::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const auto n = out.numel(), na = a.numel(), nb = b.numel();
  if (na == n && nb == n) {
    apply_binary(op, flat(a), flat(b), flat(out));
  } else if (na == n) {  // b repeats with period nb
    apply_binary(op, rows(a, nb), flat(b), rows(out, nb));
  } else {  // a repeats with period na
    apply_binary(op, flat(a), rows(b, na), rows(out, na));
  }
}

void CpuKernels::affine_scalar(const Tensor& x, float mul, float add, Tensor& out) {
  xt::noalias(flat(out)) = flat(x) * mul + add;
}

}  // namespace phalanx
