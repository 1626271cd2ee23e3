#include "phalanx/core/nn/layernorm.hpp"

#include <sstream>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine)
    : normalized_shape(std::move(shape)), eps(eps_), elementwise_affine(affine) {
  if (normalized_shape.empty())
    throw ValueError("LayerNorm: normalized_shape must name at least one trailing dimension");
  for (auto v : normalized_shape)
    if (v <= 0)
      throw ValueError(detail::concat("LayerNorm: normalized_shape must be positive, got ",
                                      shape_str(normalized_shape)));
  if (!(eps > 0)) throw ValueError(detail::concat("LayerNorm: eps must be > 0, got ", eps));
  if (affine) {
    weight = register_parameter("weight", Tensor::empty(normalized_shape));
    bias = register_parameter("bias", Tensor::empty(normalized_shape));
    NoGradGuard ng;
    weight.fill_(1.0);
    bias.zero_();
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

std::string LayerNorm::describe() const {
  std::ostringstream os;
  os << "LayerNorm((";
  for (std::size_t i = 0; i < normalized_shape.size(); ++i) os << (i ? ", " : "") << normalized_shape[i];
  os << (normalized_shape.size() == 1 ? ",)" : ")") << ", eps=" << eps
     << ", elementwise_affine=" << (elementwise_affine ? "True" : "False") << ")";
  return os.str();
}

void LayerNorm::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight")
    weight = t;
  else if (name == "bias")
    bias = t;
}

}  // namespace phalanx::nn
