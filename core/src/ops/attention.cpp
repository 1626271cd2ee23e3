// scaled_dot_product_attention (docs/attention.md): checks, the mask's broadcast strides,
// the dropout seed, and one autograd node whose backward recomputes the weights from the
// saved per-row maximum and sum (the kernels are the device table's attention_* entries).
#include <cmath>
#include <string>

#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/generator.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

class AttentionBackward final : public Node {
 public:
  // q, k, v as the kernels take them (flat tensors under strided views when p.qkv_strided);
  // qs, ks, vs the shapes of their gradients.
  AttentionBackward(Tensor q, Tensor k, Tensor v, Tensor mask, Tensor out, Tensor stats, const AttentionParams& p,
                    Shape qs, Shape ks, Shape vs)
      : q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), mask_(std::move(mask)), out_(std::move(out)),
        stats_(std::move(stats)), p_(p), qs_(std::move(qs)), ks_(std::move(ks)), vs_(std::move(vs)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gq, gk, gv;
    if (needs_grad(*this, 0)) gq = autograd::gradient_buffer(*this, 0, qs_, g.device());
    if (needs_grad(*this, 1)) gk = autograd::gradient_buffer(*this, 1, ks_, g.device());
    if (needs_grad(*this, 2)) gv = autograd::gradient_buffer(*this, 2, vs_, g.device());
    kernels_for(g.device()).attention_backward(q_, k_, v_, mask_, out_, stats_, g, p_, gq, gk, gv);
    return {gq, gk, gv};
  }
  const char* name() const override { return "ScaledDotProductAttentionBackward"; }
  void release_saved() override {
    q_ = Tensor();
    k_ = Tensor();
    v_ = Tensor();
    mask_ = Tensor();
    out_ = Tensor();
    stats_ = Tensor();
  }

 private:
  Tensor q_, k_, v_, mask_, out_, stats_;
  AttentionParams p_;
  Shape qs_, ks_, vs_;
};

/// Whether the CPU kernels can read q, k and v in place: on the CPU, float32, not all
/// contiguous (then the plain path is as good), each row dense (last stride 1).
bool strided_operands(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Tensor* t[] = {&q, &k, &v};
  bool any_view = false;
  for (const Tensor* x : t) {
    if (!x->defined() || !x->device().is_cpu() || x->dtype() != DType::Float32 || x->dim() < 2 ||
        x->dim() - 2 > AttentionParams::kMaxLead)
      return false;
    if (x->shape().back() > 1 && x->strides().back() != 1) return false;
    for (std::int64_t s : x->strides())
      if (s < 0) return false;
    any_view = any_view || !x->is_contiguous();
  }
  return any_view;
}

/// The tensor the kernels take for q, k or v, and its strides in `p` when p.qkv_strided: the
/// flat span of the view.
Tensor operand(const Tensor& x, const AttentionParams& p, std::int64_t* lead_strides, std::int64_t& row_stride) {
  if (!p.qkv_strided) return x;
  const auto& st = x.strides();
  for (int d = 0; d < p.lead; ++d) lead_strides[d] = st[d];
  row_stride = st[st.size() - 2];
  if (x.is_contiguous()) return x;
  std::int64_t extent = 1;
  for (std::size_t i = 0; i < st.size(); ++i) extent += (x.shape()[i] - 1) * st[i];
  const TensorImpl& i = *x.impl();
  return Tensor(std::make_shared<TensorImpl>(i.storage(), i.byte_offset(), Shape{extent}, i.dtype()));
}

std::string shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape());
}

