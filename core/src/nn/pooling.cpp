#include "phalanx/core/nn/pooling.hpp"

#include "phalanx/core/error.hpp"

namespace phalanx::nn {

namespace {
// As PyTorch prints an int-or-tuple argument: one number when both sides agree.
std::string arg(Size2 s) {
  return s.h == s.w ? detail::concat(s.h) : detail::concat("(", s.h, ", ", s.w, ")");
}
Size2 or_kernel(Size2 stride, Size2 kernel) { return stride.h == 0 && stride.w == 0 ? kernel : stride; }
}  // namespace

MaxPool2d::MaxPool2d(Size2 k, Size2 s, Size2 p, Size2 d)
    : kernel_size(k), stride(or_kernel(s, k)), padding(p), dilation(d) {}

Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_size, stride, padding, dilation); }

std::string MaxPool2d::describe() const {
  return "MaxPool2d(kernel_size=" + arg(kernel_size) + ", stride=" + arg(stride) + ", padding=" + arg(padding) +
         ", dilation=" + arg(dilation) + ", ceil_mode=False)";
}

AvgPool2d::AvgPool2d(Size2 k, Size2 s, Size2 p, bool include_pad)
    : kernel_size(k), stride(or_kernel(s, k)), padding(p), count_include_pad(include_pad) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size, stride, padding, count_include_pad);
}

std::string AvgPool2d::describe() const {
  return "AvgPool2d(kernel_size=" + arg(kernel_size) + ", stride=" + arg(stride) + ", padding=" + arg(padding) +
         (count_include_pad ? "" : ", count_include_pad=False") + ")";
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 out) : output_size(out) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }

std::string AdaptiveAvgPool2d::describe() const {
  return detail::concat("AdaptiveAvgPool2d(output_size=(", output_size.h, ", ", output_size.w, "))");
}

}  // namespace phalanx::nn
