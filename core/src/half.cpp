#include "phalanx/core/half.hpp"

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

void convert_into(const Tensor& src, Tensor& dst) {
  if (src.numel() != dst.numel())
    throw ShapeError("convert_into: " + src.str() + " and " + dst.str() + " differ in size");
  if (src.dtype() == dst.dtype()) {
    dst.copy_(src);
    return;
  }
  // The kernel takes contiguous tensors: a view is read as its values, and a view as
  // destination is written through its strides.
  if (!dst.is_contiguous()) {
    dst.copy_(to_dtype(src, dst.dtype()));
    return;
  }
  kernels_for(src.device()).convert(src.is_contiguous() ? src : src.clone(), dst);
}

namespace {
// The gradient of a conversion is the gradient converted back (PyTorch's ToCopyBackward):
// a bf16 gradient reaches a float32 master parameter as float32.
class ToDtypeBackward final : public Node {
 public:
  explicit ToDtypeBackward(DType from) : from_(from) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    if (g.dtype() == from_) return {g};
    Tensor out = Tensor::empty(g.shape(), from_, g.device());
    convert_into(g, out);
    return {out};
  }
  const char* name() const override { return "ToDtypeBackward"; }
  bool reusable() const override { return true; }  // saves nothing (PyTorch's ToCopyBackward)

 private:
  DType from_;
};
}  // namespace

Tensor to_dtype(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  convert_into(t, out);
  if (grad_mode_enabled() && t.requires_grad() && dtype != DType::Int64 && dtype != DType::Bool)
    autograd::record(std::make_shared<ToDtypeBackward>(t.dtype()), {&t}, out);
  return out;
}

}  // namespace phalanx
