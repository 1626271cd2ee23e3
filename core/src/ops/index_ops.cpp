// argmax and clamp: outside autograd (integer results / gradient clipping).
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

Tensor argmax(const Tensor& x_in, std::int64_t dim, bool keepdim) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return argmax(to_float32(x), dim, keepdim);  // exact: the float32 values are the same
  check_float(x, "argmax");
  const int d = normalize_dim(dim, x.shape().size(), "argmax");
  if (x.shape()[d] == 0)
    throw ValueError(detail::concat("argmax: dimension ", d, " of ", shape_str(x.shape()),
                                    " is empty; there is no maximum"));
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.shape()[i];
  for (std::size_t i = d + 1; i < x.shape().size(); ++i) inner *= x.shape()[i];
  Shape out_shape = x.shape();
  if (keepdim)
    out_shape[d] = 1;
  else
    out_shape.erase(out_shape.begin() + d);
  Tensor out = Tensor::empty(out_shape, DType::Int64, x.device());
  kernels_for(x.device()).argmax(x, outer, x.shape()[d], inner, out);
  return out;
}

Tensor argmax(const Tensor& x_in) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return argmax(to_float32(x));
  check_float(x, "argmax");
  if (x.numel() == 0) throw ValueError("argmax: the input is empty; there is no maximum");
  Tensor out = Tensor::empty({}, DType::Int64, x.device());
  kernels_for(x.device()).argmax(x, 1, x.numel(), 1, out);
  return out;
}

Tensor clamp(const Tensor& x_in, float lo, float hi) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return in_float32(x.dtype(), [=](const Tensor& t) { return clamp(t, lo, hi); }, x);
  check_float(x, "clamp");
  if (lo > hi) throw ValueError(detail::concat("clamp: min ", lo, " is greater than max ", hi));
  Tensor out = empty_like(x);
  kernels_for(x.device()).clamp(x, lo, hi, out);
  return out;
}

}  // namespace phalanx
