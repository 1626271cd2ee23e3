// Elementwise ops: unary functions, binary arithmetic with suffix broadcasting, scalars.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace ops_detail {
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  if (out.numel() == g.numel()) {
    kernels_for(g.device()).copy(out.raw_data(), g.raw_data(), g.nbytes());
  } else {
    kernels_for(g.device()).sum_to_period(g, out, 1.0f);
  }
  return out;
}
}  // namespace ops_detail

namespace {

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::Rsqrt: return "rsqrt";
  }
  return "?";
}

class UnaryBackward final : public Node {
 public:
  UnaryBackward(UnaryOp op, Tensor x, Tensor y) : op_(op), x_(std::move(x)), y_(std::move(y)) {}
  std::vector<Tensor> apply(const Tensor& g_in) override {
    // A bf16 GELU (run natively) handed a float32 gradient: the float32 backward on the widened
    // x, rounded once, as the float32 path between two casts computed it (rounding g first
    // would round twice).
    if (op_ == UnaryOp::Gelu && x_.defined() && x_.dtype() == DType::BFloat16 && g_in.dtype() == DType::Float32) {
      const Tensor xf = to_dtype(x_, DType::Float32);
      Tensor gx = empty_like(g_in);
      kernels_for(g_in.device()).unary_backward(op_, g_in, xf, Tensor(), gx);
      return {to_dtype(gx, DType::BFloat16)};
    }
    // A bf16 ReLU (run natively) handed a float32 gradient: rounding it first gives the bits of
    // the float32 backward rounded once (the mask commutes with the rounding).
    const Tensor g = y_.defined() && y_.dtype() != g_in.dtype() ? to_dtype(g_in, y_.dtype()) : g_in;
    Tensor gx = empty_like(g);
    kernels_for(g.device()).unary_backward(op_, g, x_, y_, gx);
    return {gx};
  }
  const char* name() const override { return "UnaryBackward"; }
  void release_saved() override { x_ = Tensor(); y_ = Tensor(); }

 private:
  UnaryOp op_;
  Tensor x_, y_;
};

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const Tensor x = contiguous_input(x_in);
  // bf16 ReLU and GELU on the CPU run on the 16-bit values (cpu/bf16_elementwise.hpp: the same
  // bits as the float32 kernel rounded once, without two float32 temporaries and two casts per
  // pass, forward and backward).
  check_defined(x, unary_name(op), "input");
  const bool native_bf16 =
      (op == UnaryOp::Relu || op == UnaryOp::Gelu) && x.dtype() == DType::BFloat16 && x.device().is_cpu();
  if (is_reduced(x) && !native_bf16) return in_float32(x.dtype(), [op](const Tensor& t) { return unary(op, t); }, x);
  if (!native_bf16) check_float(x, unary_name(op));
  Tensor y = empty_like(x);
  kernels_for(x.device()).unary(op, x, y);
  if (grad_mode_enabled() && x.requires_grad()) {
    // Save only what the derivative needs; the output is saved detached (no cycle).
    const bool wants_x = op == UnaryOp::Log || op == UnaryOp::Gelu;
    const bool wants_y = op == UnaryOp::Exp || op == UnaryOp::Relu || op == UnaryOp::Tanh ||
                         op == UnaryOp::Sigmoid || op == UnaryOp::Rsqrt;
    auto node = std::make_shared<UnaryBackward>(op, wants_x ? x.detach() : Tensor(),
                                                wants_y ? y.detach() : Tensor());
    autograd::record(node, {&x}, y);
  }
  return y;
}

/// Output shape of a binary op; throws a ShapeError naming both shapes.
Shape broadcast_shape(const Tensor& a, const Tensor& b, const char* op) {
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa == sb) return sa;
  auto strip = [](const Shape& s) {
    std::size_t i = 0;
    while (i < s.size() && s[i] == 1) ++i;
    return Shape(s.begin() + i, s.end());
  };
  auto is_suffix = [&](const Shape& small, const Shape& big) {
    const Shape s = strip(small);
    if (s.size() > big.size()) return false;
    return std::equal(s.begin(), s.end(), big.end() - s.size());
  };
  // The output takes the shape of the larger operand (more elements, then more dims; an empty
  // operand, [0, D] with a row [D], is decided by its dims).
  const bool by_numel = a.numel() != b.numel() && a.numel() > 0 && b.numel() > 0;
  const bool a_big = by_numel ? a.numel() > b.numel() : sa.size() >= sb.size();
  if (a_big && is_suffix(sb, sa)) return sa;
  if (!a_big && is_suffix(sa, sb)) return sb;
  throw ShapeError(detail::concat(op, ": shapes ", shape_str(sa), " and ", shape_str(sb),
                                  " cannot be broadcast (supported: equal shapes, a scalar, or "
                                  "trailing dimensions such as a bias row [D] with [N, D])"));
}

class BinaryBackward final : public Node {
 public:
  BinaryBackward(BinaryOp op, Tensor a, Tensor b, Shape sa, Shape sb, DType b_dtype = DType::Float32)
      : op_(op), a_(std::move(a)), b_(std::move(b)), sa_(std::move(sa)), sb_(std::move(sb)), b_dtype_(b_dtype) {}

