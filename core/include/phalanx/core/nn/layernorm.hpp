#pragma once
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// torch.nn.LayerNorm: normalises over the trailing dims `normalized_shape` (biased variance);
/// elementwise_affine adds weight (ones) and bias (zeros) of that shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
  bool elementwise_affine;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace phalanx::nn
