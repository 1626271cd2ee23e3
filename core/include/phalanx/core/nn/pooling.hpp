#pragma once
#include "phalanx/core/nn/module.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx::nn {

/// torch.nn.MaxPool2d (ceil_mode false); stride 0 (the default) means stride = kernel_size.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0, Size2 dilation = 1);
  Tensor forward(const Tensor& x) override;
  /// "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
  std::string describe() const override;
  Size2 kernel_size, stride, padding, dilation;
};

/// torch.nn.AvgPool2d (ceil_mode false); stride 0 (the default) means stride = kernel_size.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  /// "AvgPool2d(kernel_size=2, stride=2, padding=0)"
  std::string describe() const override;
  Size2 kernel_size, stride, padding;
  bool count_include_pad;
};

/// torch.nn.AdaptiveAvgPool2d.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  /// "AdaptiveAvgPool2d(output_size=(1, 1))"
  std::string describe() const override;
  Size2 output_size;
};

}  // namespace phalanx::nn
