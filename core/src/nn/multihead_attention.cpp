#include "phalanx/core/nn/multihead_attention.hpp"

#include <cmath>
#include <limits>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& o, Generator* init, Generator* dropout_gen)
    : options(o), dropout_gen_(dropout_gen) {
  const std::int64_t E = o.embed_dim(), H = o.num_heads();
  if (E <= 0 || H <= 0)
    throw ValueError(detail::concat("MultiheadAttention: embed_dim and num_heads must be positive, got ", E, " and ", H));
  if (E % H != 0)
    throw ValueError(detail::concat("MultiheadAttention: num_heads ", H, " does not divide embed_dim ", E,
                                    ": choose a head count that divides it"));
  if (!(o.dropout() >= 0 && o.dropout() < 1))
    throw ValueError(detail::concat("MultiheadAttention: dropout must be in [0, 1), got ", o.dropout()));
  in_proj_weight = register_parameter("in_proj_weight", Tensor::empty({3 * E, E}));
  if (o.bias()) in_proj_bias = register_parameter("in_proj_bias", Tensor::empty({3 * E}));
  // PyTorch creates out_proj (drawing its Linear init) before it resets in_proj: same order here.
  out_proj = register_module("out_proj", std::make_shared<Linear>(E, E, o.bias(), init));
  reset_parameters(init, /*redraw_out_proj=*/false);
}

void MultiheadAttention::reset_parameters(Generator* init) { reset_parameters(init, true); }

void MultiheadAttention::reset_parameters(Generator* init, bool redraw_out_proj) {
  if (redraw_out_proj) out_proj->reset_parameters(init);
  const std::int64_t E = options.embed_dim();
  GeneratorGuard guard(init);
  NoGradGuard ng;
  // xavier_uniform_ on [3E, E]: fan_in E, fan_out 3E.
  const float bound = static_cast<float>(std::sqrt(6.0 / static_cast<double>(E + 3 * E)));
  in_proj_weight.copy_(rand(in_proj_weight.shape(), -bound, bound, &guard.get()));
  if (in_proj_bias.defined()) in_proj_bias.zero_();
  if (out_proj->bias.defined()) out_proj->bias.zero_();
}

Tensor MultiheadAttention::forward(const Tensor& x) { return std::get<0>(forward(x, x, x)); }

