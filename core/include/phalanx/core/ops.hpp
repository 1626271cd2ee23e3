#pragma once
// Differentiable operations. Each records a node on the autograd tape when grad mode is on
// and an input requires grad. Shape errors name the op and both shapes.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx {

class Generator;

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
/// torch.matmul: 1-D x 1-D is a dot product, 2-D x 2-D a matrix product, a 1-D operand
/// is a row (left) or column (right) vector whose added dim is removed afterwards, and
/// operands of 3 or more dims are batches of matrices whose leading dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
/// y = x W^T + b: x [N, in], weight [out, in], bias [out] (may be undefined). One GEMM.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- convolution and pooling: NCHW float32, PyTorch 1.13's semantics ----
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

// ---- views (docs/transformer_ops.md, "Views"): results alias x's storage with their own strides ----
/// torch.reshape: a view when x's strides allow one, else a contiguous copy.
Tensor reshape(const Tensor& x, const Shape& shape);
/// torch.view: always a view; a ShapeError when x's strides do not allow one.
Tensor view(const Tensor& x, const Shape& shape);
/// torch.unsqueeze / torch.squeeze (one dim, or every size-1 dim): views.
Tensor unsqueeze(const Tensor& x, std::int64_t dim);
Tensor squeeze(const Tensor& x, std::int64_t dim);
Tensor squeeze(const Tensor& x);
/// A view with dims d0 and d1 swapped.
Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1);
/// torch.narrow: elements [start, start + length) of dimension `dim` (negative counts from the
/// end). Always a view sharing x's storage; writing into it (copy_, fill_) writes into x.
/// Splits packed inputs: `narrow(x, 1, 0, 16)` is PyTorch's `x[:, :16]`.
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);

// ---- transformer building blocks (docs/transformers.md) ----
// permute (like transpose) returns a view; contiguous() returns x itself when it is
// contiguous, else a contiguous copy whose gradient is the identity (PyTorch's meaning).
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims);
Tensor contiguous(const Tensor& x);
/// torch.cat / torch.stack (every tensor the same shape but `dim`, for cat; all equal, for stack).
Tensor cat(const std::vector<Tensor>& xs, std::int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, std::int64_t dim = 0);
/// torch.split (pieces of split_size, the last one smaller) and its list-of-sizes form; torch.chunk.
std::vector<Tensor> split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim = 0);
/// x with `value` where mask (Bool, broadcastable to x) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);
/// The lower / upper triangle of the last two dims (the rest zero), diagonal as in PyTorch.
Tensor tril(const Tensor& x, std::int64_t diagonal = 0);
Tensor triu(const Tensor& x, std::int64_t diagonal = 0);
/// PyTorch 2's torch.nn.functional.scaled_dot_product_attention: q [..., L, E], k [..., S, E],
/// v [..., S, Ev] -> [..., L, Ev]; attn_mask (Bool: true takes part; Float32: added to the
/// scores) broadcastable to [..., L, S]; is_causal masks j > i; scale defaults to 1/sqrt(E);
/// dropout_p drops attention weights (training only, drawn from `gen`). On the CPU it is one
/// fused, tiled kernel with an online softmax whose memory grows linearly with L and S.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), float dropout_p = 0.f,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);
// ---- end transformer building blocks ----

Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);
/// Like torch.nn.functional.cross_entropy: logits [N, C], integer targets [N] in [0, C).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
class Generator;
/// Zeroes each element with probability p and scales the rest by 1/(1-p) (training only).
Tensor dropout(const Tensor& x, float p, bool training, Generator* gen = nullptr);

// ---- normalisation, embedding, argmax, gelu, softmax: PyTorch 1.13's semantics ----
/// torch.nn.functional.gelu(approximate='none'): x * (1 + erf(x / sqrt 2)) / 2.
Tensor gelu(const Tensor& x);
/// torch.softmax over `dim` (exp of log_softmax; differentiable).
Tensor softmax(const Tensor& x, std::int64_t dim = -1);
/// Indices (int64) of the first maximum along `dim` (NaN counts as the maximum); no gradient.
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim = false);
/// Index of the first maximum of the flattened tensor: an int64 scalar [].
Tensor argmax(const Tensor& x);
/// min(max(x, lo), hi) elementwise (no gradient; used by clip_grad_value_).
Tensor clamp(const Tensor& x, float lo, float hi);

/// Per-channel batch statistics of x [N, C, *] (no autograd): mean and biased variance.
struct BatchNormStats {
  Tensor mean, var;  ///< [C] each
};
BatchNormStats batch_norm_stats(const Tensor& x);
/// 1 / sqrt(var + eps), elementwise (no autograd).
Tensor batch_norm_invstd(const Tensor& var, double eps);
/// Called in the backward pass of batch_norm_elemt (batch statistics) with the per-channel sums
/// sum_dy and sum_dy_xmu of this process, before grad_input is formed from them: SyncBatchNorm
/// all-reduces both here (in place). The weight/bias gradients use the local sums, as PyTorch.
using BatchNormGradReduce = std::function<void(Tensor& sum_dy, Tensor& sum_dy_xmu)>;
/// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c] for x [N, C, *]; weight/bias [C] or
/// undefined. Differentiable in x, weight, bias. With batch_stats, mean/invstd are statistics of
/// the batch over `count` elements per channel (count = N * prod(*) here, or the total over a
/// process group) and the backward differentiates through them (torch.batch_norm_elemt +
/// batch_norm_backward_reduce/elemt); otherwise they are constants (eval mode).
Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias, bool batch_stats, double count = 0,
                        BatchNormGradReduce reduce = nullptr);
/// Raw backward pieces (no autograd), for custom nodes: sums per channel, then grad_input.
void batch_norm_backward_reduce(const Tensor& grad_y, const Tensor& x, const Tensor& mean, Tensor& sum_dy,
                                Tensor& sum_dy_xmu);
Tensor batch_norm_backward_elemt(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                 const Tensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu,
                                 double count);
/// torch.nn.functional.batch_norm: x [N, C] or [N, C, *]. training: batch statistics, and the
/// running buffers (if defined) get running = (1 - momentum) * running + momentum * batch stat
/// (unbiased variance); eval: the running statistics normalise. Errors (one line) on a channel
/// with one value per batch in training.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
/// torch.nn.functional.layer_norm over the trailing dims `normalized_shape`.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// torch.nn.functional.embedding: rows of weight [V, D] at int64 indices (any shape) ->
/// indices.shape + [D]; rows at padding_idx (-1: none) get no gradient. Dense gradient.
Tensor embedding(const Tensor& indices, const Tensor& weight, std::int64_t padding_idx = -1);
// ---- end normalisation, embedding, argmax, gelu, softmax ----

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
