// reshape (a view: shares storage) and transpose (a materialised copy).
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

class ReshapeBackward final : public Node {
 public:
  explicit ReshapeBackward(Shape in) : in_(std::move(in)) {}
  std::vector<Tensor> apply(const Tensor& g) override { return {view_as(g, in_)}; }
  const char* name() const override { return "ReshapeBackward"; }
  static Tensor view_as(const Tensor& t, const Shape& s) {
    return Tensor(std::make_shared<TensorImpl>(t.impl()->storage(), t.impl()->byte_offset(), s,
                                               t.dtype()));
  }

 private:
  Shape in_;
};

class TransposeBackward final : public Node {
 public:
  TransposeBackward(int d0, int d1) : d0_(d0), d1_(d1) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Shape s = g.shape();
    std::swap(s[d0_], s[d1_]);
    Tensor out = Tensor::empty(s, g.dtype(), g.device());
    kernels_for(g.device()).transpose(g, d0_, d1_, out);
    return {out};
  }
  const char* name() const override { return "TransposeBackward"; }

 private:
  int d0_, d1_;
};

Shape infer_shape(const Shape& requested, std::int64_t numel, const Shape& from) {
  Shape s = requested;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw ValueError("reshape: only one dimension can be -1, got " + shape_str(requested));
      infer = static_cast<int>(i);
    } else if (s[i] < 0) {
      throw ValueError("reshape: invalid dimension in " + shape_str(requested));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw ShapeError("reshape: cannot view " + shape_str(from) + " as " + shape_str(requested));
    s[infer] = numel / known;
  }
  if (numel_of(s) != numel)
    throw ShapeError(detail::concat("reshape: cannot view ", shape_str(from), " (", numel,
                                    " elements) as ", shape_str(requested)));
  return s;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape", "input");
  const Shape s = infer_shape(shape, x.numel(), x.shape());
  Tensor out = ReshapeBackward::view_as(x, s);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<ReshapeBackward>(x.shape()), {&x}, out);
  return out;
}

Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1) {
  check_defined(x, "transpose", "input");
  const int a = normalize_dim(d0, x.shape().size(), "transpose");
  const int b = normalize_dim(d1, x.shape().size(), "transpose");
  Shape s = x.shape();
  std::swap(s[a], s[b]);
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (a == b)
    kernels_for(x.device()).copy(out.raw_data(), x.raw_data(), x.nbytes());
  else
    kernels_for(x.device()).transpose(x, a, b, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<TransposeBackward>(a, b), {&x}, out);
  return out;
}

}  // namespace phalanx