  std::vector<Tensor> apply(const Tensor& g) override {
    DeviceKernels& k = kernels_for(g.device());
    Tensor ga, gb;
    const bool need_a = needs_grad(*this, 0), need_b = needs_grad(*this, 1);
    switch (op_) {
      case BinaryOp::Add:
        if (need_a) ga = reduce_to(g, sa_);
        if (need_b) gb = reduce_to(g, sb_);
        // float32 + bf16 run natively: b's gradient rounded once, as the cast's backward did
        if (need_b && b_dtype_ == DType::BFloat16 && gb.dtype() != DType::BFloat16) gb = to_dtype(gb, DType::BFloat16);
        break;
      case BinaryOp::Sub:
        if (need_a) ga = reduce_to(g, sa_);
        if (need_b) {
          Tensor ng = empty_like(g);
          k.unary(UnaryOp::Neg, g, ng);
          gb = reduce_to(ng, sb_);
        }
        break;
      case BinaryOp::Mul:
        if (need_a) ga = reduce_to(times(g, b_, BinaryOp::Mul), sa_);
        if (need_b) gb = reduce_to(times(g, a_, BinaryOp::Mul), sb_);
        break;
      case BinaryOp::Div:
        if (need_a) ga = reduce_to(times(g, b_, BinaryOp::Div), sa_);
        if (need_b) {
          // d(a/b)/db = -a / b^2 = -(a/b) / b
          Tensor q = times(times(g, a_, BinaryOp::Mul), b_, BinaryOp::Div);
          q = times(q, b_, BinaryOp::Div);
          k.unary(UnaryOp::Neg, q, q);
          gb = reduce_to(q, sb_);
        }
        break;
    }
    return {ga, gb};
  }
  const char* name() const override { return "BinaryBackward"; }
  void release_saved() override { a_ = Tensor(); b_ = Tensor(); }

 private:
  static Tensor times(const Tensor& g, const Tensor& other, BinaryOp op) {
    Tensor out = empty_like(g.numel() >= other.numel() || g.numel() == 0 ? g : other);  // g: the output's shape
    kernels_for(g.device()).binary(op, g, other, out);
    return out;
  }
  BinaryOp op_;
  Tensor a_, b_;
  Shape sa_, sb_;
  DType b_dtype_;
};

Tensor binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in, const char* name) {
  const Tensor a = contiguous_input(a_in), b = contiguous_input(b_in);
  // A float32 residual plus a bf16 branch of the same shape (autocast's x + attn(ln(x))) on the
  // CPU: the float32 add reads the bf16 values directly (cpu/bf16_elementwise.hpp), the same
  // bits as adding a float32 copy, without the copy.
  if (op == BinaryOp::Add && a.defined() && b.defined() && a.dtype() == DType::Float32 &&
      b.dtype() == DType::BFloat16 && a.device().is_cpu() && b.device().is_cpu() && a.shape() == b.shape()) {
    Tensor out = Tensor::empty(a.shape(), DType::Float32, a.device());
    kernels_for(a.device()).binary(op, a, b, out);
    if (grad_mode_enabled() && (a.requires_grad() || b.requires_grad()))
      autograd::record(std::make_shared<BinaryBackward>(op, Tensor(), Tensor(), a.shape(), b.shape(), b.dtype()),
                       {&a, &b}, out);
    return out;
  }
  if (any_reduced(a, b))
    return in_float32(promote_types({&a, &b}), [=](const Tensor& x, const Tensor& y) { return binary(op, x, y, name); },
                      a, b);
  check_float(a, name, "a");
  check_float(b, name, "b");
  check_same_device(a, b, name);
  Tensor out = Tensor::empty(broadcast_shape(a, b, name), DType::Float32, a.device());
  kernels_for(a.device()).binary(op, a, b, out);
  if (grad_mode_enabled() && (a.requires_grad() || b.requires_grad())) {
    const bool save = op == BinaryOp::Mul || op == BinaryOp::Div;
    auto node = std::make_shared<BinaryBackward>(op, save ? a.detach() : Tensor(),
                                                 save ? b.detach() : Tensor(), a.shape(),
                                                 b.shape());
    autograd::record(node, {&a, &b}, out);
  }
  return out;
}

class AffineBackward final : public Node {
 public:
  explicit AffineBackward(float mul) : mul_(mul) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    if (mul_ == 1.f) return {g};
    Tensor out = empty_like(g);
    kernels_for(g.device()).affine_scalar(g, mul_, 0.f, out);
    return {out};
  }
  const char* name() const override { return "AffineBackward"; }

 private:
  float mul_;
};

Tensor affine(const Tensor& x_in, float mul, float add, const char* name) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return in_float32(x.dtype(), [=](const Tensor& t) { return affine(t, mul, add, name); }, x);
  check_float(x, name);
  Tensor out = empty_like(x);
  kernels_for(x.device()).affine_scalar(x, mul, add, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<AffineBackward>(mul), {&x}, out);
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) { return unary(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) {
  if (autocast_detail::applies(autocast_detail::Op::Exp, x))
    return autocast_detail::call(autocast_detail::Op::Exp, [](const Tensor& t) { return exp(t); }, x);
  return unary(UnaryOp::Exp, x);
}
Tensor log(const Tensor& x) {
  if (autocast_detail::applies(autocast_detail::Op::Log, x))
    return autocast_detail::call(autocast_detail::Op::Log, [](const Tensor& t) { return log(t); }, x);
  return unary(UnaryOp::Log, x);
}
Tensor relu(const Tensor& x) { return unary(UnaryOp::Relu, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::Sigmoid, x); }
Tensor gelu(const Tensor& x) { return unary(UnaryOp::Gelu, x); }

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b, "add"); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b, "sub"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b, "mul"); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b, "div"); }
Tensor add(const Tensor& a, float s) { return affine(a, 1.f, s, "add"); }
Tensor mul(const Tensor& a, float s) { return affine(a, s, 0.f, "mul"); }

}  // namespace phalanx