std::string MultiheadAttention::describe() const {
  return detail::concat("MultiheadAttention(embed_dim=", options.embed_dim(), ", num_heads=", options.num_heads(),
                        ", dropout=", options.dropout(), ", bias=", options.bias() ? "True" : "False",
                        ", batch_first=", options.batch_first() ? "True" : "False", ")");
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const Tensor& key_padding_mask, const Tensor& attn_mask,
                                                       bool need_weights, bool average_attn_weights) {
  const std::int64_t E = options.embed_dim(), H = options.num_heads(), Dh = E / H;
  const bool first = options.batch_first();
  const char* layout = first ? "[N, L, E]" : "[L, N, E]";
  if (!query.defined() || !key.defined() || !value.defined())
    throw ValueError("MultiheadAttention: query, key and value must be defined");
  const std::int64_t d = query.dim();
  if ((d != 2 && d != 3) || key.dim() != d || value.dim() != d)
    throw ShapeError(detail::concat("MultiheadAttention: query, key and value must all be ", layout,
                                    " or all unbatched [L, E], got ", shape_str(query.shape()), ", ",
                                    shape_str(key.shape()), ", ", shape_str(value.shape())));
  const bool batched = d == 3;
  // To [N, len, E].
  auto batch_major = [&](const Tensor& t) {
    if (!batched) return reshape(t, {1, t.size(0), t.size(1)});
    return first ? t : permute(t, {1, 0, 2});
  };
  const bool self_attention = query.is_same(key) && key.is_same(value);
  const Tensor q_in = batch_major(query);
  const Tensor k_in = self_attention ? q_in : batch_major(key);
  const Tensor v_in = self_attention ? q_in : (value.is_same(key) ? k_in : batch_major(value));
  const std::int64_t N = q_in.size(0), L = q_in.size(1), S = k_in.size(1);
  if (q_in.size(2) != E || k_in.size(2) != E || v_in.size(2) != E || k_in.size(0) != N || v_in.size(0) != N ||
      v_in.size(1) != S)
    throw ShapeError(detail::concat("MultiheadAttention(embed_dim=", E, "): query ", shape_str(query.shape()),
                                    ", key ", shape_str(key.shape()), " and value ", shape_str(value.shape()),
                                    " must be ", layout, ", [N, S, E] and [N, S, E] with E = ", E,
                                    first ? "" : " (sequence first)"));

  // Projections: one GEMM for self-attention, three otherwise (the rows of in_proj_weight),
  // then the heads [N, len, E] -> [N, H, len, Dh].
  Tensor qh, kh, vh;
  if (self_attention) {
    // [N, L, 3, H, Dh] -> [3, N, H, L, Dh] and its pieces along dim 0: views (the CPU
    // attention reads them in place).
    const Tensor qkv = permute(reshape(linear(q_in, in_proj_weight, in_proj_bias), {N, L, 3, H, Dh}), {2, 0, 3, 1, 4});
    const auto parts = split(qkv, 1, 0);
    qh = reshape(parts[0], {N, H, L, Dh});
    kh = reshape(parts[1], {N, H, L, Dh});
    vh = reshape(parts[2], {N, H, L, Dh});
  } else {
    const auto w = chunk(in_proj_weight, 3, 0);
    std::vector<Tensor> b(3);
    if (in_proj_bias.defined()) b = chunk(in_proj_bias, 3, 0);
    auto heads = [&](const Tensor& t, std::int64_t len) { return permute(reshape(t, {N, len, H, Dh}), {0, 2, 1, 3}); };
    qh = heads(linear(q_in, w[0], b[0]), L);
    kh = heads(linear(k_in, w[1], b[1]), S);
    vh = heads(linear(v_in, w[2], b[2]), S);
  }

  // The masks as one additive Float32 mask (-inf where not allowed), as PyTorch 1.13 merges them.
  Tensor mask;
  const Device dev = query.device();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (key_padding_mask.defined()) {
    if (key_padding_mask.dtype() != DType::Bool)
      throw TypeError(std::string("MultiheadAttention: key_padding_mask must be Bool (true = padding, ignored), got ") +
                      dtype_name(key_padding_mask.dtype()));
    const Shape want = batched ? Shape{N, S} : Shape{S};
    if (key_padding_mask.shape() != want)
      throw ShapeError(detail::concat("MultiheadAttention: key_padding_mask must be ", batched ? "[N, S] = " : "[S] = ",
                                      shape_str(want), ", got ", shape_str(key_padding_mask.shape())));
  }
  Tensor am;
  if (attn_mask.defined()) {
    if (attn_mask.dtype() != DType::Bool && attn_mask.dtype() != DType::Float32)
      throw TypeError(std::string("MultiheadAttention: attn_mask must be Bool (true = not allowed) or Float32 (added), "
                                  "got ") + dtype_name(attn_mask.dtype()));
    if (attn_mask.shape() == Shape{L, S}) {
      am = attn_mask;
    } else if (attn_mask.shape() == Shape{N * H, L, S}) {
      am = reshape(attn_mask, {N, H, L, S});
    } else {
      throw ShapeError(detail::concat("MultiheadAttention: attn_mask must be [L, S] = ", shape_str(Shape{L, S}),
                                      " or [N * num_heads, L, S] = ", shape_str(Shape{N * H, L, S}), ", got ",
                                      shape_str(attn_mask.shape())));
    }
  }
  if (!need_weights && (key_padding_mask.defined() || am.defined())) {
    // The fused kernel broadcasts any dims itself, so the mask stays as small as its sources:
    // padding alone is [N, 1, 1, S]. (The explicit path below applies the masks to the scores
    // directly, without building an [N, H, L, S] mask.)
    const bool per_head = am.defined() && am.dim() == 4;
    Shape shape{L, S};
    if (per_head)
      shape = {N, H, L, S};
    else if (key_padding_mask.defined())
      shape = {N, 1, am.defined() ? L : 1, S};
    if (am.defined() && am.dtype() == DType::Float32 && am.shape() == shape) {
      mask = am;
    } else {
      mask = zeros(shape, DType::Float32, dev);
      if (am.defined()) mask = am.dtype() == DType::Bool ? masked_fill(mask, am, kNegInf) : add(mask, am);
    }
    if (key_padding_mask.defined()) mask = masked_fill(mask, reshape(key_padding_mask, {N, 1, 1, S}), kNegInf);
  }

  const float p = is_training() ? static_cast<float>(options.dropout()) : 0.f;
  Tensor y, weights;
  if (!need_weights) {
    y = scaled_dot_product_attention(qh, kh, vh, mask, p, false, std::nullopt, dropout_gen_);
  } else {
    // PyTorch 1.13's _scaled_dot_product_attention: q / sqrt(Dh), + mask, softmax, dropout.
    Tensor scores = matmul(mul(qh, 1.f / std::sqrt(static_cast<float>(Dh))), transpose(kh, 2, 3));
    // The same values as adding PyTorch's merged additive mask (+0 where allowed, -inf where
    // not), with no [N, H, L, S] zeros to build: masked_fill broadcasts its mask.
    if (am.defined()) scores = am.dtype() == DType::Bool ? masked_fill(scores, am, kNegInf) : add(scores, am);
    if (key_padding_mask.defined())
      scores = masked_fill(scores, reshape(key_padding_mask, {N, 1, 1, S}), kNegInf);
    weights = softmax(scores, -1);
    if (p > 0) weights = dropout(weights, p, true, dropout_gen_);
    y = matmul(weights, vh);
    if (average_attn_weights) weights = mean(weights, 1);
    if (!batched) weights = reshape(weights, Shape(weights.shape().begin() + 1, weights.shape().end()));
  }
  Tensor out = out_proj->forward(reshape(permute(y, {0, 2, 1, 3}), {N, L, E}));
  if (!batched)
    out = reshape(out, {L, E});
  else if (!first)
    out = permute(out, {1, 0, 2});
  return {out, weights};
}

void MultiheadAttention::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "in_proj_weight")
    in_proj_weight = t;
  else if (name == "in_proj_bias")
    in_proj_bias = t;
}

}  // namespace phalanx::nn
