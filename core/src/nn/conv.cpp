#include "phalanx/core/nn/conv.hpp"

#include <cmath>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"

namespace phalanx::nn {

Conv2d::Conv2d(std::int64_t in, std::int64_t out, Size2 kernel, Size2 stride_, Size2 padding_, Size2 dilation_,
               std::int64_t groups_, bool with_bias, Generator* gen)
    : in_channels(in), out_channels(out), kernel_size(kernel), stride(stride_), padding(padding_),
      dilation(dilation_), groups(groups_) {
  if (in <= 0 || out <= 0 || groups_ <= 0)
    throw ValueError(detail::concat("Conv2d: channels and groups must be positive, got in_channels=", in,
                                    " out_channels=", out, " groups=", groups_));
  if (in % groups_ != 0 || out % groups_ != 0)
    throw ValueError(detail::concat("Conv2d: in_channels=", in, " and out_channels=", out,
                                    " must both be divisible by groups=", groups_));
  if (kernel.h < 1 || kernel.w < 1 || stride_.h < 1 || stride_.w < 1 || padding_.h < 0 || padding_.w < 0 ||
      dilation_.h < 1 || dilation_.w < 1)
    throw ValueError(detail::concat("Conv2d: kernel_size (", kernel.h, ", ", kernel.w, "), stride (", stride_.h,
                                    ", ", stride_.w, ") and dilation (", dilation_.h, ", ", dilation_.w,
                                    ") must be >= 1, padding (", padding_.h, ", ", padding_.w, ") >= 0"));
  weight = register_parameter("weight", Tensor::empty({out, in / groups_, kernel.h, kernel.w}));
  if (with_bias) bias = register_parameter("bias", Tensor::empty({out}));
  reset_parameters(gen);
}

void Conv2d::reset_parameters(Generator* gen) {
  // PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in) for the weight; the bias
  // uses the same bound. fan_in = in_channels / groups * kH * kW.
  GeneratorGuard guard(gen);
  Generator& g = guard.get();
  const std::int64_t fan_in = in_channels / groups * kernel_size.h * kernel_size.w;
  const float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
  NoGradGuard no_grad;
  weight.copy_(rand(weight.shape(), -bound, bound, &g));
  if (bias.defined()) bias.copy_(rand(bias.shape(), -bound, bound, &g));
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, stride, padding, dilation, groups);
}

std::string Conv2d::describe() const {
  auto pair = [](Size2 s) { return detail::concat("(", s.h, ", ", s.w, ")"); };
  std::string s = detail::concat("Conv2d(", in_channels, ", ", out_channels, ", kernel_size=", pair(kernel_size),
                                 ", stride=", pair(stride));
  if (padding.h != 0 || padding.w != 0) s += ", padding=" + pair(padding);
  if (dilation.h != 1 || dilation.w != 1) s += ", dilation=" + pair(dilation);
  if (groups != 1) s += detail::concat(", groups=", groups);
  if (!bias.defined()) s += ", bias=False";
  return s + ")";
}

void Conv2d::on_parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight")
    weight = t;
  else if (name == "bias")
    bias = t;
}

}  // namespace phalanx::nn
