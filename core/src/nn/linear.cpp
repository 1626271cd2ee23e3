#include "phalanx/core/nn/linear.hpp"

#include <cmath>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

Linear::Linear(std::int64_t in, std::int64_t out, bool with_bias, Generator* gen)
    : in_features(in), out_features(out) {
  if (in <= 0 || out <= 0)
    throw ValueError(detail::concat("Linear: features must be positive, got in=", in, " out=", out));
  weight = register_parameter("weight", Tensor::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", Tensor::empty({out}));
  reset_parameters(gen);
}

void Linear::reset_parameters(Generator* gen) {
  // PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in) for the weight; the bias
  // uses the same bound.
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  const float bound = 1.f / std::sqrt(static_cast<float>(in_features));
  NoGradGuard no_grad;
  weight.copy_(rand(weight.shape(), -bound, bound, &g));
  if (bias.defined()) bias.copy_(rand(bias.shape(), -bound, bound, &g));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::describe() const {
  return detail::concat("Linear(in_features=", in_features, ", out_features=", out_features,
                        ", bias=", bias.defined() ? "True" : "False", ")");
}

void Linear::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight")
    weight = t;
  else if (name == "bias")
    bias = t;
}

}  // namespace phalanx::nn
