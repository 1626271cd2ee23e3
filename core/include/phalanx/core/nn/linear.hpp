#pragma once
#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"

namespace phalanx::nn {

/// y = x W^T + b, weight [out, in]. Initialised like PyTorch: weight and bias uniform in
/// +-1/sqrt(in_features), drawn from `gen` (the default generator when null).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
         Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  /// Re-draws the parameters as at construction.
  void reset_parameters(Generator* gen = nullptr);

  Tensor weight, bias;
  std::int64_t in_features, out_features;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace phalanx::nn
