#include "phalanx/core/half.hpp"

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

Tensor to_dtype(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  convert_into(t, out);
  return out;
}

}  // namespace phalanx
