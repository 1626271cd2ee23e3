#pragma once
#include "phalanx/core/generator.hpp"
#include "phalanx/core/nn/module.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

/// torch.nn.Conv2d over NCHW float32: weight [out, in / groups, kH, kW], bias [out].
/// Initialised like PyTorch: weight kaiming_uniform_(a = sqrt(5)), i.e. uniform in
/// +-1/sqrt(fan_in), bias uniform in +-1/sqrt(fan_in), fan_in = in / groups * kH * kW,
/// drawn from `gen` (the default generator when null).
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, std::int64_t groups = 1, bool bias = true,
         Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  /// PyTorch's repr: "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))".
  std::string describe() const override;
  /// Re-draws the parameters as at construction.
  void reset_parameters(Generator* gen = nullptr);

  Tensor weight, bias;
  std::int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, dilation;
  std::int64_t groups;

 protected:
  void on_parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace phalanx::nn
