#pragma once
// Differentiable operations. Each records a node on the autograd tape when grad mode is on
// and an input requires grad. Shape errors name the op and both shapes.
#include <cstdint>

#include "phalanx/core/tensor.hpp"

namespace phalanx {

enum class Reduction : std::uint8_t { None, Mean, Sum };

// arithmetic: same shapes, or one side broadcast as a suffix of the other
// (a bias row [D] against [N, D], a scalar [] or [1] against anything)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);

/// 2-D matrix product [M, K] x [K, N] -> [M, N] (CBLAS sgemm on CPU).
Tensor matmul(const Tensor& a, const Tensor& b);
/// y = x W^T + b: x [N, in], weight [out, in], bias [out] (may be undefined). One GEMM.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- convolution and pooling (issue 16, H11): NCHW float32, PyTorch 1.13's semantics ----
/// A (height, width) pair; one number means both.
struct Size2 {
  Size2(std::int64_t v) : h(v), w(v) {}  // NOLINT: implicit, as PyTorch's int-or-tuple
  Size2(std::int64_t h_, std::int64_t w_) : h(h_), w(w_) {}
  std::int64_t h, w;
};
/// torch.nn.functional.conv2d: x [N, C, H, W], weight [OC, C / groups, KH, KW], bias [OC]
/// (may be undefined). im2col + GEMM per image on CPU.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, std::int64_t groups = 1);
/// torch.nn.functional.max_pool2d (ceil_mode false); stride 0 means stride = kernel.
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride = 0, Size2 padding = 0, Size2 dilation = 1);
/// torch.nn.functional.avg_pool2d (ceil_mode false); stride 0 means stride = kernel.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride = 0, Size2 padding = 0,
                  bool count_include_pad = true);
/// torch.nn.functional.adaptive_avg_pool2d.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);
// ---- end convolution and pooling ----

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim = false);

Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1);

Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);
/// Like torch.nn.functional.cross_entropy: logits [N, C], integer targets [N] in [0, C).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
class Generator;
/// Zeroes each element with probability p and scales the rest by 1/(1-p) (training only).
Tensor dropout(const Tensor& x, float p, bool training, Generator* gen = nullptr);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, float s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, float s) { return add(a, -s); }
inline Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
inline Tensor operator*(float s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, float s) { return mul(a, 1.0f / s); }

}  // namespace phalanx
