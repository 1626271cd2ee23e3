#include "phalanx/core/nn/flatten.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

Flatten::Flatten(std::int64_t s, std::int64_t e) : start_dim(s), end_dim(e) {}

Tensor Flatten::forward(const Tensor& x) {
  const std::int64_t d = x.dim();
  const std::int64_t s = start_dim < 0 ? start_dim + d : start_dim;
  const std::int64_t e = end_dim < 0 ? end_dim + d : end_dim;
  if (s < 0 || e >= d || s > e)
    throw ValueError(detail::concat("Flatten: start_dim=", start_dim, " end_dim=", end_dim,
                                    " do not select a range of the dims of ", shape_str(x.shape())));
  Shape out(x.shape().begin(), x.shape().begin() + s);
  std::int64_t merged = 1;
  for (std::int64_t i = s; i <= e; ++i) merged *= x.shape()[i];
  out.push_back(merged);
  out.insert(out.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, out);
}

std::string Flatten::describe() const {
  return detail::concat("Flatten(start_dim=", start_dim, ", end_dim=", end_dim, ")");
}

}  // namespace phalanx::nn
