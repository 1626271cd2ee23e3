// sum and mean, over everything or one dimension.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

struct Split {
  std::int64_t outer = 1, d = 1, inner = 1;
};

Split split_at(const Shape& s, int dim) {
  Split sp;
  for (int i = 0; i < dim; ++i) sp.outer *= s[i];
  sp.d = s[dim];
  for (std::size_t i = dim + 1; i < s.size(); ++i) sp.inner *= s[i];
  return sp;
}

class SumBackward final : public Node {
 public:
  SumBackward(Shape in_shape, Split sp, float scale)
      : in_shape_(std::move(in_shape)), sp_(sp), scale_(scale) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor gx = Tensor::empty(in_shape_, DType::Float32, g.device());
    kernels_for(g.device()).expand_dim(g, sp_.outer, sp_.d, sp_.inner, gx, scale_);
    return {gx};
  }
  const char* name() const override { return "SumBackward"; }

 private:
  Shape in_shape_;
  Split sp_;
  float scale_;
};

Tensor reduce(const Tensor& x, Split sp, Shape out_shape, float scale, const char* name) {
  Tensor out = Tensor::empty(out_shape, DType::Float32, x.device());
  kernels_for(x.device()).sum_dim(x, sp.outer, sp.d, sp.inner, out, scale);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<SumBackward>(x.shape(), sp, scale), {&x}, out);
  return out;
}

Tensor reduce_all(const Tensor& x_in, bool mean, const char* name) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return in_float32(x.dtype(), [=](const Tensor& t) { return reduce_all(t, mean, name); }, x);
  check_float(x, name);
  const std::int64_t n = x.numel();
  if (mean && n == 0) throw ValueError(std::string(name) + ": mean of an empty tensor");
  return reduce(x, Split{1, n, 1}, {}, mean ? 1.f / static_cast<float>(n) : 1.f, name);
}

Tensor reduce_dim(const Tensor& x_in, std::int64_t dim, bool keepdim, bool mean, const char* name) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x))
    return in_float32(x.dtype(), [=](const Tensor& t) { return reduce_dim(t, dim, keepdim, mean, name); }, x);
  check_float(x, name);
  const int d = normalize_dim(dim, x.shape().size(), name);
  const Split sp = split_at(x.shape(), d);
  Shape out_shape = x.shape();
  if (keepdim)
    out_shape[d] = 1;
  else
    out_shape.erase(out_shape.begin() + d);
  if (mean && sp.d == 0) throw ValueError(std::string(name) + ": mean over an empty dimension");
  return reduce(x, sp, out_shape, mean ? 1.f / static_cast<float>(sp.d) : 1.f, name);
}

}  // namespace

Tensor sum(const Tensor& x) {
  if (autocast_detail::applies(autocast_detail::Op::Sum, x))
    return autocast_detail::call(autocast_detail::Op::Sum, [](const Tensor& t) { return sum(t); }, x);
  return reduce_all(x, false, "sum");
}
Tensor mean(const Tensor& x) { return reduce_all(x, true, "mean"); }
Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim) {
  if (autocast_detail::applies(autocast_detail::Op::Sum, x))
    return autocast_detail::call(autocast_detail::Op::Sum, [=](const Tensor& t) { return sum(t, dim, keepdim); }, x);
  return reduce_dim(x, dim, keepdim, false, "sum");
}
Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim) {
  return reduce_dim(x, dim, keepdim, true, "mean");
}

}  // namespace phalanx