/// The mask's kind and its broadcast strides against [lead..., L, S] (right-aligned, each
/// dim 1 or equal), or a ShapeError naming both shapes.
void mask_geometry(const Tensor& mask, const Tensor& q, const Shape& scores, AttentionParams& p) {
  if (mask.dtype() == DType::Float32) {
    p.mask_kind = AttentionMask::Float;
  } else if (mask.dtype() == DType::Bool) {
    p.mask_kind = AttentionMask::Bool;  // one byte per element, read as "takes part" when nonzero
  } else {
    throw TypeError(detail::concat(kOp, ": attn_mask must be bool (true: takes part) or float32 (added to the "
                                   "scores), got ", dtype_name(mask.dtype()), " ", shape_str(mask.shape())));
  }
  check_same_device(mask, q, kOp);
  const Shape& ms = mask.shape();
  const std::size_t nd = scores.size();
  bool ok = ms.size() <= nd;
  for (std::size_t i = 0; ok && i < ms.size(); ++i) {
    const std::int64_t m = ms[ms.size() - 1 - i], s = scores[nd - 1 - i];
    ok = m == 1 || m == s;
  }
  if (!ok)
    throw ShapeError(detail::concat(kOp, ": attn_mask ", shape_str(ms), " does not broadcast to the scores ",
                                    shape_str(scores), " ([..., L, S] of q ", shape_str(q.shape()), ")"));
  // Element strides of the mask (0 where broadcast), aligned to the scores' dims.
  std::vector<std::int64_t> stride(nd, 0);
  std::int64_t run = 1;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const std::size_t md = ms.size() - 1 - i, sd = nd - 1 - i;
    stride[sd] = ms[md] == 1 ? 0 : run;
    run *= ms[md];
  }
  p.mask_row_stride = stride[nd - 2];
  p.mask_col_stride = stride[nd - 1];
  for (int d = 0; d < p.lead; ++d) p.mask_lead_strides[d] = stride[d];
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& attn_mask_in,
                                    float dropout_p, bool is_causal, std::optional<double> scale, Generator* gen) {
  // The CPU kernels read q/k/v views whose rows are dense (nanoGPT's split/view/transpose of
  // c_attn's output) in place; everything else takes the one contiguity path of every op.
  const bool strided = strided_operands(q_in, k_in, v_in);
  const Tensor q = strided ? q_in : contiguous_input(q_in), k = strided ? k_in : contiguous_input(k_in),
               v = strided ? v_in : contiguous_input(v_in), attn_mask = contiguous_input(attn_mask_in);
  auto again = [=](const Tensor& q2, const Tensor& k2, const Tensor& v2, const Tensor& m2) {
    return scaled_dot_product_attention(q2, k2, v2, m2, dropout_p, is_causal, scale, gen);
  };
  if (autocast_detail::applies(autocast_detail::Op::Attention, q))
    return autocast_detail::call(autocast_detail::Op::Attention, again, q, k, v, attn_mask);
  if (any_reduced(q, k, v, attn_mask)) return in_float32(promote_types({&q, &k, &v}), again, q, k, v, attn_mask);
  check_float(q, kOp, "query");
  check_float(k, kOp, "key");
  check_float(v, kOp, "value");
  check_same_device(q, k, kOp);
  check_same_device(q, v, kOp);
  const std::int64_t nd = q.dim();
  if (nd < 2 || k.dim() != nd || v.dim() != nd)
    throw ShapeError(detail::concat(kOp, ": expected q [..., L, E], k [..., S, E], v [..., S, Ev] with the same "
                                    "number of dims (at least 2), got ", shapes(q, k, v)));
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  for (std::int64_t d = 0; d < nd - 2; ++d)
    if (ks[d] != qs[d] || vs[d] != qs[d])
      throw ShapeError(detail::concat(kOp, ": q, k and v must have the same leading dims, got ", shapes(q, k, v)));
  if (ks[nd - 1] != qs[nd - 1])
    throw ShapeError(detail::concat(kOp, ": q and k must have the same last dim E, got ", shapes(q, k, v)));
  if (qs[nd - 1] == 0)  // the default scale would be 1/sqrt(0)
    throw ShapeError(detail::concat(kOp, ": q and k need a last dim E of at least 1, got ", shapes(q, k, v)));
  if (vs[nd - 2] != ks[nd - 2])
    throw ShapeError(detail::concat(kOp, ": k and v must have the same number of keys S, got ", shapes(q, k, v)));
  if (nd - 2 > AttentionParams::kMaxLead)
    throw ShapeError(detail::concat(kOp, ": at most ", AttentionParams::kMaxLead, " leading dims, got ",
                                    shapes(q, k, v)));
  if (!(dropout_p >= 0.f && dropout_p <= 1.f))
    throw ValueError(detail::concat(kOp, ": dropout_p must be in [0, 1], got ", dropout_p));
  if (scale && !std::isfinite(*scale))
    throw ValueError(detail::concat(kOp, ": scale must be finite, got ", *scale));

  AttentionParams p{};
  p.l = qs[nd - 2];
  p.s = ks[nd - 2];
  p.e = qs[nd - 1];
  p.ev = vs[nd - 1];
  p.lead = static_cast<int>(nd - 2);
  p.batch = 1;
  for (int d = 0; d < p.lead; ++d) {
    p.lead_sizes[d] = qs[d];
    p.batch *= qs[d];
  }
  // PyTorch: 1 / sqrt(E) computed in double, then float.
  p.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(p.e)));
  p.causal = is_causal;
  p.mask_kind = AttentionMask::None;
  Shape scores(qs.begin(), qs.end() - 2);
  scores.push_back(p.l);
  scores.push_back(p.s);
  if (attn_mask.defined()) {
    mask_geometry(attn_mask, q, scores, p);
    // The kernels compute no gradient for the mask (a learned bias would get none, silently).
    if (grad_mode_enabled() && attn_mask.requires_grad())
      throw ValueError(detail::concat(kOp, ": attn_mask requires grad, but its gradient is not computed: detach() "
                                      "it, or add the bias to the scores with matmul/softmax"));
  }
  p.qkv_strided = strided;
  p.dropout_p = dropout_p;
  p.dropout_seed = 0;
  if (dropout_p > 0.f) {  // one draw per call: the kernels derive every weight's decision from it
    GeneratorGuard guard(gen);
    p.dropout_seed = guard.get().next_u64();
  }

  Shape out_shape(qs.begin(), qs.end() - 1);
  out_shape.push_back(p.ev);
  if (p.batch == 0 || p.l == 0 || p.s == 0 || p.ev == 0) {
    // No keys: softmax over an empty row times an empty v is zeros (PyTorch's matmul); no
    // graph is recorded (nothing depends on the inputs). Ev = 0: the output is empty.
    return zeros(out_shape, DType::Float32, q.device());
  }
  Tensor out = Tensor::empty(out_shape, DType::Float32, q.device());
  Tensor stats = Tensor::empty({p.batch, p.l, 2}, DType::Float32, q.device());
  const Tensor qo = operand(q, p, p.q_lead_strides, p.q_row_stride), ko = operand(k, p, p.k_lead_strides, p.k_row_stride),
               vo = operand(v, p, p.v_lead_strides, p.v_row_stride);
  kernels_for(q.device()).attention_forward(qo, ko, vo, attn_mask, p, out, stats);
  if (grad_mode_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    autograd::record(std::make_shared<AttentionBackward>(qo.detach(), ko.detach(), vo.detach(),
                                                         attn_mask.defined() ? attn_mask.detach() : Tensor(),
                                                         out.detach(), stats, p, qs, ks, vs),
                     {&q, &k, &v}, out);
  return out;
}

}  // namespace phalanx
