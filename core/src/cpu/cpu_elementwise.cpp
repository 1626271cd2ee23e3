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
    case UnaryOp::Relu: {
      // NaN stays NaN, as in PyTorch (xt::maximum(x, 0) turned it into 0 and hid it): one
      // compare and a blend, which vectorises.
      const float* __restrict xx = x.data<float>();
      float* __restrict o = out.data<float>();
      const std::int64_t n = x.numel();
      for (std::int64_t i = 0; i < n; ++i) {
        const float xi = xx[i];
        o[i] = xi <= 0.f ? 0.f : xi;
      }
      break;
    }
    case UnaryOp::Tanh: xt::noalias(O) = xt::tanh(X); break;
    case UnaryOp::Sigmoid: xt::noalias(O) = 1.0f / (1.0f + xt::exp(-X)); break;
    case UnaryOp::Gelu: {  // issue 16 (H12): PyTorch's exact (erf) GELU
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
    case UnaryOp::Relu: {
      // Plain loop: y > 0 exactly where x > 0; branch-free with restrict so it vectorises.
      // As PyTorch's threshold_backward: zero where y <= 0, so a NaN y passes the gradient on.
      const float* __restrict g = grad_y.data<float>();
      const float* __restrict yy = y.data<float>();
      float* __restrict o = grad_x.data<float>();
      const std::int64_t n = grad_y.numel();
      for (std::int64_t i = 0; i < n; ++i) {
        const float gi = g[i];  // unconditional load: lets the compiler use a blend
        o[i] = yy[i] <= 0.f ? 0.f : gi;
      }
      break;
    }
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
