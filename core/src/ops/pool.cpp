// max_pool2d, avg_pool2d and adaptive_avg_pool2d (NCHW, PyTorch 1.13's windows, ceil_mode
// false). Max pooling keeps the argmax indices for its backward.
#include "ops/autocast_support.hpp"
#include "ops/op_support.hpp"
#include "phalanx/core/ops.hpp"

namespace phalanx {

using namespace ops_detail;

namespace {

class MaxPool2dBackward final : public Node {
 public:
  MaxPool2dBackward(Tensor indices, Window2d g) : idx_(std::move(indices)), g_(g) {}
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx = autograd::gradient_buffer(*this, 0, {g_.n, g_.c, g_.h, g_.w}, grad.device());
    kernels_for(grad.device()).max_pool2d_backward(grad, idx_, g_, gx);
    return {gx};
  }
  const char* name() const override { return "MaxPool2dBackward"; }
  void release_saved() override { idx_ = Tensor(); }

 private:
  Tensor idx_;
  Window2d g_;
};

class AvgPool2dBackward final : public Node {
 public:
  AvgPool2dBackward(Window2d g, bool include_pad) : g_(g), include_pad_(include_pad) {}
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx = autograd::gradient_buffer(*this, 0, {g_.n, g_.c, g_.h, g_.w}, grad.device());
    kernels_for(grad.device()).avg_pool2d_backward(grad, g_, include_pad_, gx);
    return {gx};
  }
  const char* name() const override { return "AvgPool2dBackward"; }

 private:
  Window2d g_;
  bool include_pad_;
};

class AdaptiveAvgPool2dBackward final : public Node {
 public:
  explicit AdaptiveAvgPool2dBackward(Window2d g) : g_(g) {}
  std::vector<Tensor> apply(const Tensor& grad) override {
    Tensor gx = autograd::gradient_buffer(*this, 0, {g_.n, g_.c, g_.h, g_.w}, grad.device());
    kernels_for(grad.device()).adaptive_avg_pool2d_backward(grad, g_, gx);
    return {gx};
  }
  const char* name() const override { return "AdaptiveAvgPool2dBackward"; }

 private:
  Window2d g_;
};

std::string pair_str(Size2 s) { return detail::concat("(", s.h, ", ", s.w, ")"); }

// Checks the input and the window arguments; returns the geometry with the output size.
Window2d pool_geometry(const char* op, const Tensor& x, Size2 kernel, Size2 stride, Size2 padding,
                       Size2 dilation) {
  check_float(x, op, "input");
  if (x.dim() != 4)
    throw ShapeError(detail::concat(op, ": expected input [N, C, H, W], got ", shape_str(x.shape()),
                                    " (reshape an unbatched [C, H, W] input to [1, C, H, W])"));
  if (stride.h == 0 && stride.w == 0) stride = kernel;
  if (kernel.h < 1 || kernel.w < 1 || stride.h < 1 || stride.w < 1 || dilation.h < 1 || dilation.w < 1 ||
      padding.h < 0 || padding.w < 0)
    throw ValueError(detail::concat(op, ": kernel ", pair_str(kernel), ", stride ", pair_str(stride),
                                    " and dilation ", pair_str(dilation), " must be >= 1, padding ",
                                    pair_str(padding), " >= 0"));
  if (2 * padding.h > kernel.h || 2 * padding.w > kernel.w)
    throw ValueError(detail::concat(op, ": padding ", pair_str(padding), " must be at most half of kernel ",
                                    pair_str(kernel), " (as in PyTorch)"));
  const Shape& xs = x.shape();
  Window2d g{xs[0], xs[1], xs[2], xs[3], 0, 0, kernel.h, kernel.w, stride.h, stride.w,
             padding.h, padding.w, dilation.h, dilation.w};
  const std::int64_t eff_h = dilation.h * (kernel.h - 1) + 1, eff_w = dilation.w * (kernel.w - 1) + 1;
  if (xs[2] + 2 * padding.h < eff_h || xs[3] + 2 * padding.w < eff_w)
    throw ShapeError(detail::concat(op, ": input ", shape_str(xs), " padded by ", pair_str(padding),
                                    " is smaller than the window (", eff_h, ", ", eff_w, ")"));
  g.oh = (xs[2] + 2 * padding.h - eff_h) / stride.h + 1;
  g.ow = (xs[3] + 2 * padding.w - eff_w) / stride.w + 1;
  return g;
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x))
    return in_float32(x.dtype(), [=](const Tensor& t) { return max_pool2d(t, kernel, stride, padding, dilation); }, x);
  const Window2d g = pool_geometry("max_pool2d", x, kernel, stride, padding, dilation);
  Tensor out = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::Float32, x.device());
  Tensor indices = Tensor::empty(out.shape(), DType::Int64, x.device());
  kernels_for(x.device()).max_pool2d(x, g, out, indices);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<MaxPool2dBackward>(indices, g), {&x}, out);
  return out;
}

Tensor avg_pool2d(const Tensor& x_in, Size2 kernel, Size2 stride, Size2 padding, bool count_include_pad) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x))
    return in_float32(x.dtype(), [=](const Tensor& t) { return avg_pool2d(t, kernel, stride, padding, count_include_pad); },
                      x);
  const Window2d g = pool_geometry("avg_pool2d", x, kernel, stride, padding, 1);
  Tensor out = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::Float32, x.device());
  kernels_for(x.device()).avg_pool2d(x, g, count_include_pad, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<AvgPool2dBackward>(g, count_include_pad), {&x}, out);
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, Size2 output_size) {
  const Tensor x = contiguous_input(x_in);
  if (is_reduced(x)) return in_float32(x.dtype(), [=](const Tensor& t) { return adaptive_avg_pool2d(t, output_size); }, x);
  check_float(x, "adaptive_avg_pool2d", "input");
  if (x.dim() != 4)
    throw ShapeError("adaptive_avg_pool2d: expected input [N, C, H, W], got " + shape_str(x.shape()) +
                     " (reshape an unbatched [C, H, W] input to [1, C, H, W])");
  const Shape& xs = x.shape();
  if (output_size.h < 1 || output_size.w < 1)
    throw ValueError("adaptive_avg_pool2d: output_size " + pair_str(output_size) + " must be >= 1 (input " +
                     shape_str(xs) + ")");
  if (xs[2] < 1 || xs[3] < 1)
    throw ShapeError("adaptive_avg_pool2d: input " + shape_str(xs) + " has an empty plane");
  Window2d g{xs[0], xs[1], xs[2], xs[3], output_size.h, output_size.w, 0, 0, 0, 0, 0, 0, 1, 1};
  Tensor out = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::Float32, x.device());
  kernels_for(x.device()).adaptive_avg_pool2d(x, g, out);
  if (grad_mode_enabled() && x.requires_grad())
    autograd::record(std::make_shared<AdaptiveAvgPool2dBackward>(g), {&x}, out);
  return out;
}

}  // namespace phalanx
