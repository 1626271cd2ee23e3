#pragma once
// torch.nn.MultiheadAttention (PyTorch 1.13) with its parameter names and layout:
//   in_proj_weight [3E, E] (the q, k, v projections stacked), in_proj_bias [3E],
//   out_proj.weight [E, E], out_proj.bias [E]
// so its state_dict moves between PyTorch and Phalanx as .npz with the same keys.
#include <cstdint>
#include <memory>
#include <tuple>

#include "phalanx/core/arg.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/linear.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(std::int64_t embed_dim, std::int64_t num_heads)
      : embed_dim_(embed_dim), num_heads_(num_heads) {}
  PHALANX_ARG(std::int64_t, embed_dim);
  PHALANX_ARG(std::int64_t, num_heads);
  /// Dropout on the attention weights, in training mode only.
  PHALANX_ARG(double, dropout) = 0.0;
  /// in_proj_bias and out_proj.bias.
  PHALANX_ARG(bool, bias) = true;
  /// Inputs [N, L, E] when true; [L, N, E] (PyTorch's default) when false.
  PHALANX_ARG(bool, batch_first) = false;
};

/// torch.nn.MultiheadAttention: heads of width E / num_heads over q = query W_q^T + b_q,
/// k = key W_k^T + b_k, v = value W_v^T + b_v (W_q, W_k, W_v the rows of in_proj_weight),
/// softmax(q k^T / sqrt(E / num_heads) + mask) v, concatenated heads through out_proj.
/// Initialised as PyTorch: in_proj_weight xavier_uniform, both biases zero, out_proj.weight as
/// a Linear's (uniform +-1/sqrt(E)), drawn from `init` (the default generator when null).
/// Attention dropout draws from `dropout_gen` (the default generator when null).
/// No add_bias_kv, add_zero_attn, or kdim/vdim other than embed_dim.
class MultiheadAttention : public Module {
 public:
  explicit MultiheadAttention(const MultiheadAttentionOptions& options, Generator* init = nullptr,
                              Generator* dropout_gen = nullptr);
  MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, Generator* init = nullptr)
      : MultiheadAttention(MultiheadAttentionOptions(embed_dim, num_heads), init) {}

  /// query [N, L, E], key and value [N, S, E] (batch_first; [L, N, E] / [S, N, E] otherwise;
  /// [L, E] / [S, E] unbatched). key_padding_mask: Bool [N, S], true = that key is padding
  /// and ignored. attn_mask: [L, S] or [N * num_heads, L, S], Bool (true = not allowed to
  /// attend) or Float32 (added to the scores), as PyTorch's. Returns (output [N, L, E],
  /// weights): the weights [N, L, S] averaged over heads ([N, num_heads, L, S] when
  /// average_attn_weights is false) when need_weights, else undefined. Without need_weights
  /// the heads go through the fused scaled_dot_product_attention; with it, through an
  /// explicit softmax (the weights have to exist). When query, key and value are one tensor
  /// (self-attention) the projection is one GEMM, as PyTorch's.
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor(),
                                     bool need_weights = false, bool average_attn_weights = true);
  /// Self-attention without masks: forward(x, x, x)'s output (so it can sit in a Sequential).
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  /// Re-draws the parameters as at construction.
  void reset_parameters(Generator* init = nullptr);

  MultiheadAttentionOptions options;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;

 private:
  void reset_parameters(Generator* init, bool redraw_out_proj);
  Generator* dropout_gen_;
};

}  // namespace phalanx::nn
