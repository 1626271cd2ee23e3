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
  kernels_for(src.device()).convert(src, dst);
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  convert_into(t, out);
  return out;
}

}  // namespace phalanx
